"""An alert's life after its page, as Alertmanager users expect: a page that said trouble gets a ``resolved``
page when the condition clears while the run goes on (how long it lasted), and a run that exits 0 gets a
``finished`` page (its duration, steps and final loss) when its ``[alerts]`` table asks (``finished = true``). A
full disk's resolution and the finished page say what train.log lost meanwhile (the supervisor's log pump counts it).
Pure: the supervisor's detector loop (:class:`.loop.AlertRecorder`) decides when, these say what."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from stepwatch.monitors.snapshot.alerts import headline_of
from stepwatch.monitors.snapshot.disk import lost_words
from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.monitors.states import EXITED, RUNNING
from stepwatch.monitors.watch.delivery import level_of


def _lasted(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s} s" if s < 60 else f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


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


def finished_page(snap: Snapshot, host: str, attempt: Any) -> dict[str, Any] | None:
    """The ``finished`` page of an attempt that exited 0 (duration, steps, final loss); None for any other end."""
    if snap["state"] != EXITED or snap.get("returncode") != 0 or snap.get("signal"):
        return None
    ended = snap.get("ended") or {}
    dur, step = ended.get("duration_s"), snap["step"]
    loss = (snap["metrics"].get("loss") or {}).get("value") if isinstance(snap.get("metrics"), dict) else None
    words = ("finished: exit 0" + (f" after {_lasted(dur)}" if isinstance(dur, (int, float)) else "")
             + f", {step.get('global_step') if step.get('global_step') is not None else '?'} steps"
             + (f"; final loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
             + (f"; {lost}" if (lost := lost_words(snap.get("disk") or {})) else ""))
    return {"id": f"a{attempt}-finished", "kind": "finished", "level": "info", "wanted": True, "message": words,
            "headline": headline_of(snap, host)}
