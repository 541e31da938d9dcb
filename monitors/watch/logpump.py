"""The child's output into train.log through a pipe: a full disk costs log lines, never the run.

The training command's stdout and stderr are the write end of a pipe. :class:`LogPump`, a thread of
the supervisor (of its warden once the supervisor is gone: :mod:`.warden`), reads each chunk as it
arrives and appends it to train.log unchanged (never through a symlink). A write the file system
refuses (ENOSPC, a quota, EIO) costs that chunk: its bytes are counted (``lost_bytes``, with the
first error's words), reading goes on, so the child never blocks and never sees an error, and the
next chunk tries again: the log resumes the moment space returns. The count goes into exit.json.

With the file as the child's stdout (as before), a program that prints died of its first ENOSPC.
The cost: the bytes pass through one more read and write (microseconds). The pipe's read end is shared
(one open file description) with the supervisor's warden and keeper, which pump it while the supervisor is
held stopped or gone (:mod:`.warden`): it is non-blocking, each pump waits in ``poll`` and reads only what is
there, and a warden's pump reads only while its ``gate`` says so (checked right before each read), so two
pumps never wait in ``read`` at once. A child dies of SIGPIPE only once the supervisor, the warden and the
keeper are all gone.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path
from collections.abc import Callable

from stepwatch.monitors.runfiles import open_append

#: Bytes read from the pipe at once: the pipe's own capacity on Linux (64 KiB), so a chatty child
#: is drained in one read per fill.
CHUNK_BYTES = 65536
#: How often a gated pump asks its gate again while it says no, and the longest wait in ``poll`` (s).
GATE_POLL_S = 0.1
#: After the command ended, how long the pump may take to read what is still in the pipe (a
#: surviving worker that holds the pipe open never ends it; the record is written after this).
DRAIN_S = 5.0


class LogPump:
    """Copies ``read_fd`` (the pipe's read end) to ``path`` until every writer closed the pipe."""

    def __init__(self, read_fd: int, path: Path, log: Callable[[str], None] = lambda m: None,
                 gate: Callable[[], bool] | None = None):
        """``gate``: read only while it returns True (a warden's pump: while the supervisor is held stopped or
        gone); None: always."""
        self.read_fd, self.path, self.log, self.gate = read_fd, path, log, gate
        os.set_blocking(read_fd, False)  # a pump waits in poll, never in read: another may take what is there
        self.lost_bytes = 0
        self.lost_reason: str | None = None
        self.bytes_written = 0
        self.done = threading.Event()  # every writer closed the pipe and its bytes are in the file
        self._out: int | None = None
        self._lost_at: float | None = None

    def start(self) -> LogPump:
        threading.Thread(target=self._run, name="log-pump", daemon=True).start()
        return self

    def drain(self, timeout_s: float = DRAIN_S) -> bool:
        """Wait (at most ``timeout_s``) until the pipe is empty and closed; True when it was."""
        return self.done.wait(timeout_s)

    def _run(self) -> None:
        try:
            poller = select.poll()
            poller.register(self.read_fd, select.POLLIN)
            while True:
                if self.gate is not None and not self.gate():
                    self.done.wait(GATE_POLL_S)  # never set here: a plain sleep that reads no clock
                    continue
                if not poller.poll(GATE_POLL_S * 1000 if self.gate is not None else None):
                    continue
                if self.gate is not None and not self.gate():  # the supervisor resumed while this one waited
                    continue
                try:
                    data = os.read(self.read_fd, CHUNK_BYTES)
                except (InterruptedError, BlockingIOError):  # another pump took what was there
                    continue
                except OSError as e:
                    self.log(f"the run's output can no longer be read: {e}")
                    return
                if not data:
                    return
                self._write(data)
        finally:
            if self._out is not None:
                os.close(self._out)
            os.close(self.read_fd)
            self.done.set()

    def _write(self, data: bytes) -> None:
        view, off = memoryview(data), 0
        try:
            if self._out is None:
                self._out = open_append(self.path)
            while off < len(view):
                off += os.write(self._out, view[off:])
            self.bytes_written += off
            if self._lost_at is not None:
                self.log(f"train.log grows again after {time.time() - self._lost_at:.0f} s; "
                         f"{self.lost_bytes} bytes of the run's output lost in all")
                self._lost_at = None
        except OSError as e:
            self.bytes_written += off
            self.lost_bytes += len(view) - off
            if self.lost_reason is None:
                self.lost_reason = f"{os.strerror(e.errno) if e.errno else e}"
            if self._lost_at is None:
                self._lost_at = time.time()
                self.log(f"train.log cannot grow ({e}); the run goes on, its output is counted and dropped "
                         "until there is room")
