"""The emitter's step, log and phase records as strict types: a read of events.jsonl made only of them is decoded
by msgspec, a typed record per line instead of a dict (ARCHITECTURE.md, "Attach: one optimisation").

What such a read folds to is what the dict way (``monitors/readers/jsonl.py``, then ``monitors/fold/events.py``)
folds it to, to the bit, because a read is decoded here only when:

* each line is decoded on its own, as the reader parses each line on its own (a blank line, a line of two objects
  or one of an object's half refuses the read);
* msgspec reads each value as the standard library's ``json`` (the reader's definition) does: it is a strict parser
  that refuses what ``json`` alone accepts (``NaN``, ``Infinity``, ``1e400``, a lone surrogate escape, a BOM), reads
  integers of any size exactly, rounds floats correctly and lets the last of duplicate keys win;
* every field the fold reads is typed so that only a value the fold keeps as it is passes (a ``dt`` a number in
  [0, 2**53), a ``step`` an int in (-2**53, 2**53), ``rank`` 0 or null, ``flags`` a list of strings...), no field is
  of type Any (a depth of nesting that ``json`` refuses never passes) and an unknown field refuses;
* no line is as long as :data:`LINE_MAX` (msgspec misreads an exponent of six digits or more, which only a number
  of thousands of digits can make matter).

Anything else (another kind, another rank, a value the fold would correct or refuse, a record kept whole such as
``run_start``) and the whole read is read the dict way. A record answers ``get`` as the dict would.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

from stepwatch.monitors.fold.stepcolumns import UNIX_MAX
from stepwatch.monitors.protocol import KIND_LOG, KIND_PHASE, KIND_STEP

#: A line this long or longer is left to the dict way (the emitter's are ~200 bytes). msgspec (0.23) stops reading
#: an exponent once it reaches five digits: it reads 1e100000 as 1e10000, 1e123456 as 1e12345. Only some 9,700
#: digits of mantissa can bring such an exponent back into a double's range (``0.000...1e100000``: infinity to json,
#: 1e9 to msgspec, in 10,000 bytes), and no line shorter than this holds them.
LINE_MAX = 1 << 12

_Scalar = int | float | str | bool | None
_Count = Annotated[int, msgspec.Meta(ge=0, lt=2**53)] | None
_Unix = Annotated[float, msgspec.Meta(ge=0.0, lt=UNIX_MAX)] | None


class _Record(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, kw_only=True, gc=False):
    kind: ClassVar[str]
    fields: ClassVar[frozenset[str]] = frozenset()
    rank: Literal[0] | None = None
    v: _Scalar = None
    t: _Scalar = None

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key`` (a key the record lacked reads None, as ``dict.get`` of it would)."""
        return getattr(self, key) if key in self.fields else self.kind if key == "kind" else default


class EmittedStep(_Record, tag=KIND_STEP, kw_only=True):
    """A ``step`` record whose every field is what the fold keeps (``t`` and ``step_end`` unix seconds)."""

    kind: ClassVar[str] = KIND_STEP
    dt: Annotated[float, msgspec.Meta(ge=0.0, lt=2.0**53)]
    step: Annotated[int, msgspec.Meta(gt=-2**53, lt=2**53)] | None = None
    flags: list[str] | None = None
    tokens: _Count = None
    padded_tokens: _Count = None
    t: _Unix = None  # type: ignore[assignment]  # narrower than the base's: a step's clock
    step_end: _Unix = None
    step_begin: _Scalar = None
    batch_size: _Scalar = None
    width: _Scalar = None
    timing: _Scalar = None
    steps_in_update: _Scalar = None
    arrival_dt_s: _Scalar = None


class EmittedLog(_Record, tag=KIND_LOG):
    """A ``log`` record of flat metrics."""

    kind: ClassVar[str] = KIND_LOG
    step: _Scalar = None
    logs: dict[str, _Scalar] | None = None


class EmittedPhase(_Record, tag=KIND_PHASE):
    """A ``phase`` record."""

    kind: ClassVar[str] = KIND_PHASE
    step: _Scalar = None
    name: _Scalar = None
    state: _Scalar = None


for _cls in (EmittedStep, EmittedLog, EmittedPhase):
    _cls.fields = frozenset(_cls.__struct_fields__)
_DECODE = msgspec.json.Decoder(EmittedStep | EmittedLog | EmittedPhase).decode


class DecodedRead(list[Any]):
    """A read's records, decoded (:func:`decode_read`), and its lines (``lines``: bytes, without their newlines)."""

    __slots__ = ("lines",)

    def __init__(self, records: list[Any], lines: list[bytes]) -> None:
        super().__init__(records)
        self.lines = lines


def decode_read(body: bytes) -> DecodedRead | None:
    """The records of a read's complete lines (``body``, ending with a newline) when every one of them is an
    :class:`EmittedStep`, :class:`EmittedLog` or :class:`EmittedPhase` (see above); else None."""
    lines = body.split(b"\n")
    lines.pop()  # after the last newline
    if max(map(len, lines), default=0) >= LINE_MAX:
        return None
    try:
        return DecodedRead(list(map(_DECODE, lines)), lines)
    except (msgspec.DecodeError, RecursionError, OverflowError):  # ValidationError is a DecodeError
        return None


class ReadDecoder:
    """:func:`decode_read` for one fold of a file, trying less where it keeps refusing: after ``REFUSALS`` reads in a
    row that it could not take (a file of several ranks' records, say), one read in ``RETRY_EVERY``, until one is
    taken. Only the cost depends on it: a read refused is read the dict way, to the same fold."""

    REFUSALS, RETRY_EVERY = 16, 64

    def __init__(self) -> None:
        self.refused_in_row = 0

    def __call__(self, body: bytes) -> DecodedRead | None:
        n = self.refused_in_row
        got = None if n >= self.REFUSALS and n % self.RETRY_EVERY else decode_read(body)
        self.refused_in_row = 0 if got is not None else n + 1
        return got

