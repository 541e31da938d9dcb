"""The characters of text read from a run dir, made visible: the one home of the rule every view (tui/safe.py)
and every page the supervisor sends (monitors/watch/delivery.py) applies. Standard library only.

ESC (OSC 52 clipboard writes, OSC 0 titles, OSC 8 links, ``ESC[2J``, ``ESC c``), the other C0 and C1 controls,
DEL, the bidirectional overrides, isolates and marks (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C) and
the zero-width and invisible characters (U+200B–U+200D, U+2060–U+2064, U+FEFF) are replaced by a visible
one-cell stand-in of the same length: the Control Pictures (``␛`` for ESC, ``␍`` for CR, ``␀`` ...) for C0 and
DEL, ``�`` for the rest. Tab and newline stay where a caller allows them.
"""

from __future__ import annotations

import re
from typing import Any

_HIDDEN = r"\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069\u200b-\u200f\u061c\u2060-\u2064\ufeff"
_C0_KEEP_NL = re.compile(rf"[\x00-\x08\x0b-\x1f{_HIDDEN}]")
_C0_ALL = re.compile(rf"[\x00-\x08\x0a-\x1f{_HIDDEN}]")


def _picture(m: re.Match) -> str:
    c = ord(m.group(0))
    if c < 0x20:
        return chr(0x2400 + c)  # the Control Pictures block: U+2400 + the C0 code
    if c == 0x7F:
        return "\u2421"  # SYMBOL FOR DELETE
    return "\ufffd"


def visible(s: Any, *, newlines: bool = False) -> str:
    """``s`` as a string with every control character replaced by a visible stand-in (tab kept;
    newlines kept only with ``newlines=True``)."""
    s = s if isinstance(s, str) else str(s)
    return (_C0_KEEP_NL if newlines else _C0_ALL).sub(_picture, s)


_LINE_SEPARATORS = str.maketrans({"\u2028": "\u2424", "\u2029": "\u2424"})  # SYMBOL FOR NEWLINE


def one_line(s: Any) -> str:
    """``s`` as one line of visible text: :func:`visible` without newlines (LF -> ``␊``, CR -> ``␍``),
    and the Unicode line and paragraph separators (which ``str.splitlines`` breaks at) -> ``␤``.
    Same length as ``s``."""
    return visible(s).translate(_LINE_SEPARATORS)
