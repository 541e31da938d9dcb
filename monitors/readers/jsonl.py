"""Read a run's ``events.jsonl`` incrementally, from its first byte (keys: :mod:`stepwatch.monitors.protocol`).

Attaching to a finished 7-hour run means ~10^4-10^5 lines: the reader reads chunks of 64 KiB
(~450 events), splits them on ``\\n`` and parses each line with orjson (the standard library's
``json`` for what orjson refuses or could read differently), and :meth:`EventReader.iter_new`
hands them over a chunk at a time, so a caller folds 100,000 events into its state without ever
holding them all (``bench/attach_events.py`` measures it; no test asserts a time). Then each read
returns only what was appended since.

* A half-written last line (no ``\\n`` yet) waits for its newline.
* A line that is not a JSON object (corrupt, a crash mid-write followed by more lines, invalid
  UTF-8) is counted in :attr:`EventReader.corrupt_lines` and skipped -- never fatal.
* Truncation (size below the read position) or replacement (the path now names another inode, e.g.
  the file was rotated to ``events.<stamp>.jsonl`` on relaunch) restarts from byte 0 of what the path
  names now; :attr:`EventReader.restarts` / :attr:`EventReader.generation` go up and
  :attr:`EventReader.last_restart` says why, so the caller resets what it built from the old file.
  The old file's unread tail is not returned: it belongs to the previous attempt, whose rotated copy
  stays on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from collections.abc import Callable, Iterator

from stepwatch.monitors.runfiles import ignored_once, open_regular, trust_problem

try:  # a declared dependency; the standard library parses alone if it is missing
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - the tests run with orjson installed
    _fast_loads = json.loads

__all__ = ["EventReader", "Restart", "parse_line"]

# orjson reads an integer beyond 64 bits as a float (json keeps it exact), so a chunk with a run of
# 19 or more digits anywhere (such integers, or a float written without exponent to 19+ digits,
# which the emitter's repr() never writes) is parsed by the standard library. The test: map every
# digit to "0" and look for 19 zeros (C speed, ~1.4 ms per MiB measured; a regex was 17 ms).
_DIGITS_TO_ZERO = bytes(0x30 if 0x30 <= i <= 0x39 else i for i in range(256))
_LONG_DIGIT_RUN = b"0" * 19

#: Bytes a read asks for (more while a long line is carried over: see iter_new). Each read's events
#: are handed over as one batch; a batch this small is folded while its objects are still in the
#: CPU's cache: a third less time per event than batches of 1 MiB (measured on a 200 MB file).
_CHUNK = 64 * 1024
#: Bytes a resume hashes per read.
_HASH_CHUNK = 4 * 1024 * 1024
#: A line longer than this (bytes) without a newline is treated as corrupt and skipped when it ends.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Restart:
    """Why the reader started over: ``reason`` ("truncated" | "replaced"), ``at_s`` (unix seconds),
    ``old_offset`` (bytes read from the old file), ``generation`` (the new generation number)."""

    reason: Literal["truncated", "replaced"]
    at_s: float
    old_offset: int
    generation: int


class EventReader:
    """Incremental reader of one JSONL file, followed by path (stat each call, like ``tail -F``).

    Args:
        path: the file (e.g. ``<run_dir>/events.jsonl``); it need not exist yet.
        max_line_bytes: a line longer than this is not buffered whole: it is skipped and counted
            corrupt (an events line is ~150 bytes).
        digest: keep a SHA-256 of every byte read from the current file, for :meth:`position`
            (the supervisor's saved state names the exact bytes it was built from).
        trust_uid: a reader that acts on what it reads (the owner's watchers reading alerts.jsonl): a file that
            fails the trust rule for that uid (``runfiles.trust_problem``: the owner's, writable by no group or
            other, one link; checked on the descriptor before each read) reads as empty from then on, said once.

    Attributes:
        corrupt_lines: lines skipped because they were not a JSON object.
        lines_read: complete non-blank lines seen (good + corrupt), this generation.
        bytes_read: bytes read, all generations.
        offset: byte offset of the next read in the current file.
        generation: 0 for the first file, +1 on each restart.
        restarts: how many restarts.
        last_restart: the latest :class:`Restart`, None if none.
        restarted: True when the LAST ``read_new()`` restarted (events it returned are from the new
            file only).
        exists: whether the path existed at the last read.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, digest: bool = False,
        trust_uid: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.trust_uid = trust_uid
        #: the file this reader holds failed the trust rule: nothing more is read from it (a line appended
        #: while the group could write it is not believed later either)
        self.untrusted = False
        self.max_line_bytes = max_line_bytes
        self._digest = hashlib.sha256() if digest else None
        self.corrupt_lines = 0
        self.lines_read = 0
        self.bytes_read = 0
        self.offset = 0
        self.generation = 0
        self.restarts = 0
        self.last_restart: Restart | None = None
        self.restarted = False
        self.exists = False
        self._fd: int | None = None
        self._id: tuple[int, int] | None = None
        self._carry = b""
        self._skipping_long = False

    def read_new(self) -> list[dict[str, Any]]:
        """Return the JSON objects of every complete line appended since the last call, in order.

        Never raises for a missing, truncated, replaced or corrupt file. Raises PermissionError only
        if the file exists and cannot be opened (a caller must say that, not hide it).
        """
        out: list[dict[str, Any]] = []
        for batch in self.iter_new():
            out.extend(batch)
        return out

    def iter_new(self, decode: Callable[[bytes], list[Any] | None] | None = None) -> Iterator[list[Any]]:
        """:meth:`read_new` a chunk (64 KiB, ~450 events) at a time: yields non-empty lists of the
        JSON objects of complete lines, in file order, until the end of what is written now.

        ``decode``: a reading of a chunk's complete lines (their bytes, ending with a newline) that is
        the same as this reader's, line for line, or None where it is not sure: what it returns is
        yielded instead of the dicts (``monitors/fold/records.py``: the emitter's records, typed).

        The file position moves as each chunk is read: a caller that stops early continues from
        there at its next call. Errors as :meth:`read_new`.
        """
        self.restarted = False
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            self.exists = False
            return
        self.exists = True
        if self._fd is not None:
            if (st.st_dev, st.st_ino) != self._id:
                self._restart("replaced")
            elif st.st_size < self.offset:
                self._restart("truncated")
        if self._fd is None:
            try:
                fd = open_regular(self.path)
            except FileNotFoundError:
                return
            if fd is None:
                return  # a FIFO, a device or a directory in its place: nothing to read, never a hang
            fst = os.fstat(fd)
            self._fd = fd
            self._id = (fst.st_dev, fst.st_ino)
            self.offset = 0
            self.untrusted = False
        if self.trust_uid is not None and not self.untrusted:
            why = trust_problem(os.fstat(self._fd), str(self.path), self.trust_uid)
            if why is not None:
                self.untrusted = True
                ignored_once(self.path, why)
        if self.untrusted:
            return
        while self._fd is not None:
            # at least as much as the carried-over part of a long line: the bytes copied to join
            # it stay proportional to its length (a 16 MiB line in 64 KiB reads would be copied 256 times)
            size = max(_CHUNK, len(self._carry))
            data = os.pread(self._fd, size, self.offset)
            if not data:
                break
            self.offset += len(data)
            self.bytes_read += len(data)
            if self._digest is not None:
                self._digest.update(data)
            out = self._parse(data, decode)
            if out:
                yield out
            if len(data) < size:
                break

    def position(self) -> dict[str, Any]:
        """Where the reader stands, for :meth:`resume`: ``offset`` (bytes read), ``sha256`` (hex
        digest of those bytes; needs ``digest=True``, else ValueError), ``carry`` (the bytes of a
        half-written last line, as latin-1 text), ``skipping_long``, ``lines_read``, ``corrupt_lines``."""
        if self._digest is None:
            raise ValueError("position() needs an EventReader made with digest=True")
        return {"offset": self.offset, "sha256": self._digest.hexdigest(), "carry": self._carry.decode("latin-1"),
                "skipping_long": self._skipping_long, "lines_read": self.lines_read,
                "corrupt_lines": self.corrupt_lines}

    def resume(self, pos: dict[str, Any]) -> str | None:
        """Continue where another reader of the same bytes stood (its :meth:`position`): the file the
        path names now must start with exactly the ``offset`` bytes whose SHA-256 ``pos`` holds.
        Reads those bytes once (hashing, not parsing: ~20 ms for 15 MB) instead of parsing them.

        Returns None when resumed (the next read returns what follows), else why not, in words;
        the reader is then unchanged. Only a reader that has read nothing may resume (ValueError).
        """
        if self._fd is not None or self.offset or self.generation:
            raise ValueError("only a reader that has read nothing can resume")
        try:
            offset, want = pos["offset"], pos["sha256"]
            carry = pos["carry"].encode("latin-1")
            skipping, lines, corrupt = pos["skipping_long"], pos["lines_read"], pos["corrupt_lines"]
        except (KeyError, TypeError, AttributeError, UnicodeEncodeError):
            return "the saved position is malformed"
        if not (type(offset) is int and offset >= 0 and type(want) is str and type(skipping) is bool
                and type(lines) is int and lines >= 0 and type(corrupt) is int and corrupt >= 0
                and len(carry) <= offset):
            return "the saved position is malformed"
        try:
            fd = open_regular(self.path)
        except OSError as e:
            return f"{self.path.name} cannot be opened: {e.strerror or e}"
        if fd is None:
            return f"{self.path.name} is not a regular file"
        ok = False
        try:
            fst = os.fstat(fd)
            if fst.st_size < offset:
                return f"{self.path.name} is shorter ({fst.st_size} bytes) than the saved state's {offset}"
            h = hashlib.sha256()
            at = 0
            while at < offset:
                data = os.pread(fd, min(_HASH_CHUNK, offset - at), at)
                if not data:
                    return f"{self.path.name} ended at byte {at} while hashing {offset}"
                h.update(data)
                at += len(data)
            if h.hexdigest() != want:
                return f"the first {offset} bytes of {self.path.name} are not those the saved state was built from"
            ok = True
        except OSError as e:
            return f"{self.path.name} could not be read: {e.strerror or e}"
        finally:
            if not ok:
                os.close(fd)
        self._fd, self._id = fd, (fst.st_dev, fst.st_ino)
        self.exists = True
        self.offset = self.bytes_read = offset
        self._carry, self._skipping_long = carry, skipping
        self.lines_read, self.corrupt_lines = lines, corrupt
        if self._digest is not None:
            self._digest = h
        return None

    def close(self) -> None:
        """Close the file descriptor (a later read_new() reopens and restarts from byte 0)."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None
        self._id = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        # an observer dropped without close() (a run gone from a list, a new attempt) must not
        # leave its descriptor open for the life of the process
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> EventReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _restart(self, reason: Literal["truncated", "replaced"]) -> None:
        old = self.offset
        if reason == "replaced":
            self.close()
        self.offset = 0
        self._carry = b""
        self._skipping_long = False
        self.lines_read = 0
        if self._digest is not None:
            self._digest = hashlib.sha256()
        self.generation += 1
        self.restarts += 1
        self.restarted = True
        self.last_restart = Restart(reason, time.time(), old, self.generation)

    def _parse(self, data: bytes, decode: Callable[[bytes], list[Any] | None] | None) -> list[Any]:
        """The objects of ``data``'s complete lines (or what ``decode`` made of them)."""
        out: list[Any] = []
        if self._carry:
            data = self._carry + data
            self._carry = b""
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            self._hold(data)
            return out
        body, rest = data[: last_nl + 1], data[last_nl + 1 :]
        if decode is not None and not self._skipping_long and len(body) <= self.max_line_bytes:
            decoded = decode(body)
            if decoded is not None:
                self.lines_read += len(decoded)
                self._hold(rest)
                return decoded
        lines = body.split(b"\n")
        lines.pop()  # after the final '\n'
        if self._skipping_long:
            # the first line is the end of an over-long line already counted corrupt
            lines = lines[1:]
            self._skipping_long = False
        long_digits = _LONG_DIGIT_RUN in body.translate(_DIGITS_TO_ZERO)
        if lines and not long_digits and len(body) <= self.max_line_bytes:
            # the common read: every line an object orjson reads (so none blank, none over the limit), in one map
            try:
                objs = list(map(_fast_loads, lines))
            except (ValueError, RecursionError):
                objs = None
            if objs is not None and set(map(type, objs)) == {dict}:
                self.lines_read += len(lines)
                out.extend(objs)
                self._hold(rest)
                return out
        lines = [ln for ln in lines if ln and not ln.isspace()]
        if not lines:
            self._hold(rest)
            return out
        self.lines_read += len(lines)
        corrupt = 0
        if len(body) > self.max_line_bytes:
            # a line over the limit is corrupt wherever the reads split it (a body this long
            # holds a carried-over line, or the limit is below the read size)
            n = len(lines)
            lines = [ln for ln in lines if len(ln) <= self.max_line_bytes]
            corrupt = n - len(lines)
        # Each line on its own (joining the lines into one JSON array would be no faster with
        # orjson, and two corrupt lines can join into valid values)
        append = out.append
        for line in lines:
            obj = parse_line(line)
            if type(obj) is dict:
                append(obj)
            else:
                corrupt += 1
        self.corrupt_lines += corrupt
        self._hold(rest)
        return out

    def _hold(self, rest: bytes) -> None:
        if self._skipping_long:
            return
        if len(rest) > self.max_line_bytes:
            self.corrupt_lines += 1
            self.lines_read += 1
            self._skipping_long = True
            self._carry = b""
        else:
            self._carry = rest


def parse_line(line: bytes) -> Any:
    """One line as this reader reads it, None when it is not JSON: orjson's reading, json's where orjson may
    differ (a run of 19+ digits: decided per line, so how a line reads never depends on which lines share its
    read) or refuses."""
    try:
        if _LONG_DIGIT_RUN in line.translate(_DIGITS_TO_ZERO):
            return json.loads(line)
        return _fast_loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are ValueErrors
        return _loads_line(line)
    except RecursionError:  # nested deeper than json's recursion allows
        return None


def _loads_line(line: bytes) -> Any:
    """The standard library's reading of a line orjson refused, or None when it is not JSON.

    The standard library is the definition (the emitter writes with ``json``, which also reads
    ``NaN`` / ``Infinity``, ``1e400``, a lone surrogate escape and a UTF-8 BOM, all of which orjson
    rejects), so what a line means never depends on orjson. A line nested deeper than json's
    recursion allows is not JSON here either.
    """
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None
