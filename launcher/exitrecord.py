"""exit.json, the one record of an attempt that must not be lost, on a full disk too.

The supervisor reserves RESERVE_BYTES in the run dir at its start (:func:`reserve_space`) and gives
them back right before it writes exit.json (:func:`record_exit`), which it then retries for
EXIT_RETRY_FOR_S; what went wrong is written into the record's ``write_errors``.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors import fdreserve
from stepwatch.monitors.runfiles import EXIT_JSON, utc_iso, write_all, write_json_atomic


#: Space the supervisor holds from its start (a hidden file in the run dir) and gives back right
#: before it writes exit.json, so a file system that filled up still has room for the one record
#: that must not be lost.
RESERVE_FILE = ".stepwatch.reserve"
RESERVE_BYTES = 256 * 1024
#: When even the reserve does not make room: exit.json is tried again this often, this long.
EXIT_RETRY_EVERY_S = 2.0
EXIT_RETRY_FOR_S = 600.0


def reserve_space(run_dir: Path, log: Callable[[str], None]) -> Path | None:
    """Write RESERVE_BYTES of real blocks into the run dir's reserve file; None when it could not."""
    path = run_dir / RESERVE_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as e:
        log(f"no space reserved for exit.json: {e}")
        return None
    try:
        write_all(fd, b"\0" * RESERVE_BYTES)  # written, not fallocated: tmpfs and CoW file systems too
        os.fsync(fd)
        return path
    except OSError as e:
        log(f"no space reserved for exit.json: {e}")
        unlink_quietly(path)
        return None
    finally:
        os.close(fd)


def unlink_quietly(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def new_exit_record(t_end: float, duration_s: float | None, *, returncode: int | None = None, signal: str | None = None,
                    stop_requested: bool = False, error: str | None = None, log_lost_bytes: int = 0,
                    log_lost_reason: str | None = None) -> dict[str, Any]:
    """exit.json's record of an attempt's end (its keys, in their order, in one place)."""
    return {"v": 1, "returncode": returncode, "signal": signal, "ended_at": utc_iso(t_end), "ended_at_unix": t_end,
            "duration_s": duration_s, "stop_requested": stop_requested, "error": error, "write_errors": [],
            "log_lost_bytes": log_lost_bytes, "log_lost_reason": log_lost_reason}


def record_exit(run_dir: Path, exit_rec: dict[str, Any], reserve: Path | None,
                retry_every_s: float = EXIT_RETRY_EVERY_S, retry_for_s: float = EXIT_RETRY_FOR_S,
                log: Callable[[str], None] = lambda m: None) -> bool:
    """Write exit.json, first giving back the space reserved at the start (so the record has room on
    a full disk; said in the record's ``write_errors`` when it was needed), and the descriptors the
    supervisor holds back (:mod:`stepwatch.monitors.fdreserve`) when every other one is taken. On a failure, try again
    every ``retry_every_s`` for ``retry_for_s``; each distinct failure goes into ``write_errors``
    and supervisor.log. Returns whether exit.json was written."""
    deadline = time.monotonic() + retry_for_s
    errors: list[str] = exit_rec.setdefault("write_errors", [])
    if reserve is not None:
        try:
            st = os.statvfs(run_dir)
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        unlink_quietly(reserve)
        if free is not None and free < RESERVE_BYTES:
            errors.append(f"{EXIT_JSON}: the file system was full ({free} B free, ENOSPC for every writer): "
                          "written into the space reserved at the start")
    while True:
        try:
            with fdreserve.room():  # with every other descriptor taken too (monitors/fdreserve.py)
                write_json_atomic(run_dir / EXIT_JSON, exit_rec)
            return True
        except OSError as e:
            what = f"{EXIT_JSON}: {e.strerror or e} ({errno.errorcode.get(e.errno or 0, e.errno)})"
            if not errors or errors[-1] != what:
                errors.append(what)
            log(f"could not write {EXIT_JSON} (returncode={exit_rec.get('returncode')} "
                 f"signal={exit_rec.get('signal')}): {e}")
            if time.monotonic() >= deadline:
                log(f"gave up on {EXIT_JSON} after {retry_for_s:g} s")
                return False
            time.sleep(retry_every_s)
