"""Frozen: a process of the run's recorded tree that the kernel holds stopped (SIGSTOP, SIGTSTP, a
job-control stop). It makes no progress whatever the log says, so it is judged without any log shape
or step, and names the process and its rank.

Pure: the observations (each stopped process and for how long, measured by the caller on a monotonic
clock) and whether any process could be examined are passed in. A process stopped by a tracer
(``tracing-stop``: a debugger, py-spy taking a stack) is not counted: someone chose to look at it.
"""

from __future__ import annotations

from typing import TypedDict

from stepwatch.monitors.states import FLAGGED, NOT_JUDGED, OK, FrozenState

#: Seconds a process may be seen stopped before it is frozen: the issue's floor for an alert
#: (max(3 s, ...)); a job-control stop and resume by hand (Ctrl-Z, fg) takes longer than this.
STOPPED_S = 3.0


class StoppedProcess(TypedDict):
    """One process the kernel holds stopped."""

    pid: int
    rank: int | None
    name: str
    stopped_s: float


class Frozen(TypedDict):
    """``liveness.frozen``: the verdict, its reason, and the processes judged frozen."""

    state: FrozenState
    reason: str
    processes: list[StoppedProcess]
    threshold_s: float


def frozen_verdict(stopped: list[StoppedProcess], examined: int, running: bool) -> Frozen:
    """FLAGGED when a process was seen stopped for STOPPED_S or more; OK when ``examined`` (> 0)
    processes were looked at and none was; NOT_JUDGED when the run is not running or no process
    could be examined (another host, none recorded yet)."""
    if not running:
        return {"state": NOT_JUDGED, "reason": "the run is not running", "processes": [], "threshold_s": STOPPED_S}
    if examined <= 0:
        return {"state": NOT_JUDGED, "reason": "no process of the run could be examined on this host",
                "processes": [], "threshold_s": STOPPED_S}
    hit = sorted((p for p in stopped if p["stopped_s"] >= STOPPED_S), key=lambda p: -p["stopped_s"])
    if hit:
        return {"state": FLAGGED, "reason": "; ".join(f"{who(p)} stopped for {p['stopped_s']:.0f} s" for p in hit[:8]),
                "processes": hit, "threshold_s": STOPPED_S}
    return {"state": OK, "reason": f"none of {examined} process(es) stopped for {STOPPED_S:g} s", "processes": [],
            "threshold_s": STOPPED_S}


def who(p: StoppedProcess) -> str:
    """``pid 812 (rank 1, python)``."""
    return f"pid {p['pid']} (" + (f"rank {p['rank']}, " if p["rank"] is not None else "") + f"{p['name']})"
