"""The one rank-prefix pattern: ``[rank3]:`` (torch's own log prefix under torch.distributed) and
``[default3]:`` (torchrun's ``--tee`` line prefix, ``[{role}{local_rank}]:``); both may be present.

Every reader and parser of train.log that needs a line's rank uses these (ARCHITECTURE.md, "A step
from the log to the screen": rank 0 speaks for the run; the other ranks' lines stay visible).
"""

from __future__ import annotations

import re

#: One prefix, as a regex fragment (for patterns that match a prefix in place).
RANK_PREFIX = r"\[(?:rank|default)\d+\]:"
#: The run of prefixes a line starts with (white space between them allowed).
LEADING_PREFIXES = re.compile(rf"^(?:\s*{RANK_PREFIX})+")
_ONE = re.compile(r"\[(rank|default)(\d+)\]:")


def rank_of(prefixes: str) -> int | None:
    """The rank a run of prefixes names: the first ``[rankN]`` (torch's global rank) wins over
    the first ``[defaultN]`` (torchrun's local rank); None when there is none."""
    found: dict[str, int] = {}
    for kind, n in _ONE.findall(prefixes):
        found.setdefault(kind, int(n))
    return found.get("rank", found.get("default"))


def rank_prefix(text: str) -> tuple[int | None, str]:
    """Split the leading prefixes off ``text``: (rank, rest); (None, text) when there is none."""
    m = LEADING_PREFIXES.match(text)
    if not m:
        return None, text
    return rank_of(m.group(0)), text[m.end():]


_GLUED = re.compile(rf"(?<=\S){RANK_PREFIX}")


def glued_prefix_at(text: str) -> int:
    """Where a second line starts inside ``text``: a rank prefix glued to what precedes it (torchrun's
    ``--tee`` tails a rank's stdout and stderr apart, so a dict line lands right after a bar frame that
    ended in ``\r``: ``… 10/30 [00:00<00:00, 47.25it/s][default0]:{'loss': …}``); -1 when there is none."""
    if "[default" not in text and "[rank" not in text:
        return -1
    lead = LEADING_PREFIXES.match(text)  # ``[rank0]:[default0]:`` is one run of prefixes, not two lines
    m = _GLUED.search(text, max(1, lead.end() if lead else 1))
    return m.start() if m else -1
