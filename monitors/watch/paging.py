"""What is shown and what wakes someone: the ``[alerts]`` settings that stand between a detector's verdict and a
page. Pure: no I/O, no clock reads (time is passed in); the supervisor's :class:`.loop.AlertRecorder` and
:class:`.delivery.Deliverer` apply it.

- **Shown, then paged.** An alert is shown (alerts.jsonl, every view's banner and ``status``) the moment its
  detector raises it, and paged once it has held for its kind's confirmation window (``confirm_s = { stall =
  120 }``, seconds after it became true, its ``at``). One that clears first never pages: each channel records
  ``not_confirmed``. The defaults are 0 for every kind, because each detector already waits for its own
  confirmation: a death and a non-finite loss at once, a frozen process and a stall at their budget (a busy but
  silent stretch is shown as suspected and never paged before the busy budget), a fallback once its cluster of
  slow steps confirms.
- **Per channel**: ``channel_min_level = { "ntfy://ntfy.sh" = "error" }`` (a channel by the name ``status``
  gives it) overrides ``min_level``; ``finished`` may name the channels that want the finished page.
- **Quiet hours**: ``quiet_hours = "23:00-07:00"`` (the supervisor host's local time): a page below
  ``quiet_min_level`` (default ``error``) is held back and recorded ``quiet_hours``; it is still shown.
- **A storm is a digest**: a channel sends at most ``digest_after`` pages (5) per ``digest_window_s`` (60 s);
  the rest, and those its rate limit held back, are folded into one digest page when the window ends, with
  their count by kind (Alertmanager's grouping: 1,000 alerts in a minute are one message, not 4 and silence).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

LEVELS = ("info", "warning", "error")
DIGEST_AFTER = 5
DIGEST_WINDOW_S = 60.0
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")
_KIND = re.compile(r"^[a-z_]{1,40}$")


@dataclass(frozen=True, slots=True)
class PagingSettings:
    """One run's paging settings (see the module's docstring); ``quiet_hours`` as minutes of the day
    (start, end), an end before the start wrapping past midnight."""

    #: the ``[alerts]`` keys this module reads (monitors/runsettings.py's AlertSettings accepts them)
    KEYS: ClassVar[tuple[str, ...]] = ("confirm_s", "channel_min_level", "quiet_hours", "quiet_min_level",
                                       "digest_after", "digest_window_s")

    confirm_s: Mapping[str, float] = field(default_factory=dict)
    channel_min_level: Mapping[str, str] = field(default_factory=dict)
    quiet_hours: tuple[int, int] | None = None
    quiet_min_level: str = "error"
    digest_after: int = DIGEST_AFTER
    digest_window_s: float = DIGEST_WINDOW_S

    def confirm_window_s(self, kind: str) -> float:
        """Seconds an alert of ``kind`` must hold before it pages (0: at once)."""
        return float(self.confirm_s.get(kind, 0.0))

    def quiet_at(self, minute_of_day: int) -> bool:
        """Whether ``minute_of_day`` (local, 0..1439) falls in the quiet hours."""
        if self.quiet_hours is None:
            return False
        start, end = self.quiet_hours
        return start <= minute_of_day < end if start <= end else (minute_of_day >= start or minute_of_day < end)


def _seconds(key: str, v: Any, hi: float) -> float:
    if type(v) not in (int, float) or not 0 <= v <= hi:
        raise ValueError(f"{key} must be a number of seconds from 0 to {hi:g}; got {v!r}")
    return float(v)


def _level(key: str, v: Any) -> str:
    if v not in LEVELS:
        raise ValueError(f"{key} must be \"info\", \"warning\" or \"error\"; got {v!r}")
    return str(v)


def paging_settings(table: Mapping[str, Any]) -> PagingSettings:
    """The ``[alerts]`` table's paging settings; ValueError naming a bad one."""
    got: dict[str, Any] = {}
    confirm = table.get("confirm_s")
    if confirm is not None:
        if not isinstance(confirm, dict) or not all(isinstance(k, str) and _KIND.match(k) for k in confirm):
            raise ValueError("confirm_s must be a table of alert kinds and seconds, e.g. confirm_s = { stall = 120 }")
        got["confirm_s"] = {k: _seconds(f"confirm_s.{k}", v, 86400) for k, v in confirm.items()}
    chan = table.get("channel_min_level")
    if chan is not None:
        if not isinstance(chan, dict) or not all(isinstance(k, str) for k in chan):
            raise ValueError("channel_min_level must be a table of channel names and levels, "
                             'e.g. channel_min_level = { "ntfy://ntfy.sh" = "error" }')
        got["channel_min_level"] = {k: _level(f"channel_min_level[{k!r}]", v) for k, v in chan.items()}
    quiet = table.get("quiet_hours")
    if quiet is not None:
        m = _HHMM.match(quiet) if isinstance(quiet, str) else None
        if m is None or m.group(1, 2) == m.group(3, 4):
            raise ValueError(f"quiet_hours must be \"HH:MM-HH:MM\" (local time, e.g. \"23:00-07:00\"); got {quiet!r}")
        a, b, c, d = (int(x) for x in m.groups())
        got["quiet_hours"] = (a * 60 + b, c * 60 + d)
    if "quiet_min_level" in table:
        got["quiet_min_level"] = _level("quiet_min_level", table["quiet_min_level"])
    if "digest_after" in table:
        v = table["digest_after"]
        if type(v) is not int or not 1 <= v <= 1000:
            raise ValueError(f"digest_after must be a whole number of pages from 1 to 1000; got {v!r}")
        got["digest_after"] = v
    if "digest_window_s" in table:
        got["digest_window_s"] = _seconds("digest_window_s", table["digest_window_s"], 86400) or DIGEST_WINDOW_S
    return PagingSettings(**got)


