"""The log panel: the tail of train.log, tracebacks highlighted, scrollable, updated in batches.

Writing every line as it arrives repaints the whole panel each time (a Textual ``Log`` fed 10
lines/s wrote 50-100 KB/s to the terminal, measured-floors.md section 1); the app hands this panel
one batch per refresh instead, and the scrollbars are hidden (``scrollbar-size: 0 0``).
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import RichLog

from stepwatch.tui.safe import visible

_ERROR_RE = re.compile(r"Traceback \(most recent call last\)|^\s+File \"|Error\b|Exception\b|^\w+Error:")


def styled(line: str) -> Text:
    """A log line as Rich text: traceback and error lines in red, dynamo warnings in yellow."""
    line = visible(line)  # a log line's bytes never reach the terminal as control
    if _ERROR_RE.search(line):
        return Text(line, "red")
    if "recompile_limit" in line or "[__recompiles]" in line:
        return Text(line, "yellow")
    return Text(line)


class LogPanel(RichLog):
    """A RichLog that takes lines in batches and can be cleared on rotation."""

    def add_lines(self, lines: list[str], reset: bool = False) -> None:
        if reset:
            self.clear()
        for line in lines:
            self.write(styled(line[:2000]), scroll_end=False)
        if lines and self.auto_scroll:
            self.scroll_end(animate=False, immediate=True)  # one scroll (one repaint) per batch
