"""The status snapshot: one plain dict computed from a run directory's files alone.

``stepwatch status --json`` prints it, the TUI draws it, ``watch --plain`` narrates its changes.
A :class:`RunObserver` keeps incremental readers so that following a live run costs only the new
bytes; :func:`snapshot` is the one-shot form. Views only read: nothing here writes into the run dir.
Every key is always present (null when unknown) — see :data:`SNAPSHOT_KEYS`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from monitors.runfiles import EXIT_JSON, RUN_JSON, STOP_JSON, read_json
from monitors.watchdog import ProcessRef, probe

SNAPSHOT_KEYS = (
    "run", "run_dir", "attempt", "state", "pid", "alive", "returncode", "signal", "ended", "versions", "step",
    "step_seconds", "throughput", "eta_s", "warmup", "fallback", "stall", "dynamo", "attn_implementation",
    "gpu", "gpu_error", "alerts", "identity", "log", "events", "process_verdict", "stop",
)


def _null_snapshot() -> dict[str, Any]:
    return {
        "run": None, "run_dir": None, "attempt": None, "state": "unknown", "pid": None, "alive": False,
        "returncode": None, "signal": None, "ended": None,
        "versions": {"python": None, "torch": None, "transformers": None},
        "step": {"global_step": None, "max_steps": None, "source": None},
        "step_seconds": {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "last": None},
        "throughput": {"tokens_per_s": None, "real_tokens_per_s": None, "padding_share": None},
        "eta_s": None,
        "warmup": {"state": None, "until_step": None},
        "fallback": {"state": "ok", "slow_steps": [], "onset_step": None, "reason": None},
        "stall": {"state": "ok", "current_step_elapsed_s": None},
        "dynamo": {"recompiles": None, "graph_breaks": None, "unique_graphs": None, "recompile_limit_hits": None,
                   "source": None},
        "attn_implementation": {"requested": None, "resolved": None},
        "gpu": None, "gpu_error": None,
        "alerts": [],
        "identity": None, "process_verdict": None, "stop": None,
        "log": {"file": None, "last_line": None, "last_byte_age_s": None},
        "events": {"file": None, "lines": 0, "corrupt_lines": 0},
    }


class RunObserver:
    """Follows one run directory and produces status snapshots.

    ``refresh()`` reads whatever is new in the run's files and returns a fresh snapshot dict.
    Raises nothing for missing or half-written files; a run dir without run.json gives state
    ``unknown``.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def _process_part(self, snap: dict[str, Any], run: dict[str, Any] | None) -> None:
        snap["run_dir"] = str(self.run_dir)
        if run is None:
            snap["run"] = self.run_dir.name
            return
        snap["run"] = run.get("name") or self.run_dir.name
        snap["attempt"] = run.get("attempt")
        snap["identity"] = run.get("identity")
        proc = ProcessRef.from_json(run.get("process"))
        snap["pid"] = proc.pid if proc else None
        verdict = probe(proc) if proc else None
        snap["alive"] = verdict == "alive"
        ex = read_json(self.run_dir / EXIT_JSON)
        if ex is not None:
            snap["returncode"] = ex.get("returncode")
            snap["signal"] = ex.get("signal")
            snap["ended"] = {k: ex.get(k) for k in ("ended_at", "ended_at_unix", "duration_s", "stop_requested",
                                                     "error")}
        if snap["alive"]:
            snap["state"] = "running"
        elif ex is not None:
            snap["state"] = "exited"
        else:
            snap["state"] = "unknown"
        snap["process_verdict"] = verdict
        st = read_json(self.run_dir / STOP_JSON)
        snap["stop"] = st

    def refresh(self, now: float | None = None) -> dict[str, Any]:
        """Read what is new and return the snapshot (a new dict each call)."""
        now = time.time() if now is None else now
        snap = _null_snapshot()
        run = read_json(self.run_dir / RUN_JSON)
        self._process_part(snap, run)
        return snap


def snapshot(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """One-shot status of ``run_dir`` from its files (see :class:`RunObserver`)."""
    return RunObserver(run_dir).refresh(now)
