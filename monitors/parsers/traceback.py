"""Python tracebacks in train.log: the exception line of the last one."""

from __future__ import annotations

from stepwatch.monitors.readers.rankprefix import rank_prefix


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
