"""The snapshot's ``restart``: the restart policy's last decision, read from restart.json (the supervisor's record,
launcher/restartrun.py). Read like every run file: hostile until checked — each value of the expected type and
size, a path shown as text only, never followed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepwatch.monitors.runfiles import RESTART_JSON, read_json
from stepwatch.monitors.snapshot.types import RestartView
from stepwatch.monitors.states import RESTART, RESTART_VERDICTS, STOP


def _text(v: Any, most: int = 500) -> str:
    return v[:most] if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 10**12 else None


def restart_part(run_dir: Path) -> RestartView | None:
    """The last decision restart.json records, or None (no file, or not a decision)."""
    doc = read_json(run_dir / RESTART_JSON)
    d = doc.get("decision") if isinstance(doc, dict) else None
    if not isinstance(d, dict) or d.get("verdict") not in RESTART_VERDICTS:
        return None
    cp = d.get("checkpoint")
    return {"verdict": RESTART if d["verdict"] == RESTART else STOP, "mode": _text(d.get("mode"), 16), "cause": _text(d.get("cause"), 40),
            "reason": _text(d.get("reason")), "evidence": _text(d.get("evidence")),
            "checkpoint": cp[:1000] if isinstance(cp, str) else None, "checkpoint_step": _int(d.get("checkpoint_step")),
            "attempt": _int(d.get("attempt")), "lost_steps": _int(d.get("lost_steps")), "words": _text(d.get("words"), 800)}
