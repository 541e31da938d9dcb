"""The alert banner: the newest unacknowledged alert, and how many more, wrapped to at most three lines with its
keys first (``a`` acknowledges, ``d`` shows the details)."""

from __future__ import annotations

import textwrap

from textual.widgets import Static

from stepwatch.monitors.snapshot.types import Alert
from stepwatch.tui.safe import safe_text


#: Lines the banner wraps to at most (styles.tcss #banner max-height); a longer alert is cut there.
BANNER_LINES = 3


class AlertBanner(Static):
    """The alert banner: the newest unacknowledged alert (and how many more), until ``a``."""

    def show(self, alerts: list[Alert]) -> None:
        if not alerts:
            self.display = False
            self._last = None
            return
        newest = alerts[-1]
        more = f"  (+{len(alerts) - 1} more)" if len(alerts) > 1 else ""
        cleared = "" if newest["active"] else " (cleared)"  # e.g. a stall the stop ended
        head = f" [a] acknowledge · [d] details · ALERT {newest['kind']}{cleared}: "  # the keys first: never cut
        words = newest["message"].split(" ")
        width = max(40, (self.size.width or 80) - 2)
        text = f"{head}{newest['message']}{more} "
        while len(textwrap.wrap(text, width)) > BANNER_LINES and len(words) > 1:  # the whole text: one key away
            words = words[:max(1, len(words) * 4 // 5)]
            text = f"{head}{' '.join(words)} …{more} "
        if len(textwrap.wrap(text, width)) > BANNER_LINES:  # one word longer than the banner (a path, a repr)
            room = max(8, width * (BANNER_LINES - 1) - len(head) - len(more) - 4)
            text = f"{head}{words[0][:room]} …{more} "
        if text != getattr(self, "_last", None):
            self._last = text
            self.update(safe_text(text))
        self.display = True
