"""The snapshot's ``restart``: the restart policy's last decision, read from restart.json (the supervisor's record,
launcher/restartrun.py). Read like every run file: hostile until checked — each value of the expected type and
size, a path shown as text only, never followed."""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from typing import Any

from stepwatch.monitors.runfiles import RESTART_JSON, read_json
from stepwatch.monitors.snapshot.types import RestartView, Snapshot
from stepwatch.monitors.states import (ENFORCE, EXITED, NOT_STARTED, REQUEUED, RESTART, RESTART_OUTCOMES, RESTART_VERDICTS,
                                      RUNNING, STARTED, STOP, UNKNOWN)


def _text(v: Any, most: int = 500) -> str:
    return v[:most] if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 10**12 else None


def _time(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) and 0 <= v < 10**11 else None


def _outcome(d: dict[str, Any]) -> tuple[Any, str, int | None]:
    """What the enforced RESTART ``d`` became (launcher/restartrun.py ``enforce``; a requeued job's started attempt
    after Slurm's requeue: the start wins), its words, and the attempt it started."""
    outcome = next((k for k in RESTART_OUTCOMES if k in d), None)
    started: dict[str, Any] = s if isinstance(s := d.get(STARTED), dict) else {}
    words = (_text(d.get(NOT_STARTED)) if outcome == NOT_STARTED else _text(d.get(REQUEUED)) if outcome == REQUEUED
             else f"the checkpoint was refused at exec: {why}" if (why := _text(started.get("unsafe_checkpoint"))) else "")
    return outcome, words, _int(started.get("attempt"))


def restart_part(run_dir: Path) -> RestartView | None:
    """The last decision restart.json records, or None (no file, or not a decision)."""
    doc = read_json(run_dir / RESTART_JSON)
    d = doc.get("decision") if isinstance(doc, dict) else None
    if not isinstance(d, dict) or d.get("verdict") not in RESTART_VERDICTS:
        return None
    cp = d.get("checkpoint")
    # the back-off runs from when the supervisor began it (after the decision's page went out), else from the decision
    decided, backoff = _time(d.get("backoff_from_unix")) or _time(d.get("decided_at_unix")), _time(d.get("backoff_s"))
    due = d["verdict"] == RESTART and d.get("mode") == ENFORCE and decided is not None
    outcome, outcome_words, started = _outcome(d)
    return {"verdict": RESTART if d["verdict"] == RESTART else STOP, "mode": _text(d.get("mode"), 16), "cause": _text(d.get("cause"), 40),
            "reason": _text(d.get("reason")), "evidence": _text(d.get("evidence")),
            "checkpoint": cp[:1000] if isinstance(cp, str) else None, "checkpoint_step": _int(d.get("checkpoint_step")),
            "attempt": _int(d.get("attempt")), "lost_steps": _int(d.get("lost_steps")), "words": _text(d.get("words"), 800),
            "starts_at_unix": decided + (backoff or 0.0) if due and decided is not None else None,
            "outcome": outcome, "outcome_words": outcome_words, "started_attempt": started}


def from_words(rs: RestartView) -> str:
    """``from ckpt_200`` (the checkpoint directory's name; the whole path is in ``status --json``) or ``from scratch``."""
    cp = rs["checkpoint"]
    return f"from {PurePosixPath(cp).name or cp}" if cp else "from scratch"


def restart_pending(snap: Snapshot, now: float) -> tuple[int, int | None] | None:
    """While an enforced RESTART's next attempt is due and not yet started (no outcome in restart.json): the attempt
    it starts, and the whole seconds left of its back-off (None: the back-off is over, the attempt is being launched).
    None otherwise: no such decision, observe mode, an outcome recorded, or the attempt on screen is not the one that
    ended (nor, launched, the one about to start) — and in the back-off, once the supervisor that would start it is
    gone (nothing will start it)."""
    rs: RestartView | None = snap["restart"]
    if rs is None or rs["verdict"] != RESTART or rs["mode"] != ENFORCE or rs["outcome"] is not None:
        return None
    ended, on_screen, state = rs["attempt"], snap["attempt"], snap["state"]
    if ended is None or not isinstance(on_screen, int) or state == RUNNING:
        return None
    if on_screen == ended + 1 and state != EXITED:  # launched: its run.json is there, its process not yet
        return ended + 1, None
    if on_screen != ended or state not in (EXITED, UNKNOWN) or not snap["supervisor_alive"]:
        return None
    due = rs["starts_at_unix"]
    left = math.ceil(due - now) if due is not None else 0
    return ended + 1, left if left > 0 else None
