"""A panel base: update a child Static only when its text changed (bytes on a slow SSH link)."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Static

from stepwatch.tui.safe import safe_text


class Panel(Vertical):
    """A vertical panel whose ``_set`` skips updates that would not change what is on screen."""

    def _set(self, selector: str, value: str | Text, *, lines: bool = False) -> None:
        """Show ``value`` in the child ``selector``: one line, unless ``lines`` (then its fields must
        be made one line each: tui/safe.py ``one_line``)."""
        key = value.plain if isinstance(value, Text) else value
        cache = vars(self).setdefault("_cache", {})
        if cache.get(selector) != key:
            cache[selector] = key
            self.query_one(selector, Static).update(safe_text(value, newlines=lines))  # never markup, no control bytes
