"""Acknowledged alerts: ``acks.jsonl`` in the run dir, the one file a view writes (ARCHITECTURE.md,
"Files are the state, a view is disposable").

One JSON object per line: ``{"v": 1, "alert_id": ..., "acknowledged_at": ISO, "t": unix, "by": user}``.
Not rotated: alert ids carry the attempt number.
"""

from __future__ import annotations

import getpass
import json
import time
from pathlib import Path

from stepwatch.monitors.runfiles import ACKS_JSONL, append_bytes, open_regular, utc_iso


def read_acked(run_dir: Path) -> set[str]:
    """Alert ids acknowledged so far (corrupt lines skipped; a missing file is an empty set)."""
    acked: set[str] = set()
    try:
        fd = open_regular(Path(run_dir) / ACKS_JSONL)  # never blocks on a FIFO
        if fd is None:
            return acked
        with open(fd, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError):  # corrupt, or nested deeper than json reads
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("alert_id"), str):
                    acked.add(obj["alert_id"])
    except OSError:  # missing, not readable, or not a file (a directory in its place): nothing acknowledged
        pass
    return acked


def acknowledge(run_dir: Path, alert_ids: list[str]) -> None:
    """Append one line per id to acks.jsonl. Raises OSError when the run dir is not writable."""
    t = time.time()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    lines = "".join(json.dumps({"v": 1, "alert_id": a, "acknowledged_at": utc_iso(t), "t": t, "by": user}) + "\n"
                    for a in alert_ids)
    # never through a symlink; the umask's mode and any user's file, as before issue 43: acks are a view's notes
    # that a team's members add to each other's runs (mode None), and they decide nothing but what is shown acknowledged
    append_bytes(Path(run_dir) / ACKS_JSONL, lines.encode("utf-8"), mode=None)
