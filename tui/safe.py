"""Text read from a run dir, made safe to show: never markup, never terminal control.

Everything a run wrote (log lines, traceback lines, event strings, versions, the attention backend,
GPU names, run names, alert messages) is data. Two rules, one home:

- **No markup.** Rich/Textual parse ``[...]`` in plain strings given to ``Static``, ``DataTable``
  cells and ``notify``; a tqdm postfix ``lr=[1e-05]`` or ``saving to [/data/ckpt-4]`` raised
  ``MarkupError``. Views pass :class:`rich.text.Text` (never parsed) built by :func:`safe_text`.
- **No control bytes.** ESC (OSC 52 clipboard writes, OSC 0 titles, OSC 8 links, ``ESC[2J``,
  ``ESC c``), the other C0 and C1 controls, DEL and the bidirectional overrides are replaced by a
  visible one-cell stand-in of the same length: the Control Pictures (``␛`` for ESC, ``␍`` for CR,
  ``␀`` ...) for C0 and DEL, ``�`` for C1, the bidi controls and marks and the zero-width characters
  (``monitors/safechars.py``). Tab and newline stay where a caller allows them. Same length, so a Text's styles stay on their characters.
- **One line stays one line.** A field shown on one line (a version, the attention backend, a run's
  name, an alert's message, a GPU's name) never starts a line of its own: :func:`one_line` shows its
  line breaks as ``␊`` / ``␍`` (and U+2028 / U+2029 as ``␤``), so ``torch 2.4\nALERT ...`` read from
  events.jsonl cannot print a fake line in ``status`` or a panel.

:class:`SafeWriter` applies the same to everything the headless commands print.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

# the character rules have one home below the views (the supervisor's pages use them too)
from stepwatch.monitors.safechars import one_line as one_line, visible as visible

if TYPE_CHECKING:  # rich only where a Text is made: the headless commands start without it
    from rich.text import Text


def safe_text(value: Any, style: str = "", *, newlines: bool = False) -> Text:
    """A :class:`Text` that shows ``value`` literally: a str becomes unparsed text, a Text keeps
    its styles with its characters made visible; one line (:func:`one_line`) unless ``newlines``."""
    from rich.text import Text  # noqa: PLC0415

    shown = (lambda s: visible(s, newlines=True)) if newlines else one_line  # noqa: E731
    if isinstance(value, Text):
        t = value.copy()
        plain = shown(t.plain)
        if plain != t.plain:
            return Text(plain, style=t.style, justify=t.justify, overflow=t.overflow, no_wrap=t.no_wrap, end=t.end,
                        tab_size=t.tab_size, spans=list(t.spans))
        return t
    return Text(shown(value), style)


class SafeWriter:
    """A text stream that makes what is written visible (newlines and tabs kept) before passing it
    on: the headless commands' stdout and stderr."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, s: str) -> int:
        self._stream.write(visible(s, newlines=True))
        return len(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
