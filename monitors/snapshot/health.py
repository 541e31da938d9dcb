"""The run's process health in one line's worth: CPU and memory of its whole recorded process tree
(the supervisor's procs.json, each process checked by identity: pid and create time), and the host's
load. Views only read /proc through psutil; nothing is signalled, nothing in the run dir is run.

``health``: ``{processes, cpu_cores, cpu_cores_basis, rss_bytes, host_load_1m, host_cores}``:
``cpu_cores`` is the tree's CPU time per second of wall time since this view's previous look
(``cpu_cores_basis: "last <n> s"``), or on a first look the average since each process started
(``"since start"``); None (and processes 0) when no recorded process is alive.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from stepwatch.monitors.proctree import recorded_processes
from stepwatch.monitors.runfiles import PROCS_JSON
from stepwatch.monitors.detectors.frozen import StoppedProcess
from stepwatch.monitors.snapshot.types import Health

#: Processes looked at at most (a DataLoader with many workers per rank stays cheap to watch).
MAX_LOOKED_AT = 256
#: A view's first look at a running tree takes the processes' CPU twice, this far apart (seconds): a one-shot
#: ``status`` then knows whether they compute now (a silent step that computes is busy, not stuck).
FIRST_LOOK_S = 0.25
#: The tree's CPU counts as moving from this many cores (a waiting process still ticks a little: gloo's and
#: NCCL's watchdog threads, a DataLoader's pin-memory thread).
CPU_MOVING_CORES = 0.02
#: A CPU that did not move is said idle only once this view watched it that long (seconds): a one-shot status
#: knows whether the processes compute now, not for how long they have not.
CPU_IDLE_KNOWN_S = 1.0


class TreeHealth:
    def __init__(self, run_dir: Path, first_look_s: float = FIRST_LOOK_S, trust_uid: int | None = None):
        self.procs_file = Path(run_dir) / PROCS_JSON
        #: the owner's watchers: procs.json counts only under the trust rule (a member's stopped process written
        #: into it must not page ``frozen`` on the owner's run); a view (None) shows what it names
        self.trust_uid = trust_uid
        self.first_look_s = first_look_s
        self._prev: tuple[float, float] | None = None  # (monotonic s, the tree's CPU seconds)
        #: processes of the last look the kernel holds stopped, and how long this view has seen each so
        #: (the frozen detector's input: monotonic, so a clock step never makes a freeze)
        self.stopped: list[StoppedProcess] = []
        self.examined = 0
        self._stopped_since: dict[tuple[int, float | None], float] = {}
        #: when (monotonic) this view last saw the tree's CPU time advance, and by its first look at least
        self._cpu_moved_at: float | None = None
        #: seconds since the tree's CPU time last advanced (None: not known: no process, a single look)
        self.cpu_idle_s: float | None = None

    def part(self, running: bool) -> Health:
        out: Health = {"processes": 0, "cpu_cores": None, "cpu_cores_basis": None, "rss_bytes": None,
                       "host_load_1m": None, "host_cores": os.cpu_count()}
        try:
            out["host_load_1m"] = round(os.getloadavg()[0], 2)
        except OSError:
            pass
        self.stopped, self.examined = [], 0
        if not running:
            self._stopped_since.clear()
            return out
        cpu_s = rss = since_start = 0.0
        n = 0
        looked: list[psutil.Process] = []
        now_wall, now = time.time(), time.monotonic()
        still_stopped: dict[tuple[int, float | None], float] = {}
        for rp in [r for r in recorded_processes(self.procs_file, self.trust_uid) if not r.ended][:MAX_LOOKED_AT]:
            try:
                p = psutil.Process(rp.ref.pid)
                if abs(p.create_time() - (rp.ref.create_time or 0)) > 0.5:
                    continue  # the pid was reused: not the run's
                with p.oneshot():
                    ct, mem, status = p.cpu_times(), p.memory_info(), p.status()
            except (psutil.Error, OSError):
                continue
            n += 1
            looked.append(p)
            if status == psutil.STATUS_STOPPED:  # not tracing-stop: a debugger or py-spy chose to look
                key = (rp.ref.pid, rp.ref.create_time)
                since = still_stopped[key] = self._stopped_since.get(key, now)
                self.stopped.append({"pid": rp.ref.pid, "rank": rp.rank, "name": rp.name[:64],
                                     "stopped_s": round(now - since, 1)})
            cpu_s += ct.user + ct.system
            rss += mem.rss
            since_start += (ct.user + ct.system) / max(now_wall - (rp.ref.create_time or now_wall), 1.0)
        self._stopped_since, self.examined = still_stopped, n
        self.cpu_idle_s = None
        if not n:
            self._cpu_moved_at = None
            return out
        out.update(processes=n, rss_bytes=int(rss))
        if self._prev is None and self.first_look_s > 0:  # a first look (a one-shot status): a second, shortly
            # after, so that whether the processes compute right now is known (busy but silent: the stall)
            time.sleep(self.first_look_s)
            self._prev, cpu_s, now = (now, cpu_s), _cpu_seconds(looked, cpu_s), time.monotonic()
            out.update(cpu_cores=round(max(0.0, cpu_s - self._prev[1]) / (now - self._prev[0]), 2),
                       cpu_cores_basis=f"last {now - self._prev[0]:.1f} s")
        elif self._prev is not None and now - self._prev[0] >= 0.5 and cpu_s >= self._prev[1]:
            out.update(cpu_cores=round((cpu_s - self._prev[1]) / (now - self._prev[0]), 2),
                       cpu_cores_basis=f"last {now - self._prev[0]:.0f} s")
        else:
            out.update(cpu_cores=round(since_start, 2), cpu_cores_basis="since start")
        if out["cpu_cores_basis"] != "since start":  # measured over an interval: did the CPU time move?
            if (out["cpu_cores"] or 0.0) >= CPU_MOVING_CORES:
                self._cpu_moved_at = now
            elif self._cpu_moved_at is None and self._prev is not None:
                self._cpu_moved_at = self._prev[0]  # not since this view's previous look, at least
        if self._cpu_moved_at is not None and (self._cpu_moved_at == now or now - self._cpu_moved_at >= CPU_IDLE_KNOWN_S):
            self.cpu_idle_s = round(max(0.0, now - self._cpu_moved_at), 1)  # a one-shot status: 0 or unknown
        self._prev = (now, cpu_s)
        return out


def _cpu_seconds(procs: list[psutil.Process], before: float) -> float:
    """The processes' CPU seconds now (one that ended keeps what it had: ``before`` is the floor)."""
    total = 0.0
    for p in procs:
        try:
            ct = p.cpu_times()
        except (psutil.Error, OSError):
            return before
        total += ct.user + ct.system
    return max(total, before)
