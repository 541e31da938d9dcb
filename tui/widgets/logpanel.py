"""The log panel: the tail of train.log, tracebacks highlighted, scrollable, updated in batches; it
follows the tail unless the operator scrolled up (the title says so), and shows a window of the
whole log around a search match, an error, or the lines a filter keeps.

Writing every line as it arrives repaints the whole panel each time (a Textual ``Log`` fed 10
lines/s wrote 50-100 KB/s to the terminal, measured 2026-11-30 on the 2-core development VM); the app hands this panel
one batch per refresh instead, and the scrollbars are hidden (``scrollbar-size: 0 0``).
"""

from __future__ import annotations

import re
from collections import deque

from rich.text import Text
from textual import events
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
    Scrolled up, the panel holds its exact lines: what arrives waits in ``held`` (the log's newest, at most
    ``max_lines``) until the operator follows again, so the lines on screen never shift under the reader.
    ``w`` (:meth:`toggle_wrap`) wraps long lines (a traceback's paths) or cuts them again.
    """

    mode = "tail"
    following = True
    centre: int | None = None
    label = ""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.held: list[str] = []
        self.held_count = 0  # lines that arrived while scrolled up (held is capped; this is not)
        self.held_gap = False  # lines were skipped while scrolled up: following again starts the panel over
        self._texts: deque[Text] = deque(maxlen=self.max_lines)  # what is shown, to draw again wrapped

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.mode == "tail":
            self.following = new_value >= self.max_scroll_y

    def on_resize(self, event: events.Resize) -> None:  # Textual runs RichLog's own handler too (each class's)
        """The panel grew or shrank (``z``, a banner shown or gone, the terminal): a panel that follows still ends
        at the log's last line, on a finished run too, where no new line would bring it back."""
        if self.following and self.mode == "tail":
            self.call_after_refresh(self.scroll_end, animate=False)

    def _put(self, t: Text) -> None:
        self._texts.append(t)
        self.write(t, scroll_end=False)

    def clear(self) -> LogPanel:
        self._texts.clear()
        super().clear()
        return self

    def add_lines(self, lines: list[str], reset: bool = False, new_attempt: bool = False) -> None:
        """Append a batch; ``reset``: the panel starts over (``new_attempt``: a relaunch's log, shown from its start
        and followed; else more lines came than one update carries: held like any others while scrolled up)."""
        if self.mode != "tail":
            return  # browsing: the tail is read again when the operator follows
        if new_attempt:
            self.held, self.held_count, self.held_gap, self.following = [], 0, False, True
        if not self.following:  # scrolled up: what is on screen stays exactly as it is
            if reset:  # lines were skipped: the held ones no longer join what is shown
                self.held, self.held_gap = [], True
            self.held = (self.held + lines)[-(self.max_lines or len(self.held) + len(lines)):]
            self.held_count += len(lines)
            return
        if reset or self.held_gap:
            self.clear()
        lines, self.held, self.held_count, self.held_gap = self.held + lines, [], 0, False
        for line in lines:
            self._put(styled(line[:2000]))
        if lines:
            self.scroll_end(animate=False, immediate=True)  # one scroll (one repaint) per batch

    def follow_again(self) -> None:
        """``f`` / End in tail mode: what was held, then the end."""
        self.following = True
        self.add_lines([])
        self.scroll_end(animate=False)

    def follow(self, tail: list[str]) -> None:
        """Back to the tail (``f`` / End): the newest lines, scrolled to the end."""
        self.mode, self.centre, self.label, self.following = "tail", None, "", True
        self.held, self.held_count, self.held_gap = [], 0, False
        self.clear()
        for line in tail:
            self._put(styled(line[:2000]))
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
            self._put(t)
        self.call_after_refresh(self._show_line, at)

    def toggle_wrap(self) -> bool:
        """Wrap long lines at the panel's width (or cut them again); the same lines drawn again, the top one kept
        in view. Returns whether lines now wrap."""
        texts, following = list(self._texts), self.following
        top = int(self.scroll_y) if self.lines else 0
        first = self._text_at(top) if texts else 0
        self.wrap = not self.wrap
        self._texts.clear()
        super().clear()
        rows = 0
        for i, t in enumerate(texts):
            if i == first:
                rows = len(self.lines)
            self._put(t)
        if following:
            self.call_after_refresh(self.scroll_end, animate=False)
        else:
            self.call_after_refresh(self.scroll_to, y=rows, animate=False)
        self.following = following
        return self.wrap

    def _text_at(self, row: int) -> int:
        """The index of the shown text whose lines hold ``row`` (one row per text unless wrapped)."""
        if not self.wrap:
            return row
        rows = 0
        width = max(1, self.scrollable_content_region.width)
        for i, t in enumerate(self._texts):
            rows += max(1, -(-t.cell_len // width))
            if rows > row:
                return i
        return max(0, len(self._texts) - 1)

    def _show_line(self, index: int) -> None:
        self.scroll_to(y=max(0, index - self.size.height // 2), animate=False)
