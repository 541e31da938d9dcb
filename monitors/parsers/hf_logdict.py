"""The HF Trainer's printed lines that are not its bar: a log dict (``{'loss': '5.558', ...}``) and the
``TrainOutput(global_step=...)`` line it prints at the end. Read by
:class:`~stepwatch.monitors.parsers.hf_progress.ProgressTracker` (and re-exported there)."""

from __future__ import annotations

import ast
import re
from typing import Any

from stepwatch.monitors.readers.rankprefix import rank_prefix

_TRAIN_OUTPUT = re.compile(r"TrainOutput\(global_step=(\d{1,12})(?!\d)")


def _to_float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def parse_log_dict(text: str, *, max_chars: int = 65536) -> dict[str, float] | None:
    """Parse a printed Trainer log dict into ``{key: float}``; None when ``text`` is not one.

    transformers 5 prints values as ``.4g`` strings (``'loss': '5.558'``) and ints unquoted
    (``'num_input_tokens_seen': 2560``); both become floats. Values that are not numbers are
    dropped. Uses :func:`ast.literal_eval` (no code runs). A rank prefix is allowed. Never raises.
    """
    _rank, rest = rank_prefix(text)
    s = rest.strip()
    if len(s) < 2 or len(s) > max_chars or s[0] != "{" or s[-1] != "}":
        return None
    try:
        obj = ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(obj, dict) or not obj:
        return None
    out: dict[str, float] = {}
    for k, v in obj.items():
        if not isinstance(k, str):
            return None
        f = _to_float(v)
        if f is not None:
            out[k] = f
    return out


def parse_train_output(text: str) -> int | None:
    """The ``global_step`` of a printed ``TrainOutput(global_step=60, ...)`` line, else None."""
    m = _TRAIN_OUTPUT.search(text)
    return int(m.group(1)) if m else None
