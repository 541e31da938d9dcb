"""Follow a run's ``train.log`` like ``tail -F``: plain reads for content, a stat of the PATH each tick.

:class:`LogFollower` is a pure, synchronous core (ARCHITECTURE.md, "Folders":
monitors/readers/). Each :meth:`LogFollower.poll` stats the *path* (inode, device, size), reads whatever is new with plain
``os.pread`` calls and splits it into :class:`Segment` objects. It is the ground truth: anything
that calls ``poll()`` often enough sees every byte, whatever notification machinery is (or is not)
working (:mod:`stepwatch.monitors.readers.changes` only says "look now"). It handles partial last
lines, ``\\r`` progress updates, non-UTF-8 bytes, very long lines, truncation, rotation (the file
replaced by rename) and deletion. On the first open of an existing file it starts from the END
minus a bounded window (a 2 GB log is never read whole).

toolong's lesson (Textualize/toolong keeps its first descriptor, so it freezes on truncation and follows
the old file after a rename): never keep the first file descriptor forever -- stat the path each tick.
Nothing here imports textual, launcher or tui.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stepwatch.monitors.runfiles import open_regular
from stepwatch.monitors.readers.rankprefix import glued_prefix_at

__all__ = [
    "Segment",
    "LogFollower",
    "DEFAULT_MAX_LINE_BYTES",
]

#: Longest segment kept, in bytes; the rest of a longer segment is counted and dropped ("cut").
DEFAULT_MAX_LINE_BYTES = 32 * 1024
#: Upper bound on the bytes read backwards on first open, whatever keep_lines asks for.
DEFAULT_TAIL_MAX_BYTES = 8 * 1024 * 1024
#: Upper bound on the bytes one poll() reads; the rest waits for the next poll (``behind`` is True).
DEFAULT_MAX_BYTES_PER_POLL = 8 * 1024 * 1024
_READ_CHUNK = 1024 * 1024
_BACK_BLOCK = 64 * 1024

_TERM = re.compile(rb"\r\n|\r|\n")
_ANY_TERM = re.compile(rb"[\r\n]")

End = Literal["\n", "\r", ""]
State = Literal["waiting", "following", "missing", "unreadable"]


@dataclass(slots=True)
class Segment:
    """One piece of the log between terminators, decoded with ``errors="replace"``.

    Treat it as read-only (it is not frozen only because frozen dataclasses are ~5x slower to
    create, and a backlog can hold millions of segments).

    Attributes:
        text: the decoded bytes, without the terminator. At most ``max_line_bytes`` bytes of the
            original segment are kept (a bounded prefix) when it was longer; then ``cut`` is True.
        end: what ended it: ``"\\n"`` (a newline; ``\\r\\n`` counts as one newline), ``"\\r"`` (a
            carriage return: a progress update that the next segment overwrites on a terminal) or
            ``""`` (not ended by a terminator: the live partial tail, or the last bytes of a file that
            was rotated away or truncated). Notes use ``"\\n"``.
        cut: True when the original segment was longer than ``max_line_bytes``.
        nbytes: length of the original segment in bytes (without the terminator), cut or not.
        at_s: wall-clock unix seconds (``time.time()``) of the poll that read its last byte.
        poll_seq: number of the ``poll()`` call that produced it (1, 2, ...). Two segments with the
            same ``poll_seq`` arrived together, so their arrival times say nothing about their spacing.
        backfill: True for segments read from the tail window on first open (history, not live:
            their ``at_s`` is the attach time, not when they were written).
        is_note: True for a line stepwatch itself made (truncation, rotation, deletion...), never part
            of the file. Parsers must skip notes.
    """

    text: str
    end: End
    cut: bool = False
    nbytes: int = 0
    at_s: float = 0.0
    poll_seq: int = 0
    backfill: bool = False
    is_note: bool = False

    @property
    def is_progress(self) -> bool:
        """True when ended by a lone ``\\r`` (a tqdm-style update)."""
        return self.end == "\r"


def _overlay(text: str, view: str) -> str:
    """What a terminal shows after writing ``text`` from column 0 over ``view`` (a ``\\r`` update)."""
    if len(text) >= len(view):
        return text
    return text + view[len(text):]


class LogFollower:
    """Follow one log file by path: tail on attach, then every appended byte, across rotations.

    Args:
        path: the file to follow (e.g. ``<run_dir>/train.log``); it need not exist yet.
        keep_lines: how many complete lines :attr:`last_lines` keeps, and how many lines the first
            open of an existing file reads back from its end.
        max_line_bytes: longest segment kept, in bytes; longer ones keep this many leading bytes and
            are marked ``cut`` (memory stays bounded whatever the line length).
        tail_max_bytes: the most bytes read back from the end on first open, whatever keep_lines
            asks for (a log of 10 MB lines must not be read whole either).
        max_bytes_per_poll: the most bytes one ``poll()`` reads; when more is waiting, :attr:`behind`
            is True and the next poll continues.
        from_start: read an existing file from byte 0 on first open instead of its tail (replay).

    Attributes:
        last_lines: ``deque[str]`` of the last ``keep_lines`` complete lines as a terminal would
            show them (``\\r`` updates overlaid, trailing blanks removed; a cut line ends with a
            ``[... cut: N bytes]`` marker). Notes are not in it (see :attr:`notes`).
        last_byte_at: unix seconds when the last new byte arrived: on attach the file's ``st_mtime``
            (the bytes are older than the attach), afterwards the wall time of the poll that read
            it. None before any byte.
        bytes_read: bytes read from files so far (the tail window included).
        state: ``"waiting"`` (no file seen yet), ``"following"``, ``"missing"`` (the file was
            deleted or renamed away and nothing replaced it yet; the last lines are kept and a new
            file is picked up when it appears), ``"unreadable"`` (exists, cannot be opened).
        notes: ``deque[tuple[float, str]]`` of (unix seconds, message) for the last 100 notes.
        behind: True when the last poll stopped at ``max_bytes_per_poll`` with bytes left.
        rotations, truncations: how many of each were seen.

    Not thread-safe: call it from one thread (a Textual worker, a watch loop).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        keep_lines: int = 500,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        *,
        tail_max_bytes: int = DEFAULT_TAIL_MAX_BYTES,
        max_bytes_per_poll: int = DEFAULT_MAX_BYTES_PER_POLL,
        from_start: bool = False,
    ) -> None:
        if keep_lines < 1 or max_line_bytes < 1:
            raise ValueError("keep_lines and max_line_bytes must be >= 1")
        self.path = Path(path)
        self.keep_lines = keep_lines
        self.max_line_bytes = max_line_bytes
        self.tail_max_bytes = max(tail_max_bytes, 1)
        self.max_bytes_per_poll = max(max_bytes_per_poll, 1)
        self.from_start = from_start

        self.last_lines: deque[str] = deque(maxlen=keep_lines)
        self.notes: deque[tuple[float, str]] = deque(maxlen=100)
        self.last_byte_at: float | None = None
        self._last_byte_mono: float | None = None  # time.monotonic() of the poll that read the last live byte
        self.bytes_read = 0
        self.state: State = "waiting"
        self.behind = False
        self.rotations = 0
        self.truncations = 0

        self._fd: int | None = None
        self._id: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._pos = 0  # next byte to read from the open file
        self._opened_once = False
        self._poll_seq = 0
        # splitter state
        self._cur = bytearray()  # bytes of the unterminated segment (at most max_line_bytes)
        self._cur_dropped = 0  # bytes of it beyond max_line_bytes
        self._cr_pending = False  # last byte seen was a lone '\r': is a '\n' coming?
        self._view = ""  # terminal view of the current line from its finished '\r' segments
        self._view_cut = False
        self._skip_to_term = False  # tail window started mid-line: drop bytes up to a terminator

    # ------------------------------------------------------------------ public
    @property
    def current_partial(self) -> str | None:
        """The unfinished last line as a terminal would show it (tqdm bars never end in ``\\n``).

        None when the last line ended with a newline. Not in :attr:`last_lines` until it ends.
        """
        if not self._cur and not self._view and not self._cr_pending and not self._cur_dropped:
            return None
        text = self._cur.decode("utf-8", "replace")
        return _overlay(text, self._view).rstrip(" ")

    @property
    def partial_segment(self) -> Segment | None:
        """The unterminated tail segment (e.g. the latest tqdm bar) as a Segment with ``end=""``.

        Progress parsers may look at it every poll (feeding the same bar twice is a no-op for
        :class:`stepwatch.monitors.parsers.hf_progress.ProgressTracker`); counting scanners (dynamo) must not, or they
        would count it again once it ends. None when there is no unterminated text.
        Its ``at_s`` is :attr:`last_byte_at` -- the file's mtime when the bytes came with the attach
        window, which is when tqdm wrote that bar -- and ``poll_seq`` is the latest poll's.
        """
        if not self._cur and not self._cur_dropped:
            return None
        return Segment(
            text=self._cur.decode("utf-8", "replace"),
            end="",
            cut=self._cur_dropped > 0,
            nbytes=len(self._cur) + self._cur_dropped,
            at_s=self.last_byte_at or 0.0,
            poll_seq=self._poll_seq,
        )

    @property
    def last_byte_age_s(self) -> float | None:
        """Seconds since the last byte arrived, None before any byte: on the monotonic clock once this
        follower saw a byte arrive (no clock skew nor step of the wall clock moves it), else since
        the file's mtime at attach (wall clock: all there is)."""
        if self._last_byte_mono is not None:
            return max(0.0, time.monotonic() - self._last_byte_mono)
        return None if self.last_byte_at is None else max(0.0, time.time() - self.last_byte_at)

    def poll(self) -> list[Segment]:
        """Stat the path, read what is new, return the segments that ENDED since the last poll.

        Order is file order; notes (``is_note=True``) sit where the event happened (e.g. between the
        old file's last lines and the new file's first). The unterminated tail is not returned (see
        :attr:`partial_segment`). Never raises for a missing, replaced, truncated or unreadable file:
        those are states and notes. Reads at most ``max_bytes_per_poll`` bytes.
        """
        self._poll_seq += 1
        now = time.time()
        out: list[Segment] = []
        budget = self.max_bytes_per_poll
        self.behind = False

        try:
            st: os.stat_result | None = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError as e:  # EACCES on the directory, ESTALE on NFS, ...
            if self.state != "unreadable":
                self._note(out, now, f"cannot stat {self.path}: {e.strerror or e}")
            self.state = "unreadable"
            self._read_available(out, now, budget)  # an open fd still reads
            return out

        if self._fd is not None:
            if st is None:
                # Deleted or renamed away with nothing in its place. A writer may still hold the
                # old inode: keep draining it, keep the lines, wait for a new file.
                if self.state != "missing":
                    self.state = "missing"
                    self._note(out, now, f"{self.path.name} is missing (deleted or renamed); keeping the last lines")
                self._read_available(out, now, budget)
                return out
            if (st.st_dev, st.st_ino) != self._id:
                # Replaced (rotation by rename, or deleted and created again). Drain the old file
                # to its end FIRST -- zero lost lines -- then open the new one from byte 0.
                budget = self._read_available(out, now, budget)
                if self.behind:
                    return out  # more of the old file next poll; the switch waits for it
                self._flush_partial(out, now)
                self._close()
                self.rotations += 1
                self._note(out, now, f"{self.path.name} was replaced (rotated); following the new file from its start")
            elif st.st_size < self._pos:
                # Truncated in place (same inode). A truncation followed by a rewrite past our
                # position before this poll cannot be told from an append (as with tail -F).
                self.truncations += 1
                self._note(
                    out, now,
                    f"{self.path.name} was truncated ({self._pos} -> {st.st_size} bytes); reading again from its start",
                )
                self._reset_splitter(keep_view=False)
                self._pos = 0
                self.state = "following"
            else:
                self.state = "following"  # e.g. the same inode renamed back

        if self._fd is None:
            if st is None or not self._open(st, out, now):
                return out

        self._read_available(out, now, budget)
        return out

    def close(self) -> None:
        """Close the open file descriptor (the follower can be polled again: it reopens)."""
        self._close()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._close()
        except Exception:
            pass

    # ----------------------------------------------------------------- helpers
    def _open(self, st: os.stat_result, out: list[Segment], now: float) -> bool:
        try:
            fd = open_regular(self.path)  # a FIFO put in its place must not hang the view
        except FileNotFoundError:
            return False  # vanished between stat and open: next poll
        except OSError as e:
            fd, why = None, f"cannot open {self.path}: {e.strerror or e}"
        else:
            why = f"cannot follow {self.path}: not a regular file"
        if fd is None:
            if self.state != "unreadable":
                self._note(out, now, why)
            self.state = "unreadable"
            return False
        fst = os.fstat(fd)
        self._fd = fd
        self._id = (fst.st_dev, fst.st_ino)
        self._reset_splitter(keep_view=False)
        first = not self._opened_once
        self._opened_once = True
        self.state = "following"
        if first and not self.from_start and fst.st_size > 0:
            self._pos = self._tail_start(fd, fst.st_size)
            self._backfill_until = fst.st_size
            if self._pos > 0:
                self._note(out, now, f"attached at byte {self._pos} of {fst.st_size} (tail of {self.path.name})")
            self.last_byte_at = fst.st_mtime
        else:
            self._pos = 0
            self._backfill_until = fst.st_size if first else 0
            if first and fst.st_size > 0:
                self.last_byte_at = fst.st_mtime
        return True

    def _tail_start(self, fd: int, size: int) -> int:
        """Offset where the last ``keep_lines`` complete lines (plus the partial tail) begin.

        Reads backwards in 64 KiB blocks, counting newlines, never more than ``tail_max_bytes``.
        When the window runs out before enough newlines were found, the start lands mid-line and the
        bytes up to the next terminator are skipped (with a note).
        """
        need = self.keep_lines + 1  # the newline that precedes the first kept line
        pos = size
        floor = max(0, size - self.tail_max_bytes)
        found = 0
        while pos > floor:
            start = max(floor, pos - _BACK_BLOCK)
            block = os.pread(fd, pos - start, start)
            end = len(block)
            while True:
                i = block.rfind(b"\n", 0, end)
                if i < 0:
                    break
                # a newline that is the very last byte ends the last line: it counts as ending a line
                found += 1
                if found == need:
                    return start + i + 1
                end = i
            pos = start
        if floor == 0:
            return 0
        self._skip_to_term = True
        return floor

    def _read_available(self, out: list[Segment], now: float, budget: int) -> int:
        """Read from the open fd to EOF (or until the budget is spent); returns the budget left."""
        fd = self._fd
        if fd is None:
            return budget
        while budget > 0:
            n = min(_READ_CHUNK, budget)
            try:
                data = os.pread(fd, n, self._pos)
            except OSError as e:
                self._note(out, now, f"read error on {self.path.name}: {e.strerror or e}")
                break
            if not data:
                break
            backfill = self._pos < self._backfill_until
            if backfill and self._pos + len(data) > self._backfill_until:
                # keep the backfill/live boundary exact
                data = data[: self._backfill_until - self._pos]
            self._pos += len(data)
            self.bytes_read += len(data)
            budget -= len(data)
            if not backfill:
                self.last_byte_at, self._last_byte_mono = now, time.monotonic()
            self._split(data, out, now, backfill)
        else:
            # budget exhausted: is there more?
            try:
                self.behind = os.fstat(fd).st_size > self._pos
            except OSError:
                self.behind = False
        return budget

    def _split(self, data: bytes, out: list[Segment], now: float, backfill: bool) -> None:
        i = 0
        n = len(data)
        if self._skip_to_term:
            m = _ANY_TERM.search(data)
            if m is None:
                return
            self._skip_to_term = False
            i = m.start()
            if data[i : i + 1] == b"\r" and i + 1 < n and data[i + 1 : i + 2] == b"\n":
                i += 2
            else:
                i += 1
            self._cur.clear()
            self._cur_dropped = 0
        if self._cr_pending and i < n:
            self._cr_pending = False
            if data[i : i + 1] == b"\n":
                self._emit("\n", out, now, backfill)
                i += 1
            else:
                self._emit("\r", out, now, backfill)
        maxb = self.max_line_bytes
        for m in _TERM.finditer(data, i):
            a, b = m.span()
            if b == n and b - a == 1 and data[a] == 13:
                # a lone '\r' as the last byte: '\r\n' split across reads? decide on the next byte
                self._append(data, i, a)
                self._cr_pending = True
                return
            end: End = "\r" if (b - a == 1 and data[a] == 13) else "\n"
            if self._cur or self._cur_dropped:
                self._append(data, i, a)
                self._emit(end, out, now, backfill)
            elif a - i <= maxb:  # fast path: the whole segment is in this chunk
                self._emit_text(data[i:a].decode("utf-8", "replace"), end, False, a - i, out, now, backfill)
            else:
                self._emit_text(data[i : i + maxb].decode("utf-8", "replace"), end, True, a - i, out, now, backfill)
            i = b
        self._append(data, i, n)

    def _append(self, data: bytes, a: int, b: int) -> None:
        if b <= a:
            return
        room = self.max_line_bytes - len(self._cur)
        if room >= b - a:
            self._cur += data[a:b]
        else:
            if room > 0:
                self._cur += data[a : a + room]
            self._cur_dropped += (b - a) - max(room, 0)

    def _emit(self, end: End, out: list[Segment], now: float, backfill: bool) -> None:
        text = self._cur.decode("utf-8", "replace")
        cut = self._cur_dropped > 0
        nbytes = len(self._cur) + self._cur_dropped
        self._cur.clear()
        self._cur_dropped = 0
        self._emit_text(text, end, cut, nbytes, out, now, backfill)

    def _emit_text(
        self, text: str, end: End, cut: bool, nbytes: int, out: list[Segment], now: float, backfill: bool
    ) -> None:
        while (at := glued_prefix_at(text)) > 0:  # torchrun --tee glued two lines: the first is a bar frame
            head, text = text[:at], text[at:]
            head_bytes = len(head.encode("utf-8", "replace"))
            nbytes -= head_bytes
            self._emit_text(head, "\r", False, head_bytes, out, now, backfill)
        out.append(Segment(text, end, cut, nbytes, now, self._poll_seq, backfill))
        view = self._view
        if end == "\r":
            self._view = text if len(text) >= len(view) else text + view[len(text):]
            if cut:
                self._view_cut = True
        else:
            line = _overlay(text, view).rstrip(" ") if view else text
            if cut or self._view_cut:
                line += f" [... cut: {nbytes} bytes]" if cut else " [... cut]"
            self.last_lines.append(line)
            self._view = ""
            self._view_cut = False

    def _flush_partial(self, out: list[Segment], now: float) -> None:
        """End the unterminated tail of a file that is going away (rotation) as a segment ``end=""``."""
        if self._cr_pending:
            self._cr_pending = False
            self._emit("\r", out, now, False)
        if self._cur or self._cur_dropped:
            self._emit("", out, now, False)
        elif self._view:
            self.last_lines.append(self._view.rstrip(" "))
            self._view = ""
            self._view_cut = False

    def _reset_splitter(self, keep_view: bool) -> None:
        self._cur.clear()
        self._cur_dropped = 0
        self._cr_pending = False
        self._skip_to_term = False
        if not keep_view:
            self._view = ""
            self._view_cut = False

    def _note(self, out: list[Segment], now: float, msg: str) -> None:
        text = f"[stepwatch] {msg}"
        self.notes.append((now, text))
        out.append(Segment(text, "\n", False, 0, now, self._poll_seq, False, True))

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        self._id = None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    _backfill_until = 0
