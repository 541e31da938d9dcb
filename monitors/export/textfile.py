"""``stepwatch export RUN [--textfile PATH]``: the run's Prometheus text (:mod:`.prometheus`) to stdout, or for
node-exporter's textfile collector (a temp file, then a rename), once or every few seconds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.export.prometheus import text_of
from stepwatch.monitors.runfiles import write_bytes_atomic
from stepwatch.monitors.snapshot.types import Snapshot


def write_textfile(snap: Snapshot, path: Path) -> None:
    """Write the text for node-exporter's textfile collector: a temp file beside ``path``, then a
    rename (the collector never reads half a file)."""
    write_bytes_atomic(path, text_of(snap), mode=0o644)


def export(run_dir: Path, textfile: Path | None, every_s: float, write: Callable[[str], Any]) -> None:
    """``stepwatch export``: the run's text to ``write`` (stdout), or to ``textfile`` for node-exporter
    (atomically), once, or every ``every_s`` seconds until interrupted."""
    from stepwatch.monitors.snapshot.observer import RunObserver  # noqa: PLC0415

    observer = RunObserver(run_dir)
    while True:
        snap = observer.refresh()
        if textfile is None:
            write(text_of(snap).decode())
        else:
            write_textfile(snap, textfile)
        if not every_s:
            return
        time.sleep(every_s)
