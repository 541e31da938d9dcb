"""The recompile-storm detector: torch.compile recompiling again and again after warm-up.

A storm is at least ``STORM_MIN_RECOMPILES`` (5) recompiles within ``STORM_WINDOW_STEPS`` (100)
optimizer steps, all after the fallback detector's warm-up ended. The usual cause is dynamic
padding (a new shape per batch: ``fixtures/real/hf_trainer_compile.log`` recompiles once for six
padded lengths because the Trainer compiles with ``dynamic=None``; with ``dynamic=False`` every
new length recompiles, ``fixtures/real/dynamo_recompiles.log``). Each one costs a compile's time
and, at the recompile limit, the frame runs eagerly from then on.

Each source of recompile steps is judged on its own: the same recompile is often both a step flag
in events.jsonl and a record in train.log, and is never counted twice. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from stepwatch.monitors.states import STEADY

#: At least this many recompiles ...
STORM_MIN_RECOMPILES = 5
#: ... within this many optimizer steps (global_step differences), after warm-up.
STORM_WINDOW_STEPS = 100


def recompile_storm(sources: Iterable[Sequence[int]], warmup: Mapping[str, Any],
                    top_reason: str | None) -> tuple[int, str] | None:
    """``(first step of the storm, message)`` for the first source (a sequence of the global_step
    of each recompile, in order) that shows a storm after warm-up, else None. ``warmup`` is the
    snapshot's ``warmup`` object; nothing is judged before its state is ``steady`` (not judged is
    not "no storm": the snapshot shows the warm-up state beside it)."""
    if warmup.get("state") != STEADY:
        return None
    until = warmup.get("until_step")
    for steps in sources:
        after = [s for s in steps if until is None or s > until]
        for i in range(len(after) - STORM_MIN_RECOMPILES + 1):
            if after[i + STORM_MIN_RECOMPILES - 1] - after[i] <= STORM_WINDOW_STEPS:
                return after[i], (f"recompile storm after warm-up: {len(after)} recompiles since step {after[0]}; "
                                  f"most frequent reason: {top_reason or 'unknown (enable TORCH_LOGS=recompiles)'}")
    return None
