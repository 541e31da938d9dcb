"""Change notice for a run dir: watchfiles (inotify) wake-ups, with a tick and a polling fallback.

The DIRECTORY is watched, never the file: a watch on a renamed file goes quiet. Where notifications
cannot be had (inotify missing, watch limit exhausted, a network file system that never notifies)
it falls back to ticking every ``tick_s`` (<= 1 s), said once. watchfiles' own ``force_polling`` is
never used: it compares mtimes in whole seconds and was measured to lose appends at a file's end.

The content always comes from plain reads (:class:`~stepwatch.monitors.readers.textlog.LogFollower`
stats the path each poll); a notice only says "look now", so a missed one costs at most a tick.
Measured here: ~16 ms from a write to the notice with ``debounce=50, step=10`` (median 15.6 ms, p99
20.6 ms over 100 appends; the defaults gave 75.7 / 99.1 ms; 2026-11-30, the 2-core development VM).
:func:`follow` is the loop the supervisor's log follow runs.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from collections.abc import AsyncIterator, Callable, Collection, Iterator

from stepwatch.monitors.readers.textlog import LogFollower, Segment


class _Event(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Notice:
    """One wake-up of a :class:`ChangeNotifier`.

    Attributes:
        source: ``"watchfiles"`` (the directory changed), ``"tick"`` (nothing changed for ``tick_s``:
            poll anyway -- the core poll is the ground truth) or ``"poll"`` (fallback mode tick).
        paths: the changed paths watchfiles reported (empty for ticks).
    """

    source: Literal["watchfiles", "tick", "poll"]
    paths: frozenset[str] = field(default_factory=frozenset)


class ChangeNotifier:
    """Wake up when a directory changes (watchfiles), or at least every ``tick_s`` seconds.

    Iterate it (``for notice in ChangeNotifier(run_dir, stop_event=ev): follower.poll()``) or use
    :meth:`aiter` from asyncio (the TUI). It watches the DIRECTORY, not a file, non-recursively, with
    ``debounce=50 ms, step=10 ms``. It yields at least every ``tick_s`` even when nothing changed, so
    a caller that polls on every notice never depends on a notification arriving.

    Fallback: when watchfiles cannot watch (no inotify, ``fs.inotify.max_user_watches`` exhausted --
    an ``OSError`` or ``WatchfilesRustInternalError`` -- or the directory is missing) it switches to
    plain ticking every ``tick_s`` and says so ONCE: :attr:`fallback_reason` is set and ``on_notice``
    (if given) is called with the message. ``force_poll=True`` starts in that mode.

    Args:
        directory: the directory to watch (e.g. the run dir).
        names: basenames to wake for (e.g. ``{"train.log"}``); None wakes for any change.
        stop_event: anything with ``is_set()`` (``threading.Event``; ``asyncio.Event`` for aiter);
            iteration ends soon after it is set (within ``step_ms`` / ``tick_s``).
        tick_s: the longest wait between notices, seconds; clamped to (0, 1].
        debounce_ms, step_ms: passed to ``watchfiles.watch`` (milliseconds).
        on_notice: called with the one fallback message.

    Attributes:
        mode: ``"watchfiles"`` or ``"polling"``.
        fallback_reason: the message, or None while watchfiles works.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        names: Collection[str] | None = None,
        stop_event: _Event | None = None,
        tick_s: float = 1.0,
        debounce_ms: int = 50,
        step_ms: int = 10,
        force_poll: bool = False,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.names = frozenset(names) if names is not None else None
        self.stop_event = stop_event
        self.tick_s = min(max(tick_s, 0.01), 1.0)
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.on_notice = on_notice
        self.mode: Literal["watchfiles", "polling"] = "polling" if force_poll else "watchfiles"
        self.fallback_reason: str | None = "polling requested (force_poll=True)" if force_poll else None

    def _stopped(self) -> bool:
        return self.stop_event is not None and self.stop_event.is_set()

    def _filter(self) -> Callable[[object, str], bool] | None:
        if self.names is None:
            return None
        names = self.names
        return lambda _change, path: os.path.basename(path) in names

    def _fall_back(self, err: BaseException) -> None:
        self.mode = "polling"
        kind = type(err).__name__
        detail = str(err) or kind
        if "limit" in detail.lower() or getattr(err, "errno", None) == 28:
            hint = " (inotify watch limit exhausted? see fs.inotify.max_user_watches)"
        else:
            hint = ""
        self.fallback_reason = (
            f"file-change notice unavailable for {self.directory}: {kind}: {detail}{hint}; "
            f"polling every {self.tick_s:g} s instead"
        )
        if self.on_notice is not None:
            self.on_notice(self.fallback_reason)

    def _watch_args(self) -> dict[str, Any]:
        """What ``watchfiles.watch`` / ``awatch`` are given: this directory only, our filter, a tick
        every ``tick_s`` even without changes, native notifications only (a failure falls back to
        our own size/inode polling, never to watchfiles' mtime polling)."""
        return {
            "watch_filter": self._filter(),
            "debounce": self.debounce_ms,
            "step": self.step_ms,
            "stop_event": self.stop_event,
            "rust_timeout": int(self.tick_s * 1000),
            "yield_on_timeout": True,
            "recursive": False,
            "force_polling": False,
        }

    def __iter__(self) -> Iterator[Notice]:
        if self.mode == "watchfiles":
            try:
                import watchfiles

                for changes in watchfiles.watch(self.directory, raise_interrupt=True, **self._watch_args()):
                    yield _notice(changes)
                    if self._stopped():
                        return
                return  # stop_event set
            except (OSError, RuntimeError, ImportError) as e:
                self._fall_back(e)
        wait = getattr(self.stop_event, "wait", None)
        while not self._stopped():
            if callable(wait) and isinstance(self.stop_event, threading.Event):
                if wait(self.tick_s):
                    return
            else:
                time.sleep(self.tick_s)
                if self._stopped():
                    return
            yield Notice("poll")

    async def aiter(self) -> AsyncIterator[Notice]:
        """The asyncio version of iteration (``async for n in notifier.aiter()``).

        ``stop_event`` should be an ``asyncio.Event`` (or anything with ``is_set()``).
        """
        if self.mode == "watchfiles":
            try:
                import watchfiles

                async for changes in watchfiles.awatch(self.directory, **self._watch_args()):
                    yield _notice(changes)
                    if self._stopped():
                        return
                return
            except (OSError, RuntimeError, ImportError) as e:
                self._fall_back(e)
        while not self._stopped():
            await asyncio.sleep(self.tick_s)
            if self._stopped():
                return
            yield Notice("poll")


def _notice(changes: set[tuple[Any, str]]) -> Notice:
    """A watchfiles batch as a :class:`Notice` (an empty one: the tick of ``yield_on_timeout``)."""
    return Notice("watchfiles", frozenset(p for _c, p in changes)) if changes else Notice("tick")


def follow(
    follower: LogFollower,
    *,
    stop_event: _Event | None = None,
    notifier: ChangeNotifier | None = None,
) -> Iterator[list[Segment]]:
    """Poll ``follower`` once now and again on every notice; yield each poll's segments.

    Yields a list (possibly empty: a tick with nothing new) at least every ``notifier.tick_s``
    seconds, so the caller can refresh "last byte N s ago". When a poll stopped at its byte budget
    (``follower.behind``) it polls again at once. Ends when ``stop_event`` is set.
    """
    if notifier is None:
        notifier = ChangeNotifier(follower.path.parent, names={follower.path.name}, stop_event=stop_event)
    batch = follower.poll()
    while follower.behind:
        yield batch
        batch = follower.poll()
    yield batch
    for _notice in notifier:
        batch = follower.poll()
        while follower.behind:
            yield batch
            batch = follower.poll()
        yield batch
