"""The snapshot's ``watch``: who watches the running run. The supervisor pumps its output, records its end and
pages; a warden and a keeper (monitors/watch/warden.py, recorded in run.json ``wardens`` with their identities)
take that over when it is gone. A run whose process lives while none of them does is ``unwatched``: nothing
reads its output pipe (its next print may die of SIGPIPE), nothing records or pages its end. A supervisor the
kernel holds stopped is ``held``: its warden pumps the output and pages it, nothing else is watched.

Probed by identity (pid + create time, ARCHITECTURE.md R9) from run.json as read: a view's display, never a
decision (a member may replace run.json in a team's dir; the owner's watchers decide from what they hold)."""

from __future__ import annotations

from typing import Any

import psutil

from stepwatch.monitors.snapshot.types import Snapshot, Watch
from stepwatch.monitors.states import HELD, NOT_JUDGED, RUNNING, UNWATCHED, WARDED, WATCHED
from stepwatch.monitors.watchdog import ProcessRef, held_stopped, is_alive

#: The roles a warden process plays (run.json ``wardens[].role``); anything else read there is a warden.
ROLES = ("warden", "keeper")


def recorded_wardens(run: dict[str, Any]) -> list[tuple[str, ProcessRef]]:
    """run.json's ``wardens``: (role, identity) of each, in order; [] when it names none (an older stepwatch)."""
    rows = run.get("wardens")
    out: list[tuple[str, ProcessRef]] = []
    for row in rows[:4] if isinstance(rows, list) else []:
        ref = ProcessRef.from_json(row)
        if ref is not None and isinstance(row, dict):
            role = row.get("role")
            out.append((role if isinstance(role, str) and role in ROLES else ROLES[0], ref))
    return out


def _names(rows: list[tuple[str, ProcessRef]]) -> str:
    return " and ".join(f"its {role} (pid {ref.pid})" for role, ref in rows)


def watch_part(snap: Snapshot, run: dict[str, Any]) -> Watch:
    """The ``watch`` part of a snapshot whose process keys are filled (``state``, ``scheduler``)."""
    sup = ProcessRef.from_json(run.get("supervisor"))

    def out(state: Any, reason: str, alive: int | None = None) -> Watch:
        return {"state": state, "reason": reason, "supervisor_pid": sup.pid if sup else None, "wardens_alive": alive}

    if snap["state"] != RUNNING:
        return out(NOT_JUDGED, "the run is not running")
    if snap.get("scheduler"):
        return out(NOT_JUDGED, "a Slurm run's supervisor runs on its job's node")
    if sup is None:
        return out(NOT_JUDGED, "run.json names no supervisor")
    wardens = recorded_wardens(run)
    living = [(role, ref) for role, ref in wardens if is_alive(ref)]
    n = len(living) if wardens else None
    if is_alive(sup):
        if held_stopped(sup) != psutil.STATUS_STOPPED:
            return out(WATCHED, f"the supervisor (pid {sup.pid}) runs", n)
        keeps = (f"{_names(living[:1])} keeps the run's output flowing into train.log and pages it" if living
                 else "no warden lives: the run's output stops when its pipe is full")
        return out(HELD, f"the supervisor (pid {sup.pid}) is held stopped (SIGSTOP?): nothing records the run's end "
                         f"until it gets SIGCONT; {keeps}", n)
    if not wardens:
        return out(NOT_JUDGED, f"the supervisor (pid {sup.pid}) is gone and run.json names no warden "
                               "(a run of an older stepwatch)")
    gone = [(role, ref) for role, ref in wardens if (role, ref) not in living]
    if living:
        lost = f"the supervisor (pid {sup.pid})" + (f" and {_names(gone)}" if gone else "")
        return out(WARDED, f"{lost} {'are' if gone else 'is'} gone: {_names(living[:1])} pumps the run's output into "
                           "train.log and pages its end; no exit status will be recorded", n)
    return out(UNWATCHED, f"UNWATCHED: the supervisor (pid {sup.pid}) and {_names(wardens)} are all gone: nothing "
                          "reads the run's output (its next print may die of SIGPIPE), nothing records or pages its end",
               0)


def supervisor_frozen(pid: int, stopped_s: float | None, kept: bool) -> str:
    """The words of the ``frozen`` alert of a supervisor held stopped (its warden's page; a view's alert while the
    snapshot says ``held``): the frozen detector's case, for the process that watches the run."""
    held = f" for {stopped_s:.0f} s" if stopped_s is not None else ""
    return (f"frozen: stepwatch's supervisor (pid {pid}) is held stopped (SIGSTOP, or a job-control stop){held}: "
            "nothing records or pages the run's end until it gets SIGCONT; "
            + ("its warden keeps the run's output flowing into train.log" if kept
               else "no warden lives: the run's output stops when its pipe is full"))
