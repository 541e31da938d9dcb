"""A supervisor the kernel holds stopped (SIGSTOP): the frozen detector's case, for the process that watches the
run. Its warden (:mod:`.warden`) looks each half second: while the supervisor is stopped it pumps the run's
output into train.log itself (the supervisor's log pump cannot: a full pipe would block the run's next print),
once it has been seen stopped for the frozen detector's STOPPED_S it pages ``frozen`` (an alert of the run
like any other, in alerts.jsonl), and when the supervisor resumes it hands the pipe back and pages that alert
resolved.

Order of the output's bytes: the two pumps share one pipe; the warden's reads only while a fresh look at
/proc says the supervisor is stopped (:class:`.logpump.LogPump` ``gate``), so the bytes stay in order except
when the stop fell between the supervisor's read of a chunk and its write (microseconds of each chunk's
life), or the resume between the warden's look and its write: that one chunk then lands after the ones read
next. The stop's timing is the sender's, so this cannot be ruled out without a lock a stopped supervisor
could hold; an out-of-order chunk is the cheaper failure than a blocked run.
"""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

import psutil

from stepwatch.monitors.detectors.frozen import STOPPED_S
from stepwatch.monitors.watchdog import ProcessRef, held_stopped, is_alive


class HeldSupervisor:
    """Looks at the supervisor ``sup`` (:meth:`look`, about every half second) while this watcher is first in
    line. ``pump_on(gate)`` starts this watcher's log pump with that gate (once); ``page(kind, key, message,
    evidence, at)`` records and delivers an alert (None when it was recorded already); ``resolve(alert)`` pages
    its resolution (:mod:`.warden`'s ``Warding``)."""

    def __init__(self, run: dict[str, Any], sup: ProcessRef, log: Callable[[str], None],
                 pump_on: Callable[[Callable[[], bool]], None],
                 page: Callable[[str, str, str, dict[str, Any], float], dict[str, Any] | None],
                 resolve: Callable[[dict[str, Any]], None]):
        self.run, self.sup, self.log = run, sup, log
        self.pump_on, self.page, self.resolve = pump_on, page, resolve
        self.since: float | None = None  # monotonic: when this watcher first saw it stopped
        #: the frozen alert paged, until its resolution ({}: looked at, paged before: one alert, one resolution)
        self.paged: dict[str, Any] | None = None

    def gate(self) -> bool:
        """Whether the warden's pump may read now: the supervisor is stopped (SIGSTOP or a tracer's stop: either
        way its pump reads nothing) or gone."""
        return held_stopped(self.sup) is not None or not is_alive(self.sup)

    def look(self) -> None:
        status = held_stopped(self.sup)
        if status is None:
            if self.since is not None:
                self.log(f"the supervisor (pid {self.sup.pid}) runs again after "
                         f"{time.monotonic() - self.since:.0f} s: its log pump has the run's output back")
            self.since = None
            if self.paged:
                self.resolve(self.paged)
            self.paged = None
            return
        if self.since is None:
            self.since, self.paged = time.monotonic(), None
            self.log(f"the supervisor (pid {self.sup.pid}) is held stopped ({status}): pumping the run's output "
                     "into train.log while it is")
            self.pump_on(self.gate)
        held_s = time.monotonic() - self.since
        # a tracer's stop (a debugger, py-spy) is not frozen: someone chose to look (detectors/frozen.py)
        if status == psutil.STATUS_STOPPED and held_s >= STOPPED_S and self.paged is None:
            from stepwatch.monitors.snapshot.watchers import supervisor_frozen  # noqa: PLC0415 - only when it pages

            self.paged = self.page("frozen", f"supervisor-{self.sup.pid}", supervisor_frozen(self.sup.pid, held_s, True),
                                   {"supervisor_pid": self.sup.pid, "stopped_s": round(held_s, 1)},
                                   time.time() - held_s) or {}
