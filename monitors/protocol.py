"""The ``events.jsonl`` schema, as key lists (DESIGN.md section 4; its example lines are the schema).

One JSON object per line. Every key of an event's kind is always present, ``null`` when unknown
(present-and-null, playbook 4.8). This module is data only; it imports nothing, so the tailer, the
status snapshot and the tests can share it with the emitter that runs inside the training process.
"""

from __future__ import annotations

#: ``"v"`` of every event.
SCHEMA_VERSION = 1

#: Keys every event starts with, in this order. ``t``: wall-clock unix seconds when the event was
#: made; ``step``: the optimizer step (HF ``state.global_step``) the event belongs to, or null;
#: ``rank``: the global rank of the process that wrote it.
COMMON_KEYS = ("v", "kind", "t", "step", "rank")

#: Top-level keys of each kind, in the order they are written.
EVENT_KEYS: dict[str, tuple[str, ...]] = {
    "run_start": COMMON_KEYS + ("world_size", "pid", "max_steps", "versions", "attn_implementation"),
    "step": COMMON_KEYS + ("dt", "step_begin", "step_end", "tokens", "padded_tokens", "flags"),
    "phase": COMMON_KEYS + ("name", "state"),
    "dynamo": COMMON_KEYS + ("counters", "recompiles", "recompile_limit_hits"),
    "log": COMMON_KEYS + ("logs",),
    "run_end": COMMON_KEYS + ("step_seconds", "dynamo", "dropped_events"),
}

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
FLAGS = ("first", "eval", "save", "recompile")

#: ``phase`` event names and states.
PHASE_NAMES = ("save", "eval")
PHASE_STATES = ("begin", "end")
