"""A fold's step records not yet fed to the statistics, the ledger and the fallback detector: one list per field
(ARCHITECTURE.md, "Attach: one optimisation").

A read of events.jsonl (~450 lines) is taken a field at a time when every step record in it is what the emitter
writes: rank 0's, a float ``dt`` in [0, inf), ``flags`` a list of strings, and the other fields either already what
the fold would make of them or made so here, column by column. Anything else (another rank, an unusable record, a
missing key, an int ``dt``) and the read is taken one record at a time by the fold's own rule
(``monitors/fold/events.py``), into the same lists: the values are the same either way.
"""

from __future__ import annotations

from array import array
from itertools import compress
from operator import attrgetter, itemgetter
from typing import Any

from stepwatch.monitors.protocol import EVENT_KEYS, KIND_STEP
from stepwatch.monitors.stats.stepbacklog import all_in

STEP_KEYS = ("rank", "step", "dt", "flags", "tokens", "padded_tokens", "t", "step_end")
assert set(STEP_KEYS) <= set(EVENT_KEYS[KIND_STEP]), "a step key the protocol does not declare"
STEP_FIELDS = itemgetter(*STEP_KEYS)
_RANK_0 = frozenset((0, None))  # == as the fold's `rank in (0, None)`: 0.0 and False are rank 0 too
_MAX_INT = 2**53  # token counts and step numbers read from a file stay below
_INF = float("inf")
_NAN = float("nan")
#: Unix seconds read from a file are believed between 1970 and the year 3000.
UNIX_MAX = 32_503_680_000.0


class StepColumns:
    """The step records a fold has read and not yet fed, a list per field, in file order: ``step`` (an int or
    None), ``dt`` (seconds, an array of floats: the fold's own checks passed), ``flags`` (a list of strings, or ()
    when none), ``tokens`` / ``padded`` (an int in [0, 2**53) or None), ``t`` (unix seconds or None), ``end``
    (``step_end`` as unix seconds, NaN when unknown: an array of floats)."""

    __slots__ = ("step", "dt", "flags", "tokens", "padded", "t", "end")

    def __init__(self) -> None:
        self.step: list[Any] = []
        self.dt = array("d")
        self.flags: list[Any] = []
        self.tokens: list[Any] = []
        self.padded: list[Any] = []
        self.t: list[Any] = []
        self.end = array("d")

    def __len__(self) -> int:
        return len(self.dt)

    def append(self, step: Any, dt: float, flags: Any, tokens: Any, padded: Any, t: Any, end: Any) -> None:
        """One record, its values already the fold's but ``end``, as read."""
        self.step.append(step)
        self.dt.append(dt)
        self.flags.append(flags)
        self.tokens.append(tokens)
        self.padded.append(padded)
        self.t.append(t)
        e = unix_time(end)
        self.end.append(_NAN if e is None else e)

    def take(self, evs: list[dict[str, Any]]) -> list[int] | None:
        """Append the step records ``evs`` (a read's, in order) a field at a time; the positions in ``evs`` of the
        flagged ones. None, and nothing appended, when one of them must be read on its own."""
        try:
            rank, step, dt, flags, tokens, padded, t, end = zip(*map(STEP_FIELDS, evs))
        except (KeyError, ValueError):  # a key missing; ValueError: no records
            return None
        try:
            if not set(rank) <= _RANK_0:
                return None
        except TypeError:  # a rank that is a list or a dict
            return None
        if set(map(type, dt)) != {float} or not all_in(dt, 0.0, _INF) or set(map(type, flags)) != {list}:
            return None
        flagged = list(compress(range(len(flags)), flags))
        for j in flagged:
            if not all(type(f) is str for f in flags[j]):
                return None
        if set(map(type, step)) != {int} or not -_MAX_INT < min(step) <= max(step) < _MAX_INT:
            step = tuple(map(step_no, step))
        self.step.extend(step)
        self.dt.extend(dt)
        self.flags.extend(_flags_column(flags, flagged))
        self.tokens.extend(tokens if _counts(tokens) else (token_count(v) for v in tokens))
        self.padded.extend(padded if _counts(padded) else (token_count(v) for v in padded))
        if set(map(type, t)) == {float} and all_in(t, 0.0, UNIX_MAX):
            self.t.extend(t)
        else:
            self.t.extend(v if type(v) is float and 0.0 <= v < UNIX_MAX else unix_time(v) for v in t)
        if set(map(type, end)) == {float} and all_in(end, 0.0, UNIX_MAX):
            self.end.extend(end)
        else:
            self.end.extend(_NAN if (e := unix_time(v)) is None else e for v in end)
        return flagged

    def take_records(self, recs: list[Any]) -> tuple[list[int], bool]:
        """Append ``recs`` (EmittedStep records of a read, in order: every value already the fold's); the
        positions in ``recs`` of the flagged ones, and whether one of them has a ``width`` or a ``timing``."""
        step, dt, flags, tokens, padded, t, end, width, timing = zip(*map(RECORD_FIELDS, recs))
        flagged = list(compress(range(len(flags)), flags))
        self.step.extend(step)
        self.dt.extend(dt)
        self.flags.extend(_flags_column(flags, flagged))
        self.tokens.extend(tokens)
        self.padded.extend(padded)
        self.t.extend(t)
        self.end.extend(end if None not in end else (_NAN if e is None else e for e in end))
        return flagged, width.count(None) < len(width) or timing.count(None) < len(timing)


#: An :class:`~stepwatch.monitors.fold.records.EmittedStep`'s fields as the columns take them, and the two that
#: say whether its extras must be read (``_step_extras``).
RECORD_FIELDS = attrgetter("step", "dt", "flags", "tokens", "padded_tokens", "t", "step_end", "width", "timing")


def _flags_column(flags: tuple[Any, ...], flagged: list[int]) -> list[Any]:
    """A read's flags as the fold keeps them: the flagged rows' (``flagged``: their positions) as read, every other
    row's () (the fold's ``flags or ()``: an empty list and None alike)."""
    column: list[Any] = [()] * len(flags)
    for j in flagged:
        column[j] = flags[j]
    return column


def _counts(xs: tuple[Any, ...]) -> bool:
    """Every value an int in [0, 2**53) (the fold keeps such a count as it is)."""
    return set(map(type, xs)) == {int} and min(xs) >= 0 and max(xs) < _MAX_INT


def token_count(v: Any) -> int | None:
    """A token count read from a file: an int in [0, 2**53), else None (unknown)."""
    return v if v is None or (type(v) is int and 0 <= v < _MAX_INT) else None


def step_no(v: Any) -> int | None:
    """A global_step read from a file: an int (not a bool), or a float with an integral value, in
    (-2**53, 2**53); else None (unknown)."""
    if type(v) is int:
        return v if -_MAX_INT < v < _MAX_INT else None
    if type(v) is float and v.is_integer() and -_MAX_INT < v < _MAX_INT:
        return int(v)
    return None


def unix_time(v: Any) -> float | None:
    """Unix seconds read from a file (``t``, ``step_end``): a number in [0, year 3000) as a float,
    else None (a NaN, 1e300 or a string would break every time computed from it)."""
    if (type(v) is float or type(v) is int) and 0 <= v < UNIX_MAX:
        return float(v)
    return None
