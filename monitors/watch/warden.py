"""The supervisor's warden and keeper: ``python -m stepwatch.monitors.watch.warden RUN_DIR --run-fd N
[--output-fd M] [--done-fd D | --ahead-fd A]``.

Two small processes of the run's owner, started by the supervisor once the child runs (launcher/wardens.py),
each in a session of its own, with the supervisor's record of the attempt on an inherited pipe (ARCHITECTURE.md
R17) and a copy of the read end of the run's output pipe. Both run :func:`ward`; they differ in who stands
ahead of them. The **warden** waits on the supervisor by identity (a pidfd: notice the instant it ends); the
**keeper** waits on the supervisor and on the warden (the warden holds the write end of a pipe whose read end
the keeper holds, ``--done-fd`` / ``--ahead-fd``: its end of file says the warden is gone, a ``done`` written
before it says the warden finished its watch). Whoever is first in line (the warden; the keeper once the warden
is gone without its ``done``):

- while the supervisor is held stopped (SIGSTOP), pumps the output and pages it frozen (:mod:`.held`);
- when the supervisor ended after writing exit.json (it saw the run's end and delivered its alerts), checks that
  a restart it paged as coming happened (``restart.json``: decided ``RESTART`` in enforce mode, no outcome, and
  no next attempt in the run dir: it was killed during the back-off) and pages one that did not; then ends;
- when the supervisor ended without one (the OOM killer, ``kill -9``, a crash), pumps the output into train.log
  (first: the run's next print neither blocks nor dies of SIGPIPE), records and delivers a ``supervisor_lost``
  alert (the keeper: ``watchers_lost``, the supervisor and the warden both gone), and takes the detector loop
  over (:class:`~stepwatch.monitors.watch.loop.AlertRecorder`, the same code: what the supervisor recorded is not
  recorded again) about once a second until the run's processes are gone and the end was recorded, then waits
  (bounded) for the deliveries.

The run's process dies of its watchers' loss only once all three are gone. Until it acts a warden imports
nothing heavy and reads nothing but the supervisor's process state. Its diagnostics go to ``supervisor.log``.
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.runfiles import EXIT_JSON, RESTART_JSON, TRAIN_LOG, diagnostic, read_json, read_run_fd, utc_iso
from stepwatch.monitors.watch.held import HeldSupervisor
from stepwatch.monitors.watchdog import ProcessRef, is_alive, wait_for_exit
from stepwatch.monitors.states import restart_awaited

#: How often the detector loop looks once the warden took it over (s): the supervisor's own pace.
LOOP_S = 1.0
#: How often a warden looks whether the supervisor is held stopped while it waits on it (s).
LOOK_S = 0.5
#: Looks after the run's processes are gone, for the end to be recorded (the observer's state turns
#: from running to unknown once the process probe says dead: the next look).
FINAL_LOOKS = 3
#: What the warden writes to the keeper once its watch is over (anything else, or nothing, before end of file:
#: the warden was lost).
DONE = b"done"


def _log(msg: str) -> None:
    """One line to this process's own log (:func:`~stepwatch.monitors.runfiles.diagnostic`)."""
    diagnostic("warden", msg)


def _same_attempt(run_dir: Path, run: dict[str, Any]) -> bool:
    """Whether the run dir still holds ``run``'s attempt: only a run.json of the owner's (a relaunch) says it
    does not; one another user put there (a group member, in a shared runs dir) says nothing."""
    cur = read_json(run_dir / "run.json", os.geteuid())
    return cur is None or (cur.get("attempt"), cur.get("launched_at_unix")) == (run.get("attempt"), run.get("launched_at_unix"))


