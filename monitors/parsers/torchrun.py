"""torchrun's failure table in train.log: which rank failed, how, with which pid.

When a worker fails, torch.distributed.elastic prints (after ``ChildFailedError``)::

    Failures:
    [1]:
      time      : 2026-12-01_13:47:17
      host      : localhost
      rank      : 0 (local_rank: 0)
      exitcode  : -15 (pid: 27792)  (SIGTERM)
      ...
    Root Cause (first observed failure):
    [0]:
      ...
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 27793)  (SIGKILL)

(captured from torch 2.13's ``torchrun --nproc_per_node 2``, tests/fixtures/real/). A negative
exitcode is the signal that ended the worker. :class:`FailureTable` is fed one line at a time and
keeps every entry it saw, the root cause marked.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from stepwatch.monitors.readers.rankprefix import rank_prefix

_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,6})\s*\(local_rank:\s*(\d{1,6})\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d{1,4})\s*\(pid:\s*(\d{1,10})\)")
_ROOT = "Root Cause (first observed failure)"
_FAILURES = re.compile(r"^\s*Failures:\s*$")
#: At most this many entries are kept (a restarting job prints a table per failure).
MAX_ENTRIES = 256


def signal_name(exitcode: int) -> str | None:
    """``-9`` -> ``SIGKILL``; None for an exit code >= 0 or an unknown signal."""
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class RankFailure:
    """One entry of the table: ``rank``, ``local_rank``, ``exitcode`` (negative: a signal), ``pid``,
    and whether torchrun named it the root cause."""

    rank: int
    local_rank: int
    exitcode: int
    pid: int
    root_cause: bool

    def how(self) -> str:
        """``killed by SIGKILL`` / ``exited with code 1``."""
        sig = signal_name(self.exitcode)
        return f"killed by {sig}" if sig else f"exited with code {self.exitcode}"


class FailureTable:
    """Feed train.log's lines; ``entries`` holds each failure entry of every table whose root cause
    was read, in order. torchrun prints the other failures before the root cause: a table read half
    written (the log caught mid-print) would name a torn-down rank alone, so those entries wait for
    their table's root cause (``pending``)."""

    def __init__(self) -> None:
        self.entries: list[RankFailure] = []
        self.pending: list[RankFailure] = []
        self._in_failures = False  # after a "Failures:" header, until its table's root cause
        self._root_next = False
        self._rank: tuple[int, int] | None = None

    def feed(self, line: str) -> None:
        """One log line (a rank prefix is looked through)."""
        if len(line) > 300:
            return
        _, body = rank_prefix(line)
        if _ROOT in body:
            self._root_next, self._rank = True, None
            return
        if _FAILURES.match(body):
            self._root_next, self._rank, self.pending, self._in_failures = False, None, [], True
            return
        m = _RANK.match(body)
        if m:
            self._rank = (int(m.group(1)), int(m.group(2)))
            return
        m = _EXIT.match(body)
        if m and self._rank is not None and len(self.entries) + len(self.pending) < MAX_ENTRIES:
            entry = RankFailure(self._rank[0], self._rank[1], int(m.group(1)), int(m.group(2)), self._root_next)
            if self._root_next:  # the table is whole: its other failures count now
                self.entries.extend([*self.pending, entry])
                self.pending, self._in_failures = [], False
            elif self._in_failures:
                self.pending.append(entry)
            else:
                self.entries.append(entry)
            self._rank = None

    def by_pid(self) -> dict[int, RankFailure]:
        """The last entry of each pid."""
        return {e.pid: e for e in self.entries}
