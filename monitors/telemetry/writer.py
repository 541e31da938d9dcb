"""The emitter's events file: appends to an ``O_APPEND`` descriptor, step lines written by time.

:class:`EventFileWriter` is the half of :class:`stepwatch.telemetry.core.StepTelemetry` that owns the
file: step lines wait in a buffer and are written in one ``os.write`` once FLUSH_EVERY_S passed since
the last write (or FLUSH_MAX_LINES wait); any other event writes the buffer first, in order; a daemon
thread writes what the last step left within FLUSH_EVERY_S (a hang right after a step still shows
it); ``flush()`` / ``close()`` and interpreter exit write the rest. A SIGKILL loses at most the last
FLUSH_EVERY_S of steps. A forked child never writes the parent's buffered lines. An ``OSError``
disables writing (counted in ``dropped_events``, one line on stderr); a full disk only pauses it (tried
again every RETRY_FULL_S). The file is never opened through a symlink and kept only when it is a regular file of this user (ARCHITECTURE.md R16); a
refusal disables writing the same way. Standard library only.
"""

from __future__ import annotations

import atexit
import errno
import math
import os
import stat
import sys
import threading
import time

_PREFIX = "stepwatch telemetry: "
#: A full file system (ENOSPC, EDQUOT) pauses writing, tried again this often (seconds): the events resume
#: when space returns. Any other error, and a refused file, stop writing for good.
RETRY_FULL_S = 2.0
_FULL = (errno.ENOSPC, errno.EDQUOT)
#: Step lines are written at most this often (seconds): one write for all steps in the window.
FLUSH_EVERY_S = 0.05
#: ... or once this many wait (a very fast loop's buffer stays small).
FLUSH_MAX_LINES = 1024


class RefusedFile(OSError):
    """The events file's path holds something this process must not append to (its message says
    what: a symlink, not a regular file, another user's file, a file with other names)."""


