"""One of an attempt's record files (alerts.jsonl, logsteps.jsonl, restart records), held open by the process that
writes it: a relaunch's rotation or anything a member puts in its place changes nothing about where its records go."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepwatch.monitors.runfiles import open_append, write_all


class AttemptFile:
    """One of this attempt's files, opened once for appending (``O_NOFOLLOW``, regular only) and
    kept: a relaunch that renames it, or anything put in its place later (a symlink, a FIFO, a
    directory), changes nothing about where this attempt's records go. Each append is one write."""

    def __init__(self, path: Path, log: Callable[[str], None]):
        self.path, self.log = path, log
        self._lock = threading.Lock()
        try:
            self.fd: int | None = open_append(path)
        except OSError as e:
            self.fd = None
            log(f"cannot write {path.name}: {e}; its records are lost for this attempt")

    def append(self, data: bytes) -> None:
        """Append ``data``; raises OSError (a full disk) and says nothing more when it could not open."""
        if self.fd is None:
            raise OSError(f"{self.path.name} could not be opened")
        with self._lock:
            write_all(self.fd, data)

    def append_json(self, obj: dict[str, Any]) -> None:
        self.append((json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8"))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
