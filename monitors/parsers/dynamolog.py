"""Find torch dynamo records in ``train.log`` text: recompiles, the recompile-limit warning, graph breaks.

Formats as captured from torch 2.13 (``tests/fixtures/real/dynamo_recompiles.log``,
``dynamo_limit_default.log``, ``hf_trainer_compile.log``). torch's log formatter prefixes EVERY line of
a multi-line record the same way (glog-like)::

    V1130 06:49:43.015000 8003 torch/_dynamo/guards.py:5396] [0/1] [__recompiles] Recompiling function forward in <file>:61
    V1130 06:49:43.015000 8003 torch/_dynamo/guards.py:5396] [0/1] [__recompiles]     triggered by the following guard failure(s):
    V1130 06:49:43.015000 8003 torch/_dynamo/guards.py:5396] [0/1] [__recompiles]     - 0/0: tensor 'ids' size mismatch at index 1. expected 17, actual 33
    W1130 06:50:34.283000 8003 torch/_dynamo/convert_frame.py:1994] [0/4] torch._dynamo hit config.recompile_limit (4)
    W1130 06:50:34.283000 8003 torch/_dynamo/convert_frame.py:1994] [0/4]    function: 'forward' (<file>:61)
    W1130 06:50:34.283000 8003 torch/_dynamo/convert_frame.py:1994] [0/4]    last reason: 0/3: tensor 'ids' ...
    V1130 06:50:35.832000 8003 torch/_dynamo/symbolic_convert.py:5124] [1/0] [__graph_breaks] Graph break in user code at <file>:183
    V1130 06:50:35.832000 8003 torch/_dynamo/symbolic_convert.py:5124] [1/0] [__graph_breaks] Graph Break Reason: ...

(level letter + MMDD, time, pid, source:line, ``[frame_id/compile_id]``, ``[__artifact]``). Under
torch.distributed torch adds ``[rankN]:`` before the level letter; torchrun ``--tee`` adds
``[defaultN]:`` at the start of the line. A record may be glued onto the end of a tqdm ``\\r`` segment
with no newline before it, so records are searched for anywhere in a line. The recompile records need
``TORCH_LOGS=recompiles`` (graph breaks: ``graph_breaks``); the recompile-limit warning is printed at
WARNING level even without TORCH_LOGS -- the moment dynamo stops compiling a frame and runs it eagerly.
Records printed by a plain ``logging`` formatter (no prefix on continuation lines) are understood too.

THE COUNTING TRAP. The attempt that hits the limit also prints a ``Recompiling`` record first (same
``[frame/compile]`` id as the warning that follows, ``[0/4]`` in ``dynamo_recompiles.log``). That
attempt compiled nothing: it is a limit hit, not a recompile. So N ``Recompiling`` records followed by
one limit warning mean N-1 recompiles and N graphs (the first compile prints no record): the fixture's
truth is 4 graphs, 3 recompiles, 1 limit hit, and :class:`DynamoLogScanner` gives exactly that. To do
so a recompile record is held until the next line of the same rank shows whether the limit warning
follows; should a warning arrive after its record was already released (an interleaved line, or
``flush()`` in between), the count is corrected (``recompiles`` goes down by one).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from stepwatch.monitors.readers.rankprefix import LEADING_PREFIXES, RANK_PREFIX, rank_of, rank_prefix

__all__ = [
    "Recompile",
    "RecompileLimit",
    "GraphBreak",
    "DynamoEvent",
    "DynamoLogScanner",
    "normalize_reason",
]

_GLOG = re.compile(
    rf"(?P<pfx>(?:{RANK_PREFIX})*)"
    r"(?P<level>[VIWEDC])(?P<md>\d{4}) (?P<time>\d\d:\d\d:\d\d\.\d+) +(?P<pid>\d+) (?P<src>[^\s\]]+?:\d+)\]"
    r"(?: ?\[(?P<cid>!?\d+(?:/\d+)+(?:_\d+)?)\])?"
    r"(?: ?\[__(?P<artifact>\w+)\])?"
    r"(?: (?P<msg>.*))?$"
)
_RECOMPILING = re.compile(r"Recompiling function (?P<fn>\S+) in (?P<loc>\S.*?)\s*$")
_LIMIT = re.compile(r"torch\._dynamo hit config\.(?P<name>\w+) \((?P<limit>\d+)\)")
_LIMIT_FN = re.compile(r"^\s*function: '(?P<fn>[^']*)'(?: \((?P<loc>[^)]*)\))?")
_LAST_REASON = re.compile(r"^\s*last reason: (?P<r>.*?)\s*$")
# "Graph break in user code at f.py:183" (torch 2.13), "Graph break (details suppressed) in user code at ...",
# older "Graph break: from user code at: ..."; never the record's own "Graph Break Reason:" line.
_GB_START = re.compile(r"^Graph break(?!\s+reason\b)", re.I)
_GB_LOC = re.compile(r"user code at:? (?P<loc>\S.*?)\s*$")
_GB_REASON = re.compile(r"^\s*Graph Break Reason: (?P<r>.*?)\s*$")
_FAILURE = re.compile(r"^\s*- (?P<r>.*?)\s*$")
_GUARD_ID = re.compile(r"^\d+/\d+(?:_\d+)?: ")
_SPLIT = re.compile(r"\r\n|\r|\n")
_PREFILTER = ("_dynamo", "[__", "Recompiling function", "Graph break", "hit config.")


def normalize_reason(reason: str) -> str:
    """A grouping key for reasons: digits become ``N`` (``expected 17, actual 33`` -> ``expected N, actual N``)."""
    return re.sub(r"\d+", "N", reason).strip()


@dataclass(frozen=True, slots=True)
class Recompile:
    """A frame was recompiled (a ``[__recompiles]`` record that was NOT the limit-hitting attempt).

    Attributes:
        function: the function name (``forward``).
        reason: the first guard failure (the most recent cache entry), without the ``- `` and the
            ``0/3: `` cache-entry id, e.g. ``tensor 'ids' size mismatch at index 1. expected 33, actual 49``;
            None when the record had no failure lines.
        rank: from a ``[rankN]:`` / ``[defaultN]:`` prefix, else None.
        frame_id, compile_id: from ``[frame_id/compile_id]`` (the new compile's number), None if absent.
        location: ``file:line`` of the function.
        reasons: every guard failure line of the record.
        pid: the printing process id, None if unknown.
    """

    function: str
    reason: str | None
    rank: int | None
    frame_id: int | None
    compile_id: int | None
    location: str | None = None
    reasons: tuple[str, ...] = ()
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class RecompileLimit:
    """Dynamo hit ``config.<limit_name>`` for a frame and now runs it eagerly (on this rank).

    Attributes:
        function: the function named by the warning (``forward``), None if its line never came.
        limit: the limit's value (``4``).
        rank: from a rank prefix, else None.
        limit_name: ``recompile_limit``, ``accumulated_recompile_limit`` or the older
            ``cache_size_limit`` names.
        frame_id, compile_id: the attempt that hit it (``[0/4]``).
        last_reason: the warning's ``last reason:`` text.
        location: ``file:line`` of the function.
    """

    function: str | None
    limit: int
    rank: int | None
    limit_name: str = "recompile_limit"
    frame_id: int | None = None
    compile_id: int | None = None
    last_reason: str | None = None
    location: str | None = None


@dataclass(frozen=True, slots=True)
class GraphBreak:
    """A ``[__graph_breaks]`` record (needs ``TORCH_LOGS=graph_breaks``).

    Attributes:
        reason: the ``Graph Break Reason:`` text (else the record's first line).
        rank: from a rank prefix, else None.
        location: ``file:line`` in user code where it broke.
        frame_id, compile_id: from ``[frame_id/compile_id]``.
    """

    reason: str
    rank: int | None
    location: str | None = None
    frame_id: int | None = None
    compile_id: int | None = None


DynamoEvent = Recompile | RecompileLimit | GraphBreak


@dataclass
class _Open:
    kind: str  # "recompile" | "limit" | "graph_break"
    rank: int | None
    pid: int | None
    ids: tuple[int | None, int | None]
    key: tuple | None  # glog identity of its continuation lines, None for unprefixed records
    function: str | None = None
    location: str | None = None
    reasons: list[str] = field(default_factory=list)
    limit: int = 0
    limit_name: str = ""
    last_reason: str | None = None
    emitted: bool = False
    first_msg: str = ""


def _ids(cid: str | None) -> tuple[int | None, int | None]:
    if not cid:
        return None, None
    nums = re.findall(r"\d+", cid)
    if len(nums) < 2:
        return (int(nums[0]) if nums else None), None
    return int(nums[0]), int(nums[1])


def _strip_guard_id(reason: str) -> str:
    return _GUARD_ID.sub("", reason, count=1)


class DynamoLogScanner:
    """Feed it log text segment by segment; it returns typed events and keeps running counts.

    ``feed(text)`` accepts one segment (a line, a ``\\r`` update, or several lines: it splits on
    ``\\r\\n``, ``\\r`` and ``\\n``). Feed every segment exactly once and in order -- never the live
    partial tail (it would be counted again when it ends). Call :meth:`flush` at the end of a log
    (or to release records held waiting for their next line).

    Counts (see the module docstring for why a limit-hitting attempt is not a recompile):

    Attributes:
        recompiles: recompile records that compiled (limit-hitting attempts excluded).
        recompile_limit_hits: recompile-limit warnings.
        graph_breaks: graph-break records.
        reason_counts: ``Counter`` of :func:`normalize_reason` keys over counted recompiles.
        function_counts: ``Counter`` of function names over counted recompiles.
        limit_hits: every :class:`RecompileLimit` seen, in order (name the function and rank).
        implied_graphs: for frames that printed recompile records, the graphs they imply
            (highest counted compile_id + 1 per (rank, pid, frame)); a lower bound of unique graphs.
    """

    def __init__(self) -> None:
        self.recompiles = 0
        self.recompile_limit_hits = 0
        self.graph_breaks = 0
        self.reason_counts: Counter[str] = Counter()
        self.function_counts: Counter[str] = Counter()
        self.limit_hits: list[RecompileLimit] = []
        self._open: dict[int | None, _Open] = {}
        self._released: dict[tuple, Recompile] = {}  # (rank, pid, frame, compile) -> released Recompile
        self._frames: dict[tuple, int] = {}  # (rank, pid, frame) -> highest counted compile id

    # ------------------------------------------------------------------ public
    def feed(self, text: str) -> list[DynamoEvent]:
        """Scan one segment of log text; return the events it completed (may be empty)."""
        out: list[DynamoEvent] = []
        if "\n" in text or "\r" in text:
            for line in _SPLIT.split(text):
                self._line(line, out)
        else:
            self._line(text, out)
        return out

    def flush(self) -> list[DynamoEvent]:
        """Release every record still held (end of the log). Returns the events released."""
        out: list[DynamoEvent] = []
        for rank in list(self._open):
            self._close(rank, out)
        return out

    def most_common_reason(self) -> tuple[str, int] | None:
        """(normalized reason, count) of the most frequent recompile reason, None without recompiles."""
        top = self.reason_counts.most_common(1)
        return top[0] if top else None

    @property
    def implied_graphs(self) -> int:
        return sum(c + 1 for c in self._frames.values())

    def counts(self) -> dict:
        """JSON-able summary: recompiles, recompile_limit_hits, graph_breaks, top reason, limit functions."""
        top = self.most_common_reason()
        return {
            "recompiles": self.recompiles,
            "recompile_limit_hits": self.recompile_limit_hits,
            "graph_breaks": self.graph_breaks,
            "top_recompile_reason": top[0] if top else None,
            "top_recompile_reason_count": top[1] if top else 0,
            "limit_hits": [{"function": e.function, "rank": e.rank, "limit": e.limit} for e in self.limit_hits],
        }

    # ----------------------------------------------------------------- helpers
    def _line(self, line: str, out: list[DynamoEvent]) -> None:
        if not line:
            return
        if not self._open and not any(p in line for p in _PREFILTER):
            return
        g = _GLOG.search(line)
        if g is not None:
            self._glog_line(line, g, out)
        else:
            self._plain_line(line, out)

    def _glog_line(self, line: str, g: re.Match, out: list[DynamoEvent]) -> None:
        rank = rank_of(g.group("pfx") or "")
        if rank is None:
            rank = rank_prefix(line)[0]
        pid = int(g.group("pid"))
        cid = g.group("cid")
        ids = _ids(cid)
        artifact = g.group("artifact")
        msg = g.group("msg") or ""
        key = (pid, g.group("level"), g.group("src"), cid, artifact)
        op = self._open.get(rank)
        smsg = msg.strip()

        lm = _LIMIT.search(msg)
        if lm is not None:
            self._limit_start(rank, pid, ids, key, lm, out)
            return
        if artifact is not None and artifact.startswith("recompiles"):
            rm = _RECOMPILING.search(smsg)
            if rm is not None:
                self._close(rank, out)
                self._open[rank] = _Open("recompile", rank, pid, ids, key, function=rm.group("fn"), location=rm.group("loc"))
                return
        if artifact == "graph_breaks" and _GB_START.match(smsg):
            self._close(rank, out)
            gm = _GB_LOC.search(smsg)
            loc = gm.group("loc") if gm else None
            self._open[rank] = _Open("graph_break", rank, pid, ids, key, location=loc, first_msg=smsg)
            return
        if op is not None and op.key == key:
            self._continue(op, msg, out)
            return
        self._close(rank, out)

    def _plain_line(self, line: str, out: list[DynamoEvent]) -> None:
        rank = rank_prefix(line)[0]
        op = self._open.get(rank)
        lm = _LIMIT.search(line)
        if lm is not None:
            self._limit_start(rank, None, (None, None), None, lm, out)
            return
        rm = _RECOMPILING.search(line)
        if rm is not None:
            self._close(rank, out)
            self._open[rank] = _Open("recompile", rank, None, (None, None), None, function=rm.group("fn"), location=rm.group("loc"))
            return
        if op is not None and op.key is None:
            body = LEADING_PREFIXES.sub("", line)
            s = body.strip()
            if op.kind == "limit" and (s.startswith(("function:", "last reason:", "To log all", "To diagnose"))):
                self._continue(op, body, out)
                return
            if op.kind == "recompile" and (s.startswith(("triggered by", "- ", "guard ")) or s == "-"):
                self._continue(op, body, out)
                return
        self._close(rank, out)

    def _limit_start(self, rank, pid, ids, key, lm: re.Match, out: list[DynamoEvent]) -> None:
        op = self._open.get(rank)
        absorbed = None
        if op is not None and op.kind == "recompile" and op.ids == ids and op.pid == pid:
            # ids and pid are both None for records from a plain logging formatter: the warning
            # follows the limit-hitting attempt's record directly in torch, so adjacency decides.
            # The held Recompiling record was this limit-hitting attempt: not a recompile.
            absorbed = op
            del self._open[rank]
        else:
            self._close(rank, out)
            released = self._released.pop((rank, pid, ids[0], ids[1]), None) if ids[0] is not None else None
            if released is not None:
                self._uncount(released)
        new = _Open("limit", rank, pid, ids, key, limit=int(lm.group("limit")), limit_name=lm.group("name"))
        if absorbed is not None:
            new.function = absorbed.function
            new.location = absorbed.location
            if absorbed.reasons:
                new.last_reason = _strip_guard_id(absorbed.reasons[0])
        self._open[rank] = new

    def _continue(self, op: _Open, msg: str, out: list[DynamoEvent]) -> None:
        if op.kind == "recompile":
            fm = _FAILURE.match(msg)
            if fm is not None:
                op.reasons.append(fm.group("r"))
        elif op.kind == "limit":
            fm = _LIMIT_FN.match(msg)
            if fm is not None:
                op.function = fm.group("fn")
                if fm.group("loc"):
                    op.location = fm.group("loc")
                return
            rm = _LAST_REASON.match(msg)
            if rm is not None:
                op.last_reason = _strip_guard_id(rm.group("r"))
                self._emit_limit(op, out)  # the function line came first: emit now, not 20 s later
        elif op.kind == "graph_break":
            rm = _GB_REASON.match(msg)
            if rm is not None and not op.emitted:
                op.reasons.append(rm.group("r"))
                self._emit_graph_break(op, out)

    def _close(self, rank: int | None, out: list[DynamoEvent]) -> None:
        op = self._open.pop(rank, None)
        if op is None:
            return
        if op.kind == "recompile":
            reasons = tuple(op.reasons)
            ev = Recompile(
                function=op.function or "?",
                reason=_strip_guard_id(reasons[0]) if reasons else None,
                rank=op.rank,
                frame_id=op.ids[0],
                compile_id=op.ids[1],
                location=op.location,
                reasons=reasons,
                pid=op.pid,
            )
            self.recompiles += 1
            if ev.reason is not None:
                self.reason_counts[normalize_reason(ev.reason)] += 1
            self.function_counts[ev.function] += 1
            if ev.frame_id is not None and ev.compile_id is not None:
                fk = (ev.rank, ev.pid, ev.frame_id)
                self._frames[fk] = max(self._frames.get(fk, 0), ev.compile_id)
                self._released[(ev.rank, ev.pid, ev.frame_id, ev.compile_id)] = ev
                while len(self._released) > 256:
                    self._released.pop(next(iter(self._released)))
            out.append(ev)
        elif op.kind == "limit":
            self._emit_limit(op, out)
        elif op.kind == "graph_break":
            self._emit_graph_break(op, out)

    def _uncount(self, ev: Recompile) -> None:
        """A released Recompile turned out to be the limit-hitting attempt: take it back out."""
        self.recompiles -= 1
        if ev.reason is not None:
            k = normalize_reason(ev.reason)
            self.reason_counts[k] -= 1
            if self.reason_counts[k] <= 0:
                del self.reason_counts[k]
        self.function_counts[ev.function] -= 1
        if self.function_counts[ev.function] <= 0:
            del self.function_counts[ev.function]
        fk = (ev.rank, ev.pid, ev.frame_id)
        if self._frames.get(fk) == ev.compile_id:
            if ev.compile_id:
                self._frames[fk] = ev.compile_id - 1
            else:
                self._frames.pop(fk, None)

    def _emit_limit(self, op: _Open, out: list[DynamoEvent]) -> None:
        if op.emitted:
            return
        op.emitted = True
        ev = RecompileLimit(
            function=op.function,
            limit=op.limit,
            rank=op.rank,
            limit_name=op.limit_name,
            frame_id=op.ids[0],
            compile_id=op.ids[1],
            last_reason=op.last_reason,
            location=op.location,
        )
        self.recompile_limit_hits += 1
        self.limit_hits.append(ev)
        out.append(ev)

    def _emit_graph_break(self, op: _Open, out: list[DynamoEvent]) -> None:
        if op.emitted:
            return
        op.emitted = True
        reason = op.reasons[0] if op.reasons else op.first_msg
        self.graph_breaks += 1
        out.append(GraphBreak(reason=reason, rank=op.rank, location=op.location, frame_id=op.ids[0], compile_id=op.ids[1]))
