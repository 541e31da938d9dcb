"""The log panel: the tail of train.log, tracebacks highlighted, scrollable, updated in batches; it
follows the tail unless the operator scrolled up (the title says so), and shows a window of the
whole log around a search match, an error, or the lines a filter keeps.

Writing every line as it arrives repaints the whole panel each time (a Textual ``Log`` fed 10
lines/s wrote 50-100 KB/s to the terminal, measured 2026-11-30 on the 2-core development VM); the app hands this panel
one batch per refresh instead, and the scrollbars are hidden (``scrollbar-size: 0 0``).
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import RichLog

from stepwatch.tui.safe import visible

_ERROR_RE = re.compile(r"Traceback \(most recent call last\)|^\s+File \"|Error\b|Exception\b|^\w+Error:")
#: Lines shown around a match, an error or a filter's hits (the whole log stays in LogLines).
WINDOW_LINES = 400


def styled(line: str) -> Text:
    """A log line as Rich text: traceback and error lines in red, dynamo warnings in yellow."""
    line = visible(line)  # a log line's bytes never reach the terminal as control
    if _ERROR_RE.search(line):
        return Text(line, "red")
    if "recompile_limit" in line or "[__recompiles]" in line:
        return Text(line, "yellow")
    return Text(line)


class LogPanel(RichLog):
    """A RichLog that takes lines in batches and can be cleared on rotation.

    ``mode``: ``tail`` (the newest lines; ``following`` while scrolled to the end) or ``browse``
    (a window of numbered lines from the whole log; new lines wait until the operator follows again).
    ``centre``: the line number a browse window is about (the match, the error), None in tail mode.
    """

    mode = "tail"
    following = True
    centre: int | None = None
    label = ""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.mode == "tail":
            self.following = new_value >= self.max_scroll_y

    def add_lines(self, lines: list[str], reset: bool = False) -> None:
        if self.mode != "tail":
            return  # browsing: the tail is read again when the operator follows
        if reset:
            self.clear()
        for line in lines:
            self.write(styled(line[:2000]), scroll_end=False)
        if lines and self.following:
            self.scroll_end(animate=False, immediate=True)  # one scroll (one repaint) per batch

    def follow(self, tail: list[str]) -> None:
        """Back to the tail (``f`` / End): the newest lines, scrolled to the end."""
        self.mode, self.centre, self.label, self.following = "tail", None, "", True
        self.clear()
        for line in tail:
            self.write(styled(line[:2000]), scroll_end=False)
        self.call_after_refresh(self.scroll_end, animate=False)

    def browse(self, numbered: list[tuple[int, str]], centre: int | None, label: str) -> None:
        """Show ``numbered`` lines (``(line number, text)``), the ``centre`` one marked and in view."""
        self.mode, self.centre, self.label, self.following = "browse", centre, label, False
        self.clear()
        width = len(str(numbered[-1][0])) if numbered else 1
        at = 0
        for i, (no, line) in enumerate(numbered):
            t = Text(f"{no:>{width}} ", "dim") + styled(line[:2000])
            if no == centre:
                t.stylize("reverse")
                at = i
            self.write(t, scroll_end=False)
        self.call_after_refresh(self._show_line, at)

    def _show_line(self, index: int) -> None:
        self.scroll_to(y=max(0, index - self.size.height // 2), animate=False)