class Ahead:
    """The warden ahead of a keeper, seen through the pipe it holds the write end of (``fd``; None for the warden
    itself, which has nobody ahead but the supervisor): its end of file says it is gone, ``done`` before it that
    it finished its watch."""

    def __init__(self, fd: int | None):
        self.fd, self.done = fd, False
        if fd is not None:
            os.set_blocking(fd, False)

    @property
    def gone(self) -> bool:
        return self.fd is None

    def look(self) -> None:
        while self.fd is not None:
            try:
                data = os.read(self.fd, 64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                self.done = self.done or DONE in data
                continue
            os.close(self.fd)
            self.fd = None


def _wait(sup: ProcessRef | None, ahead: Ahead, timeout_s: float) -> None:
    """Sleep until the supervisor (None: gone already) ends (its pidfd), the warden ahead writes or ends, or
    ``timeout_s`` passes."""
    poller, pidfd = select.poll(), None
    try:
        if sup is not None:
            pidfd = os.pidfd_open(sup.pid)
            poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pass
    if ahead.fd is not None:
        poller.register(ahead.fd, select.POLLIN)
    try:
        poller.poll(int(timeout_s * 1000))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def promised_restart(run_dir: Path, run: dict[str, Any]) -> dict[str, Any] | None:
    """The restart the supervisor of ``run`` decided and paged as coming (``restarting in N s``) and never
    recorded an outcome of (started, not started, requeued): its decision in restart.json, or None. Believed
    only when restart.json is the owner's, writable by no group or other, with one link (R17: a member's file
    must neither page nor silence); the caller checks no next attempt took the run dir over."""
    doc = read_json(run_dir / RESTART_JSON, os.geteuid(), private=True)
    d = doc.get("decision") if isinstance(doc, dict) else None
    return d if restart_awaited(d) and isinstance(d, dict) and d.get("attempt") == run.get("attempt") else None


class Warding:
    """What one warden process holds: the run, its output pipe's read end and, once needed, its log pump and
    alert recorder (each made once)."""

    def __init__(self, run_dir: Path, run: dict[str, Any], log: Callable[[str], None], output_fd: int | None):
        self.run_dir, self.run, self.log, self.output_fd = run_dir, run, log, output_fd
        self.pump: Any = None
        self._recorder: Any = None

    def pump_on(self, gate: Callable[[], bool] | None = None) -> None:
        """Start pumping the run's output into train.log (while ``gate`` says so; once)."""
        if self.output_fd is None or self.pump is not None:
            return
        from stepwatch.monitors.watch.logpump import LogPump  # noqa: PLC0415

        self.pump = LogPump(self.output_fd, self.run_dir / TRAIN_LOG, self.log, gate=gate).start()

    def recorder(self) -> Any:
        if self._recorder is None:
            from stepwatch.monitors.watch.loop import SCHEDULER_ALERT_KINDS, AlertRecorder  # noqa: PLC0415

            self._recorder = AlertRecorder(self.run_dir, self.run, self.log, skip=SCHEDULER_ALERT_KINDS)
            try:  # what the supervisor (or the warden ahead) recorded in alerts.jsonl is never recorded again
                self._recorder.recorded |= {a["id"] for a in self._recorder.observer.refresh().get("alerts") or []
                                            if a.get("recorded")}
            except Exception as e:  # noqa: BLE001 - a page goes out all the same
                self.log(f"alerts.jsonl not read: {type(e).__name__}: {e}")
        return self._recorder

    def page(self, kind: str, key: str, message: str, evidence: dict[str, Any],
             at: float | None = None) -> dict[str, Any] | None:
        """Record one alert and deliver it with its headline (host · run · STATE · step N/M); the alert, or None
        when alerts.jsonl has it already."""
        from stepwatch.monitors.snapshot.alerts import alert, headline_of  # noqa: PLC0415

        rec = self.recorder()
        al = alert({}, self.run.get("attempt"), kind, key, message, time.time() if at is None else at)
        if al["id"] in rec.recorded:
            return None
        try:
            headline = headline_of(rec.observer.refresh(), rec.host)
        except Exception as e:  # noqa: BLE001 - the page goes without its first line rather than not at all
            self.log(f"no headline for the page: {type(e).__name__}: {e}")
            headline = None
        rec.record(al, evidence, page={**al, "headline": headline})
        return dict(al)

    def resolve(self, al: dict[str, Any]) -> None:
        """Page ``al`` (paged by this warden) resolved: its condition cleared while the run goes on."""
        from stepwatch.monitors.watch.lifecycle import resolved_page  # noqa: PLC0415

        rec = self.recorder()
        try:
            snap = rec.observer.refresh()
        except Exception as e:  # noqa: BLE001 - the resolution is not worth the warden
            self.log(f"no snapshot for the resolution: {type(e).__name__}: {e}")
            return
        if (page := resolved_page({**al, "active": False}, snap, rec.host, time.time())) is not None:
            rec.deliverer.submit(page)

    def finish(self) -> None:
        if self._recorder is not None:
            self._recorder.finish()


def ward(run_dir: Path, run: dict[str, Any], log: Callable[[str], None] = _log, loop_s: float = LOOP_S,
         output_fd: int | None = None, ahead_fd: int | None = None) -> int:
    """Wait for the supervisor of ``run`` (and, for the keeper, ``ahead_fd``: the warden's pipe); while first in
    line, pump the output of a supervisor held stopped and page it; page a restart it promised and did not make;
    page its loss and the run's end when it dies first, pumping the run's output (``output_fd``, the read end of
    its pipe) into train.log from then on. Returns 0 (the supervisor ended normally, the warden ahead finished,
    or the loss was handled), 2 (a record naming no supervisor or no process)."""
    sup, child = ProcessRef.from_json(run.get("supervisor")), ProcessRef.from_json(run.get("process"))
    if sup is None or child is None:
        log("the run names no supervisor or no process: nothing to ward")
        return 2
    w = Warding(run_dir, run, log, output_fd)
    ahead = Ahead(ahead_fd)
    held = HeldSupervisor(run, sup, log, w.pump_on, w.page, w.resolve)
    try:
        while True:
            was_gone = ahead.gone
            ahead.look()
            if ahead.done:
                return 0  # the warden finished its watch: nothing is left to this keeper
            if ahead.gone and not was_gone:
                log("the warden is gone without finishing its watch: this keeper stands in for it")
            sup_alive = is_alive(sup)
            if ahead.gone and not sup_alive:
                break
            if ahead.gone:
                held.look()
            _wait(sup if sup_alive else None, ahead, LOOK_S)
        if read_json(run_dir / EXIT_JSON, os.geteuid()) is not None or not _same_attempt(run_dir, run):
            # it saw the end (or a relaunch took the run dir over): only a restart it promised may be left to say
            if (d := promised_restart(run_dir, run)) is not None and _same_attempt(run_dir, run):
                _page_broken_promise(w, d, sup)
            return 0
        lost(w, sup, child, keeper=ahead_fd is not None, loop_s=loop_s)
        return 0
    finally:
        w.finish()
        if w.pump is not None:
            w.pump.drain()


def _page_broken_promise(w: Warding, d: dict[str, Any], sup: ProcessRef) -> None:
    at = d.get("decided_at_unix")
    when = utc_iso(at) if type(at) in (int, float) else "?"
    words = str(d.get("words") or "")[:300]
    w.log(f"the supervisor (pid {sup.pid}) ended during the restart's back-off: the restart it promised did not happen")
    w.page("restart_missed", str(d.get("attempt")),
           f"the restart promised at {when} did not happen: stepwatch's supervisor (pid {sup.pid}) of "
           f"{w.run.get('name') or w.run_dir.name} was killed during the back-off, before it started the next "
           f"attempt; nothing runs now (the page said: {words!r}); relaunch by hand (stepwatch relaunch)",
           {"supervisor_pid": sup.pid, "decided_at_unix": at, "decision_words": words})


def lost(w: Warding, sup: ProcessRef, child: ProcessRef, keeper: bool, loop_s: float) -> None:
    """The supervisor (and, for the keeper, the warden) ended without an exit record: pump, page the loss, watch
    the run to its end."""
    w.pump_on()  # first: a full pipe would block the run's next print (a pump started while it was held: on)
    alive = is_alive(child)
    name = w.run.get("name") or w.run_dir.name
    who = f"the supervisor (pid {sup.pid})" + (" and its warden" if keeper else "")
    w.log(f"{who} ended without an exit record; the run's process {child.pid} is "
          + ("alive: paging the loss, and taking the watch over" if alive else "gone too: paging its end"))
    goes_on = ("goes on, no longer supervised: no exit status will be recorded, a stop is carried out by "
               "`stepwatch stop`; its end will still be paged" if alive else "has ended too")
    if keeper:
        w.page("watchers_lost", str(sup.pid),
               f"stepwatch's supervisor (pid {sup.pid}) and its warden of {name} are both gone (killed: the OOM "
               f"killer, kill -9, a crash); the run's process {child.pid} {goes_on}; its keeper (pid {os.getpid()}) "
               "pumps the run's output into train.log",
               {"supervisor_pid": sup.pid, "keeper_pid": os.getpid(), "process_pid": child.pid, "process_alive": alive})
    else:
        w.page("supervisor_lost", str(sup.pid),
               f"stepwatch's supervisor (pid {sup.pid}) of {name} is gone (killed: the OOM killer, kill -9, a "
               f"crash); the run's process {child.pid} {goes_on}",
               {"supervisor_pid": sup.pid, "process_pid": child.pid, "process_alive": alive})
    recorder = w.recorder()
    looks_after_end = 0
    while looks_after_end < FINAL_LOOKS:
        try:
            snap = recorder.detect()
        except Exception as e:  # noqa: BLE001 - a detector bug must not end the warding
            w.log(f"detector: {type(e).__name__}: {e}")
            snap = None
        if not is_alive(child):
            looks_after_end += 1
            if snap is not None and any(a["kind"] == "watchdog" for a in snap.get("alerts") or []):
                break  # the end is recorded and handed to the deliverer
        if not _same_attempt(w.run_dir, w.run):
            w.log("the run dir holds another attempt now: the warding ends")
            break
        wait_for_exit(child, timeout_s=loop_s, poll_s=loop_s)
    w.log("the warding ends: what it recorded was handed to the channels")


def _args(args: list[str]) -> dict[str, int] | None:
    """``--run-fd N`` (required), ``--output-fd``, ``--done-fd``, ``--ahead-fd``: each a descriptor number."""
    out: dict[str, int] = {}
    for name, value in zip(args[1::2], args[2::2], strict=False):
        if name not in ("--run-fd", "--output-fd", "--done-fd", "--ahead-fd") or not value.isdigit() or name in out:
            return None
        out[name] = int(value)
    return out if len(args) % 2 == 1 and "--run-fd" in out else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fds = _args(args)
    if fds is None:
        print("usage: python -m stepwatch.monitors.watch.warden RUN_DIR --run-fd N [--output-fd M] "
              "[--done-fd D | --ahead-fd A]", file=sys.stderr)
        return 2
    run = read_run_fd(fds["--run-fd"])
    if run is None:
        _log(f"no run from the supervisor on descriptor {fds['--run-fd']}; nothing to ward")
        return 2
    keeper = "--ahead-fd" in fds
    log: Callable[[str], None] = (lambda m: diagnostic("keeper", m)) if keeper else _log
    try:
        rc = ward(Path(args[0]).resolve(), run, log, output_fd=fds.get("--output-fd"), ahead_fd=fds.get("--ahead-fd"))
    except Exception as e:  # noqa: BLE001 - its own log says why, never a traceback into nowhere
        log(f"crashed: {type(e).__name__}: {e}")
        return 1
    if (done := fds.get("--done-fd")) is not None:  # the keeper behind this warden: its watch is over
        try:
            os.write(done, DONE)
        except OSError:
            pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
