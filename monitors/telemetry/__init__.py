"""The telemetry emitter: runs inside the training process and writes ``events.jsonl``.

Opt in with one line (README.md, "Instrumenting the training job")::

    from stepwatch.telemetry import StepwatchCallback      # a transformers.TrainerCallback
    trainer = Trainer(..., callbacks=[StepwatchCallback(attn_implementation_requested="sdpa")])

    from stepwatch.telemetry import StepTelemetry          # a plain loop
    tel = StepTelemetry()            # reads STEPWATCH_RUN_DIR; a no-op with one warning when unset
    for batch in loader:
        tel.step_begin()             # optional
        ...
        tel.step_end(tokens=n_real, padded_tokens=n_padded)
    tel.close()                      # writes run_end

Standard library only at import: ``StepwatchCallback`` is built (and transformers imported) on first
access, and torch is never imported by this package at all.
"""

from __future__ import annotations

from typing import Any

from stepwatch.telemetry.core import StepTelemetry, rank_from_env
from stepwatch.monitors.protocol import EVENT_KEYS, FLAGS, NESTED_KEYS, SCHEMA_VERSION
from stepwatch.telemetry.stats import nearest_rank, step_summary

__all__ = [
    "StepTelemetry",
    "EVENT_KEYS",
    "FLAGS",
    "NESTED_KEYS",
    "SCHEMA_VERSION",
    "nearest_rank",
    "rank_from_env",
    "step_summary",
]  # StepwatchCallback is left out so that ``import *`` does not import transformers


def __getattr__(name: str) -> Any:
    if name == "StepwatchCallback":
        from stepwatch.telemetry.hf import build_callback_class

        cls = build_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
