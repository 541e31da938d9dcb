"""The ``events.jsonl`` protocol: event kinds, keys, step flags, schema version (the tables
below are the schema). The one declaration: the emitter (``stepwatch.telemetry``), the
readers and folds, and the tests import these names.

One JSON object per line. Every key of an event's kind is always present, ``null`` when unknown
(present-and-null, ARCHITECTURE.md R8). This module is data only; it imports nothing, so the tailer, the
status snapshot and the tests can share it with the emitter that runs inside the training process.
"""

from __future__ import annotations

#: ``"v"`` of every event.
SCHEMA_VERSION = 1

#: Event kinds.
KIND_RUN_START, KIND_STEP, KIND_PHASE, KIND_DYNAMO, KIND_LOG, KIND_RUN_END = (
    "run_start", "step", "phase", "dynamo", "log", "run_end")

#: Keys every event starts with, in this order. ``t``: wall-clock unix seconds when the event was
#: made; ``step``: the optimizer step (HF ``state.global_step``) the event belongs to, or null;
#: ``rank``: the global rank of the process that wrote it.
COMMON_KEYS = ("v", "kind", "t", "step", "rank")

#: Top-level keys of each kind, in the order they are written.
EVENT_KEYS: dict[str, tuple[str, ...]] = {
    KIND_RUN_START: COMMON_KEYS + ("world_size", "pid", "max_steps", "versions", "attn_implementation"),
    KIND_STEP: COMMON_KEYS + ("dt", "step_begin", "step_end", "tokens", "padded_tokens", "flags", "batch_size",
                              "width"),
    KIND_PHASE: COMMON_KEYS + ("name", "state"),
    KIND_DYNAMO: COMMON_KEYS + ("counters", "recompiles", "recompile_limit_hits"),
    KIND_LOG: COMMON_KEYS + ("logs",),
    KIND_RUN_END: COMMON_KEYS + ("step_seconds", "dynamo", "dropped_events"),
}

#: The training metrics a ``log`` event's ``logs`` (or a printed log dict) usually carries, in the
#: order the views show them: the loss, the learning rate, the grad norm, the eval loss.
METRICS_SHOWN_FIRST = ("loss", "train_loss", "learning_rate", "lr", "grad_norm", "eval_loss", "val_loss")

#: Keys of the fixed-shape nested objects: (kind, key) -> nested keys.
NESTED_KEYS: dict[tuple[str, str], tuple[str, ...]] = {
    ("run_start", "versions"): ("python", "torch", "transformers"),
    ("run_start", "attn_implementation"): ("requested", "resolved"),
    ("run_end", "step_seconds"): ("n", "min", "p50", "p90", "p99", "max"),
    ("run_end", "dynamo"): ("recompiles", "recompile_limit_hits"),
}

#: Flags a ``step`` event can carry, in the order the emitter writes them. ``first``: the first step
#: of the process (it carries compilation and is left out of ``step_seconds``); ``eval`` / ``save``:
#: an evaluation / checkpoint save ran between the previous step and this one, so its cost is in this
#: step's ``dt``; ``recompile``: dynamo recompiled a frame during this step. Callers may add their own
#: flags after these.
FLAG_FIRST, FLAG_EVAL, FLAG_SAVE, FLAG_RECOMPILE = "first", "eval", "save", "recompile"
FLAGS = (FLAG_FIRST, FLAG_EVAL, FLAG_SAVE, FLAG_RECOMPILE)

#: Flags the supervisor puts on a log-timed step whose interval held what its liveness signals saw
#: (ARCHITECTURE.md R18): ``stopped``, a process of the run held stopped (no training time: never counted);
#: ``idle``, the run idle past its step budget (a stall, paged as such: the fallback detector excuses it);
#: ``silent``, busy but silent past the step budget (a save or an evaluation the log does not name, or a
#: slow step: counted, but alone never makes the fallback detector suspect a second mode).
FLAG_STOPPED, FLAG_IDLE, FLAG_SILENT = "stopped", "idle", "silent"
LIVENESS_FLAGS = (FLAG_STOPPED, FLAG_IDLE, FLAG_SILENT)

#: ``phase`` event names (its states: ``begin``, ``end``).
PHASE_NAMES = (FLAG_SAVE, FLAG_EVAL)
