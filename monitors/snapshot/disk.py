"""The run dir's file system: free space, whether it is full, and what its supervisor could not write.

A full file system (ENOSPC) silences every file of a run at once: the training's own train.log,
the emitter's events.jsonl, the supervisor's records. Silence then proves nothing, so a full disk
makes the stall detector say "not judged" (never a stall from missing events:
:func:`.stepsource.guard_stall`) and is an alert of its
own; an end the supervisor could not record says why. Free space is read with ``statvfs`` on each
refresh (a syscall, no file opened); the supervisor's failed writes come from exit.json's
``write_errors`` (strings, shown as data), and the run's output train.log could not take from its
``log_lost_bytes`` (the log pump counts it: the run itself never sees the error).
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from stepwatch.monitors.snapshot.types import Disk, Snapshot

#: Below this many free bytes (statvfs f_bavail x f_frsize, what an unprivileged writer may use)
#: the run dir's file system counts as full: a step's log lines and events no longer fit.
FULL_BELOW_BYTES = 1 << 20


def disk_status(run_dir: Path, write_errors: Any = None, log_lost_bytes: Any = None, log_lost_reason: Any = None) -> Disk:
    """``{free_bytes, total_bytes, full, write_errors, log_lost_bytes, log_lost_reason, error}`` for the
    file system holding ``run_dir``; the last three from exit.json's values (checked: a count is a
    whole number >= 0, a reason a short string; anything else None)."""
    errs = [str(e)[:300] for e in write_errors[:20]] if isinstance(write_errors, list) else []
    lost = log_lost_bytes if type(log_lost_bytes) is int and 0 <= log_lost_bytes < 1 << 62 else None
    why = log_lost_reason[:200] if isinstance(log_lost_reason, str) and lost else None
    try:
        st = os.statvfs(run_dir)
    except OSError as e:
        return {"free_bytes": None, "total_bytes": None, "full": None, "write_errors": errs, "log_lost_bytes": lost,
                "log_lost_reason": why, "error": f"statvfs: {e.strerror}"}
    free = st.f_bavail * st.f_frsize
    return {"free_bytes": free, "total_bytes": st.f_blocks * st.f_frsize, "full": free < FULL_BELOW_BYTES,
            "write_errors": errs, "log_lost_bytes": lost, "log_lost_reason": why, "error": None}


def lost_words(disk: Disk | Mapping[str, Any]) -> str:
    """``train.log lost 1.2 MiB of the run's output (No space left on device); the run went on`` or ''."""
    lost = disk.get("log_lost_bytes")
    if not lost:
        return ""
    return (f"train.log lost {size_words(lost)} ({lost} bytes) of the run's output"
            + (f" ({disk.get('log_lost_reason')})" if disk.get("log_lost_reason") else "") + "; the run went on")


def size_words(n: int | None) -> str:
    """``0 B`` / ``512.0 KiB`` / ``3.2 GiB``."""
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def full_words(disk: Disk | Mapping[str, Any]) -> str:
    """``the run dir's file system is full (0 B free of 1.0 MiB)``."""
    return (f"the run dir's file system is full ({size_words(disk.get('free_bytes'))} free of "
            f"{size_words(disk.get('total_bytes'))})")


def end_cause(snap: Snapshot) -> str:
    """Why an end has no exit status, or what its records could not hold: '' when nothing to say."""
    disk = snap.get("disk") or {}
    errs = disk.get("write_errors") or []
    lost = f"; {lost_words(disk)}" if disk.get("log_lost_bytes") else ""
    if errs:
        return "; the supervisor's records: " + "; ".join(errs[:3]) + lost
    if lost:
        return lost
    if disk.get("full") and snap.get("returncode") is None and not snap.get("signal"):
        return f"; {full_words(disk)}: exit.json could not be written (ENOSPC)"
    return ""
