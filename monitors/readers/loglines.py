"""train.log as numbered lines, for the log panel's search, filter and error jumps over the whole file.

The panel itself keeps only the last lines it was handed; to find a string in a 100,000-line log it
asks :class:`LogLines`, which reads the file once and then only what was appended (by offset; a
replaced or truncated file is read again from its first byte). A line is what ends in ``\\n``; of a
line redrawn with ``\\r`` (a progress bar) the last drawing is kept, as a terminal would show it.
Opened without following a symlink; at most MAX_BYTES are kept (the oldest lines go first, and
``first_line`` says from which line on they are held). Standard library only; never raises for a
missing or unreadable file (it then holds no lines).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

#: Bytes of log held at most, counting a Python str's own cost per line (LINE_OVERHEAD_BYTES: a
#: file of 3-byte lines costs 20x its size in str objects), and read per refresh at most.
MAX_BYTES = 128 * 1024 * 1024
LINE_OVERHEAD_BYTES = 64
#: An unterminated line kept at most (a \r progress bar that never ends its line: its last drawing).
PARTIAL_MAX_BYTES = 64 * 1024
READ_CHUNK = 16 * 1024 * 1024
#: A line longer than this is cut (a dumped tensor): the panel shows at most this much of it.
MAX_LINE_CHARS = 2000
#: The lines an error jump (``e`` / ``E``) stops at: a traceback's first line, an exception line.
ERROR_RE = re.compile(r"Traceback \(most recent call last\)|^\s*+(?:\[\w+\]:\s*+)?[\w.]*(?:Error|Exception)\b(?::|$)"
                      r"|\bCUDA error\b|\bNCCL error\b|Segmentation fault|\bKilled\b")


def _display(raw: str) -> str:
    """One line as a terminal leaves it: the last ``\\r`` drawing, cut at MAX_LINE_CHARS."""
    if "\r" in raw:
        parts = [p for p in raw.split("\r") if p]
        raw = parts[-1] if parts else ""
    return raw[:MAX_LINE_CHARS]


class LogLines:
    """The lines of ``path`` (``lines[i]`` is line ``first_line + i``, counted from 1)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lines: list[str] = []
        self.first_line = 1
        self._offset = 0
        self._ino: tuple[int, int] | None = None
        self._partial = b""
        self._held = 0
        self.skipped_bytes = 0  #: bytes at the start of a huge log never read (line 1 is after them)
        self._skip_partial = False

    @property
    def last_line(self) -> int:
        """The number of the last complete line (0 when none)."""
        return self.first_line + len(self.lines) - 1

    def refresh(self) -> None:
        """Read what was appended since the last call."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            if self._ino != (st.st_dev, st.st_ino) or st.st_size < self._offset:
                self.__init__(self.path)  # replaced or truncated: from its first byte again
                self._ino = (st.st_dev, st.st_ino)
                if st.st_size > MAX_BYTES:  # a huge log: its last MAX_BYTES, numbered from there
                    self._offset = self.skipped_bytes = st.st_size - MAX_BYTES
                    self._skip_partial = True
            os.lseek(fd, self._offset, os.SEEK_SET)
            while self._offset < st.st_size:  # to the size seen now, a chunk at a time
                data = os.read(fd, min(READ_CHUNK, st.st_size - self._offset))
                if not data:
                    break
                self._offset += len(data)
                self._add(self._partial + data)
        finally:
            os.close(fd)

    def _add(self, data: bytes) -> None:
        *complete, self._partial = data.split(b"\n")
        if len(self._partial) > PARTIAL_MAX_BYTES:  # a bar redrawn with \r and never ended: its last drawing
            self._partial = self._partial.rsplit(b"\r", 1)[-1][-PARTIAL_MAX_BYTES:]
        if self._skip_partial and complete:  # the first line read of a huge log starts mid-line
            complete, self._skip_partial = complete[1:], False
        for raw in complete:
            line = _display(raw.decode("utf-8", "replace"))
            self.lines.append(line)
            self._held += len(line) + LINE_OVERHEAD_BYTES
        if self._held > MAX_BYTES:  # the oldest lines go: a tenth at a time
            drop = max(1, len(self.lines) // 10)
            self._held -= sum(len(s) + LINE_OVERHEAD_BYTES for s in self.lines[:drop])
            del self.lines[:drop]
            self.first_line += drop

    def line(self, number: int) -> str | None:
        i = number - self.first_line
        return self.lines[i] if 0 <= i < len(self.lines) else None

    def window(self, centre: int, count: int) -> tuple[int, list[str]]:
        """``count`` lines around line ``centre`` (fewer at the ends): (first line's number, lines)."""
        start = max(self.first_line, min(centre - count // 2, self.last_line - count + 1))
        i = start - self.first_line
        return start, self.lines[i:i + count]

    def find(self, pattern: re.Pattern[str], start: int, forward: bool) -> int | None:
        """The number of the first line matching ``pattern`` after (``forward``) or before line
        ``start``, not ``start`` itself; None when there is none."""
        n = len(self.lines)
        i = start - self.first_line
        rng = range(max(i + 1, 0), n) if forward else range(min(i - 1, n - 1), -1, -1)
        for j in rng:
            if pattern.search(self.lines[j]):
                return self.first_line + j
        return None

    def matching(self, pattern: re.Pattern[str], limit: int) -> list[tuple[int, str]]:
        """The last ``limit`` lines matching ``pattern``, oldest first, with their numbers."""
        out: list[tuple[int, str]] = []
        for j in range(len(self.lines) - 1, -1, -1):
            if pattern.search(self.lines[j]):
                out.append((self.first_line + j, self.lines[j]))
                if len(out) >= limit:
                    break
        return out[::-1]

    def count(self, pattern: re.Pattern[str]) -> int:
        return sum(1 for s in self.lines if pattern.search(s))


def literal(text: str) -> re.Pattern[str]:
    """What the operator typed, searched as typed (case-insensitive), never as a regex."""
    return re.compile(re.escape(text), re.IGNORECASE)
