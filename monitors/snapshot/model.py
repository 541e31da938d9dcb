"""The status snapshot's null value (every key present, null when unknown; its types:
:mod:`.types`), the helpers that make values read from a run dir safe to show, and what "the
attempt ended" means.

``status --json`` prints this dict, the TUI draws it, ``watch`` narrates its changes.
"""

from __future__ import annotations

import math
from typing import Any, cast

from stepwatch.monitors.detectors.stall import STALL_FLOOR_S
from stepwatch.monitors.detectors.frozen import STOPPED_S
from stepwatch.monitors.detectors.losshealth import not_judged_part
from stepwatch.monitors.detectors.scaling import ScalingFit
from stepwatch.monitors.gpu.energy import EnergyMeter
from stepwatch.monitors.snapshot.types import Energy, Padding, Scaling, Snapshot
from stepwatch.monitors.states import ALIVE, NOT_JUDGED, RUNNING, STARTING, UNKNOWN


def null_snapshot() -> Snapshot:
    """The snapshot of a run with no files: every key of :class:`~.types.Snapshot`, in its order."""
    return {
        "run": None, "run_dir": None, "attempt": None, "state": UNKNOWN, "pid": None, "alive": False,
        "returncode": None, "signal": None, "ended": None, "launched_at_unix": None, "disk": None, "ranks": [],
        "rank_restarts": None,
        "straggler": {"state": NOT_JUDGED, "rank": None, "lag_s": None, "trip_s": None, "steps": 0, "lags_s": {},
                      "reason": "no ranks", "stuck": []},
        "versions": {"python": None, "torch": None, "transformers": None},
        "step": {"global_step": None, "max_steps": None, "source": None, "timing": None, "arrival": None},
        "step_seconds": {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "last": None},
        "step_line": "n=0 seconds_per_optimizer_step",
        "throughput": {"tokens_per_s": None, "real_tokens_per_s": None, "padding_share": None},
        "eta_s": None,
        "eta": {"eta_s": None, "remaining_steps": None, "end_at_unix": None, "seconds_per_step": None,
                "state": NOT_JUDGED, "basis": "no steps"},
        "warmup": {"state": None, "until_step": None},
        "fallback": {"state": NOT_JUDGED, "slow_steps": [], "onset_step": None, "reason": "no step times"},
        "stall": {"state": NOT_JUDGED, "current_step_elapsed_s": None, "reason": "no step times", "threshold_s": None,
                  "floor_s": STALL_FLOOR_S, "floor_source": "default"},
        "dynamo": {"recompiles": None, "graph_breaks": None, "unique_graphs": None, "recompile_limit_hits": None,
                   "source": None, "by_source": {"events": None, "log": None}, "top_recompile_reason": None},
        "attn_implementation": {"requested": None, "resolved": None},
        "gpu": None, "gpu_error": None, "gpu_source": None, "gpu_history": {},
        "alerts": [],
        "identity": None,
        "log": {"file": None, "last_line": None, "traceback_last_line": None, "last_byte_age_s": None,
                "from_start": None, "format": None, "matched_lines": 0, "hint": None,
                "streams": 0},
        "metrics": {}, "metrics_series": {}, "loss_health": not_judged_part("no log read yet"),
        "health": {"processes": 0, "cpu_cores": None, "cpu_cores_basis": None, "rss_bytes": None,
                   "host_load_1m": None, "host_cores": None},
        "liveness": {"frozen": {"state": NOT_JUDGED, "reason": "not looked at yet", "processes": [],
                                "threshold_s": STOPPED_S},
                     "signals_s": {"cpu": None, "output": None, "step": None}},
        "phase": {"name": STARTING, "for_s": None, "source": None, "budget_s": None, "longest_s": {}},
        "events": {"file": None, "lines": 0, "corrupt_lines": 0, "unusable_steps": 0, "dropped_events": None,
                   "resume": None},
        "histogram": {"edges_s": [], "counts": []},
        "recent_dt": [],
        "process_verdict": None, "stop": None, "last_logs": None, "survivors": [], "supervisor_alive": None,
        "watch": {"state": NOT_JUDGED, "reason": "not looked at yet", "supervisor_pid": None, "wardens_alive": None},
        "scheduler": None, "restart": None, "ledger": None,
        "scaling": cast(Scaling, ScalingFit().scaling()), "padding": cast(Padding, ScalingFit().padding()),
        "energy": cast(Energy, EnergyMeter().part([])),
    }


def obj(v: Any) -> dict[str, Any]:
    """``v`` when it is a JSON object, else an empty one: a nested value read from a file."""
    return v if type(v) is dict else {}


#: Values read from events.jsonl and shown as they are (last_logs, versions) are cut at this depth: a
#: line may nest ~1,000 deep (orjson reads 1,024), and every writer of the snapshot (json.dumps with
#: an indent, the screen) recurses per level.
SHOWN_DEPTH = 32
_TOO_DEEP = f"<nested deeper than {SHOWN_DEPTH} levels: not shown>"


def shallow(v: Any, depth: int = SHOWN_DEPTH) -> Any:
    """``v`` (a JSON value read from a file) with what lies deeper than ``depth`` levels replaced by
    a note; a copy when it is a container (never deeper than ``depth`` calls)."""
    if type(v) is dict:
        return {k: shallow(x, depth - 1) for k, x in v.items()} if depth > 0 else _TOO_DEEP
    if type(v) is list:
        return [shallow(x, depth - 1) for x in v] if depth > 0 else _TOO_DEEP
    return v


def count(v: Any) -> int | float | None:
    """A counter read from a file: a finite number >= 0 (not a bool), else None."""
    if (type(v) is int or (type(v) is float and math.isfinite(v))) and v >= 0:
        return v
    return None


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (a NaN loss) replaced by the string ``"NaN"``,
    ``"Infinity"`` or ``"-Infinity"``: strict JSON parsers reject bare NaN, and null would hide it."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def run_ended(snap: Snapshot) -> bool:
    """True once the snapshot's attempt is over: its captured process is gone (dead, reused pid,
    zombie), or exit.json exists although no process was ever captured (the command could not be
    started: the supervisor records the error in exit.json and run.json holds no pid)."""
    if snap["state"] == RUNNING:
        return False
    return snap.get("process_verdict") not in (None, ALIVE) or snap.get("ended") is not None
