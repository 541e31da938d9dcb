"""What train.log last said: the exception line of its last Python traceback, and its last
meaningful text (the newest bar drawn with ``\r`` counts: a run killed mid-bar never ended that line)."""

from __future__ import annotations

import re

from stepwatch.monitors.parsers.logformats import strip_escapes
from stepwatch.monitors.readers.rankprefix import rank_prefix

#: The last text is quoted at most this long (a bar is ~120 characters; a dumped tensor is not quoted whole).
LAST_TEXT_CHARS = 300
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def last_text(lines: list[str], partial: str | None) -> str | None:
    """The log's last meaningful text as a terminal leaves it, ANSI and control codes stripped: the
    unterminated tail (a ``\r`` bar the run was drawing) when there is one, else the last non-blank
    line; None when there is neither."""
    for raw in ([partial] if partial else []) + lines[::-1]:
        text = _CONTROL.sub("", strip_escapes(raw)).strip()
        if text:
            return text if len(text) <= LAST_TEXT_CHARS else text[:LAST_TEXT_CHARS - 1] + "…"
    return None


def traceback_last_line(lines: list[str]) -> str | None:
    """The exception line of the last Python traceback in ``lines`` (``RuntimeError: boom``), or None.

    It is the first unindented line after the last ``Traceback (most recent call last):``; tqdm
    often redraws its bar after the traceback, so the log's last line is not it. Rank prefixes
    (``[rank3]:``) are looked through.
    """
    bodies = []
    for ln in lines:
        rank, body = rank_prefix(ln)
        bodies.append(body[1:] if rank is not None and body.startswith(" ") else body)
    start = None
    for i in range(len(bodies) - 1, -1, -1):
        if "Traceback (most recent call last)" in bodies[i]:  # may be glued onto a tqdm segment
            start = i
            break
    if start is None:
        return None
    for ln, body in zip(lines[start + 1:], bodies[start + 1:]):
        if body.strip() and not body[0].isspace():
            return ln.strip()
    return None