def _not_ours(st: os.stat_result) -> str | None:
    """Why an opened events file is not one to append to, or None: it must be a regular file of this
    process's effective user with no other name (a hard link made in a shared run dir)."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    euid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid != euid:
        return f"it belongs to uid {st.st_uid}, not to this process's uid {euid}"
    if st.st_nlink > 1:
        return f"it has {st.st_nlink} hard links (another name leads to it)"
    return None


def _is_symlink(path: str | None) -> bool:
    try:
        return path is not None and stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def warn(msg: str) -> None:
    """One line on stderr; never raises (stderr may be closed)."""
    try:
        sys.stderr.write(_PREFIX + msg + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass


class EventFileWriter:
    """The events file of one emitter (``self.path``; None: nothing is written)."""

    path: str | None

    def _init_writer(self) -> None:
        self._lock = threading.Lock()
        self.dropped_events = 0
        #: Why writing stopped ("[Errno 28] No space left on device: ..."), or None.
        self.disabled_reason: str | None = None
        self._buf: list[str] = []  # step lines not yet written (FLUSH_EVERY_S)
        self._flushed_at = -math.inf  # time.monotonic() of the last write
        self._buf_pid = os.getpid()  # a forked child never writes the parent's buffered lines
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._fd: int | None = None
        self._disabled = False
        self._retry_at: float | None = None  # time.monotonic() a write paused by a full disk is tried again
        self._retrying = False
        self._partial_line = False
        self._warned_disable = False

    def flush(self) -> None:
        """Write the buffered step lines now (they are written within FLUSH_EVERY_S anyway). Never raises."""
        with self._lock:
            self._flush_locked()


    def _open(self) -> None:
        """Open the events file for appending, never through a symlink, and keep the descriptor only
        when it is a regular file of this user with one name (checked on the descriptor itself): in a
        group-writable run dir another member's symlink, FIFO or file in its place must never make the
        job append to something it did not create (ARCHITECTURE.md R16). Raises OSError; a refusal is
        a :class:`RefusedFile` (the descriptor closed)."""
        path = self.path
        flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO: ENXIO, never a hang
                 | getattr(os, "O_CLOEXEC", 0))
        try:
            fd = os.open(path, flags, 0o644)  # type: ignore[arg-type]
        except OSError as e:
            if e.errno == errno.ELOOP and _is_symlink(path):  # (not a loop among the directories above it)
                raise RefusedFile("it is a symlink (never followed)") from None
            if e.errno == errno.ENXIO:  # a FIFO nobody reads (or a device without one)
                raise RefusedFile("it is not a regular file") from None
            raise
        try:
            why = _not_ours(os.fstat(fd))
            if why is None:
                os.set_blocking(fd, True)
                self._fd = fd
                return
        except OSError:
            os.close(fd)
            raise
        os.close(fd)
        raise RefusedFile(why)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _emit_line(self, line: str) -> bool:
        """Buffer a step ``line`` (one event, already serialised, ASCII); write the buffer when
        FLUSH_EVERY_S passed since the last write, else let the flusher thread write it."""
        with self._lock:
            if not self._writable_locked():
                self.dropped_events += 1
                return False
            self._buf.append(line)
            now = time.monotonic()
            if now - self._flushed_at >= FLUSH_EVERY_S or len(self._buf) >= FLUSH_MAX_LINES:
                return self._flush_locked(now)
            if len(self._buf) == 1:
                self._arm_flusher()
            return True

    def _take_buffer(self) -> bytes:
        lines, self._buf = self._buf, []
        if os.getpid() != self._buf_pid:  # a fork's copy of the parent's buffer: the parent writes them
            self._buf_pid = os.getpid()
            return b""
        return ("\n".join(lines) + "\n").encode("utf-8")

    def _flush_locked(self, now: float | None = None) -> bool:
        if not self._buf:
            return True
        data = self._take_buffer()
        self._flushed_at = time.monotonic() if now is None else now
        if not data:
            return True
        return self._write_locked(data)

    def _arm_flusher(self) -> None:
        """Wake (or start) the daemon thread that writes a buffer the next step does not."""
        if self._flusher is None or not self._flusher.is_alive() or os.getpid() != self._buf_pid:
            self._buf_pid = os.getpid()
            self._flusher = threading.Thread(target=self._flush_loop, name="stepwatch-events-flush", daemon=True)
            self._flusher.start()
            atexit.register(self.flush)
        self._wake.set()

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(FLUSH_EVERY_S)
            with self._lock:
                self._wake.clear()
                try:
                    self._flush_locked()
                except Exception:  # noqa: BLE001 - never raises into anything; the next write retries
                    pass

    def _write_locked(self, data: bytes) -> bool:
        """The write of :meth:`_emit` (the lock held): whole lines, one ``os.write``, never raises. On a
        failure the lines not written whole are counted in ``dropped_events``."""
        lines = data.count(b"\n")
        prefix = b"\n" if self._partial_line else b""  # ends the line a failed write left half-written
        data = prefix + data
        done = 0
        try:
            if self._fd is None:
                self._open()
            n = os.write(self._fd, data)  # type: ignore[arg-type]
            done = n
            if n != len(data):  # a short write: the rest, one write at a time
                view = memoryview(data)
                while view:
                    if n <= 0:
                        raise OSError(errno.EIO, "short write")
                    if n < len(view):
                        self._partial_line = True
                    view = view[n:]
                    if view:
                        n = os.write(self._fd, view)  # type: ignore[arg-type]
                        done += n
            self._partial_line = False
            if self._retrying:
                self._retrying = False
                warn(f"writing events to {self.path} again ({self.dropped_events} dropped while it was full)")
            return True
        except OSError as e:
            written = max(0, data[:done].count(b"\n") - len(prefix))  # whole lines of this write that went out
            self.dropped_events += lines - written
            self._disable(e)
            return False

    def _disable(self, e: OSError) -> None:
        self._disabled, self._retrying = True, False
        refused = isinstance(e, RefusedFile)
        full = not refused and e.errno in _FULL
        self._retry_at = time.monotonic() + RETRY_FULL_S if full else None
        said = f"not writing events to {self.path}: {e}" if refused else f"cannot write {self.path}: {e}"
        self.disabled_reason = said if refused else str(e)
        self._close_fd()
        if not self._warned_disable:
            self._warned_disable = True
            warn(f"{said}; " + (f"events are counted as dropped and written again once there is room (tried every "
                                 f"{RETRY_FULL_S:g} s; training continues)" if full else
                                 "telemetry disabled, further events are counted as dropped (training continues)"))

    def _writable_locked(self) -> bool:
        """Whether to write now: not disabled, or paused by a full disk whose time to try again has come (a
        failure pauses it again)."""
        if not self._disabled:
            return True
        if self._retry_at is None or time.monotonic() < self._retry_at:
            return False
        self._disabled = False
        self._retrying = True  # said once the write goes through
        return True

    def _write_after_buffer(self, data: bytes) -> bool:
        """Write ``data`` (an event that is not a step; the lock held) after the buffered steps, one write."""
        if self._buf:  # the steps before it first: the file stays in event order
            data = self._take_buffer() + data
        return self._write_locked(data)
