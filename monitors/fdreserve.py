"""Descriptors held back for what must happen with every other one taken: exit.json and alert delivery first.

A process that runs out of descriptors (EMFILE: its own limit; ENFILE: the system's) cannot open the
file its exit record goes to, the pipe an ``[alerts] command`` needs or the socket a push needs. The
supervisor holds :data:`RESERVE_FDS` descriptors (``/dev/null``, close-on-exec) from its start
(:func:`hold`); :func:`room` gives enough of them back, right before such a write, for the write to
get the descriptors it needs, and takes them again afterwards (as far as it can). Whatever took the
others (a leak, a limit set too low, connections) the last records still go out. ARCHITECTURE.md R19.

Standard library only; one reserve per process (the supervisor's threads share it).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Descriptors held back: an exit record (a temporary file and its directory), an ``[alerts] command``
#: (its stderr pipe and the exec-error pipe, two descriptors each, and /dev/null) and a push (a socket or two) at the same time.
RESERVE_FDS = 16
_SHORT = (errno.EMFILE, errno.ENFILE)

_lock = threading.Lock()
_held: list[int] = []
_wanted = 0
_rooms = 0  # blocks inside room() now: what they were given is theirs until the last one leaves
_lent = 0  # the descriptors those blocks asked for, in all


def _forked() -> None:
    """In a forked child only the forking thread goes on: the blocks other threads were inside are not its
    own (their descriptors come back at the next :func:`refill`), and the lock may have been held by one."""
    global _lock, _rooms, _lent
    _lock, _rooms, _lent = threading.Lock(), 0, 0


os.register_at_fork(after_in_child=_forked)


def _open_one() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def hold(n: int = RESERVE_FDS) -> int:
    """Hold ``n`` descriptors back from now on (the supervisor, at its start); returns how many it could."""
    global _wanted
    with _lock:
        _wanted = n
        while len(_held) < n and (fd := _open_one()) is not None:
            _held.append(fd)
        return len(_held)


def held() -> int:
    """How many descriptors the reserve holds now."""
    with _lock:
        return len(_held)


def _free_now(need: int) -> int:
    """How many of ``need`` descriptors this process could open now (each opened and closed at once)."""
    probes: list[int] = []
    try:
        while len(probes) < need and (fd := _open_one()) is not None:
            probes.append(fd)
        return len(probes)
    finally:
        for fd in probes:
            os.close(fd)


@contextmanager
def room(need: int = 8) -> Iterator[None]:
    """Make sure ``need`` descriptors can be opened inside the block, beside what the blocks inside already
    asked for (deliveries run side by side): when fewer are free, give back as many held ones as are
    missing (all of them at most), and take them again once no block is inside, as far as descriptors are
    free then. Costs a few opens of /dev/null when nothing is short."""
    global _rooms, _lent
    with _lock:
        if _held:  # what the blocks inside already have is theirs: room for them all
            want = need + _lent
            for _ in range(min(max(want - _free_now(want), 0), len(_held))):
                os.close(_held.pop())
        _rooms += 1
        _lent += need
    try:
        yield
    finally:
        with _lock:
            _rooms -= 1
            _lent -= need
        refill()


def refill() -> bool:
    """Take back the descriptors the reserve gave, as far as any are free (a no-op when it is full, and
    while a block inside :func:`room` may still need them); whether it is full now."""
    with _lock:
        while not _rooms and len(_held) < _wanted and (fd := _open_one()) is not None:
            _held.append(fd)
        return len(_held) >= _wanted


def is_short(e: BaseException) -> bool:
    """Whether ``e`` says the process (EMFILE) or the system (ENFILE) is out of descriptors."""
    return isinstance(e, OSError) and e.errno in _SHORT