def paging_settings_of(table: Any) -> PagingSettings:
    """The paging settings of a run record's ``[alerts]`` table; the defaults where it is absent or invalid (a
    hostile file's value never pages less than the defaults would)."""
    try:
        return paging_settings(table) if isinstance(table, dict) else PagingSettings()
    except ValueError:
        return PagingSettings()


def finished_channels(value: Any) -> bool | frozenset[str]:
    """``[alerts] finished``: True (every channel), False, or the channels (by name) that want the finished page."""
    if isinstance(value, list):
        return frozenset(v for v in value if isinstance(v, str))
    return value is True


def check_finished(value: Any) -> None:
    """ValueError unless ``finished`` is true, false or a list of channel names."""
    if not (isinstance(value, bool) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
        raise ValueError(f"finished must be true, false or a list of channel names; got {value!r}")


#: A digest names at most this many of each kind's alerts (the newest), each cut to DIGEST_WORDS_CHARS.
DIGEST_NAMED = 2
DIGEST_WORDS_CHARS = 60


def digest_words(folded: Sequence[Mapping[str, Any]], window_s: float) -> str:
    """One digest page's message, naming what it holds: ``12 more alerts in 60 s, not paged one by one: straggler 10
    (rank 3 is 41 % slower …; rank 1 …), stall 2 (alive but stuck: no optimizer step for 61 s …); status lists
    each`` — each kind's count with its newest messages (a ``resolved`` says which alert cleared)."""
    by_kind: dict[str, list[str]] = {}
    for a in folded:
        by_kind.setdefault(str(a.get("kind")), []).append(str(a.get("message") or ""))
    def named(msgs: list[str]) -> str:
        cut = [m if len(m) <= DIGEST_WORDS_CHARS else m[:DIGEST_WORDS_CHARS - 1] + "…" for m in msgs[::-1][:DIGEST_NAMED]]
        return " (" + "; ".join(cut) + ("; …" if len(msgs) > DIGEST_NAMED else "") + ")" if any(cut) else ""
    kinds = ", ".join(f"{k} {len(m)}{named(m)}" for k, m in sorted(by_kind.items(), key=lambda kv: (-len(kv[1]), kv[0])))
    total = len(folded)
    return (f"{total} more alert{'s' if total != 1 else ''} in {window_s:g} s, not paged one by one: {kinds}; "
            "status lists each")


def highest_level(levels: list[str]) -> str:
    """The most severe of ``levels`` (``info`` for none)."""
    return max(levels, key=LEVELS.index, default="info")
