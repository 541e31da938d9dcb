"""An alert's life after its page, as Alertmanager users expect: a page that said trouble gets a ``resolved``
page when the condition clears while the run goes on (how long it lasted), and a run that exits 0 gets a
``finished`` page (its duration, steps and final loss) when its ``[alerts]`` table asks (``finished = true``). A
full disk's resolution and the finished page say what train.log lost meanwhile (the supervisor's log pump counts it).

One cause, one page: a process the kernel holds stopped makes its step stall and its rank stuck too. While a process
of the run's tree is held stopped, those alerts are shown (the frozen alert's evidence) but not paged: the frozen
alert is the page, its ``resolved`` the one resolution (:func:`stopped_cause`). A rank's death that ends the group
(torchrun tears the others down within a second or so) is the run's death: the death's page names the root-cause
rank, and the rank's own alert is its evidence; a rank death is paged on its own once the run went on past
:data:`GROUP_END_WAIT_S` (:func:`group_end_cause`).

Pure: the supervisor's detector loop (:class:`.loop.AlertRecorder`) decides when, these say what."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from stepwatch.monitors.snapshot.alerts import headline_of
from stepwatch.monitors.snapshot.disk import lost_words
from stepwatch.monitors.snapshot.types import Alert, Snapshot
from stepwatch.monitors.states import EXITED, RUNNING
from stepwatch.monitors.watch.delivery import level_of


def _lasted(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s} s" if s < 60 else f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


#: Alerts that a process held stopped causes by itself: the frozen alert's evidence while it is held.
STOP_CAUSED_KINDS = ("stall", "stuck_rank")
#: :func:`stopped_cause`'s answer while a process is held stopped and the frozen detector has not decided yet.
WAIT_FOR_FROZEN: Literal["wait"] = "wait"


def stopped_cause(al: Alert, snap: Snapshot, held_stopped: bool) -> str | Literal["wait"] | None:
    """For an alert due to page: the id of the active ``frozen`` alert that causes it (it is that alert's evidence,
    not a page of its own); :data:`WAIT_FOR_FROZEN` when ``held_stopped`` (a process of the run's tree is held
    stopped now) but no frozen alert holds yet (the frozen detector decides within its STOPPED_S); None when it is
    a page of its own (no process held stopped, or a kind a stop does not cause)."""
    if al["kind"] not in STOP_CAUSED_KINDS or not held_stopped:
        return None
    frozen = [a for a in snap["alerts"] if a["kind"] == "frozen" and a["active"]]
    return frozen[0]["id"] if frozen else WAIT_FOR_FROZEN


#: Seconds a rank's death waits to see whether the group ends with it (torchrun's agent ends the other workers within
#: its monitor interval, 0.1 s to 5 s): then it is the run's death, one page.
GROUP_END_WAIT_S = 5.0


def group_end_cause(al: Alert, snap: Snapshot, now: float) -> str | Literal["wait"] | None:
    """For a ``rank_death`` due to page: the id of the run's death alert when the run ended with it (the rank's death
    is that page's evidence; ``"the run's end"`` when the end raised no alert of its own), :data:`WAIT_FOR_FROZEN`'s
    ``"wait"`` while the run still runs within :data:`GROUP_END_WAIT_S` of the death, None when it is a page of its
    own (the run went on) or another kind."""
    if al["kind"] != "rank_death":
        return None
    if snap["state"] != RUNNING:
        return next((a["id"] for a in snap["alerts"] if a["kind"] == "watchdog"), "the run's end")
    died = unix_of(al["at"])
    return WAIT_FOR_FROZEN if died is not None and 0 <= now - died < GROUP_END_WAIT_S else None


def unix_of(at: Any) -> float | None:
    """An alert's ``at`` (ISO 8601, ``Z``) as unix seconds; None when it is not one."""
    try:
        return datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def resolved_page(al: dict[str, Any], snap: Snapshot, host: str, now: float) -> dict[str, Any] | None:
    """The ``resolved`` page of a paged alert whose condition no longer holds while the run still runs (an alert
    that clears because the run ended is the end's to say); None otherwise. Its level is the alert's own, so
    every channel that got the page gets its resolution."""
    if al.get("active") is not False or snap["state"] != RUNNING:
        return None
    began = unix_of(al.get("at"))
    lasted = f" after {_lasted(now - began)}" if began is not None else ""
    lost = f"; {words}" if al.get("kind") == "disk_full" and (words := lost_words(snap.get("disk") or {})) else ""
    return {"id": f"{al['id']}-resolved", "kind": "resolved", "level": level_of(str(al.get("kind"))),
            "message": f"resolved{lasted}: {al.get('message')}{lost}", "headline": headline_of(snap, host)}


def finished_page(snap: Snapshot, host: str, attempt: Any, run_began_unix: float | None = None,
                  now: float | None = None) -> dict[str, Any] | None:
    """The ``finished`` page of an attempt that exited 0 (its duration; for a run of several attempts, the run's whole
    time since its first launch, ``run_began_unix``, and how many; steps, final loss); None for any other end."""
    if snap["state"] != EXITED or snap["returncode"] != 0 or snap["signal"]:
        return None
    ended = snap["ended"]
    dur = ended["duration_s"] if ended is not None else None
    end_unix = ended["ended_at_unix"] if ended is not None else None
    step = snap["step"]
    loss = m["value"] if (m := snap["metrics"].get("loss")) is not None else None
    whole = ""
    if isinstance(attempt, int) and attempt > 1 and run_began_unix is not None:
        until = end_unix if isinstance(end_unix, (int, float)) else (now if now is not None else None)
        whole = (f" (attempt {attempt}; the run {_lasted(until - run_began_unix)} since its first launch)"
                 if until is not None else f" (attempt {attempt})")
    words = ("finished: exit 0" + (f" after {_lasted(dur)}" if isinstance(dur, (int, float)) else "") + whole
             + f", {step['global_step'] if step['global_step'] is not None else '?'} steps"
             + (f"; final loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
             + (f"; {lost}" if (lost := lost_words(snap["disk"] or {})) else ""))
    return {"id": f"a{attempt}-finished", "kind": "finished", "level": "info", "wanted": True, "message": words,
            "headline": headline_of(snap, host)}
