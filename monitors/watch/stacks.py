"""A stuck or slow rank's current Python stack, by py-spy (a well-kept tool for exactly this), taken
by the supervisor (the run's owner and the rank's ancestor, so ptrace is allowed) when it records a
``stuck_rank`` or ``straggler`` alert; appended to alerts.jsonl as a ``stack`` record beside the
alert. Without py-spy the record says so. Runs in a daemon thread: the detector loop never waits."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping

from stepwatch.monitors.proctree import HELPER_PIDS, HELPERS_LOCK
from stepwatch.monitors.snapshot.types import Snapshot

PY_SPY_TIMEOUT_S = 20.0
STACK_KEEP_CHARS = 8000
STACK_KINDS = ("stuck_rank", "straggler")


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or beside this interpreter (a venv's bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else None


def python_stack(pid: int, timeout_s: float = PY_SPY_TIMEOUT_S) -> str:
    """``py-spy dump --pid PID --nonblocking`` (the process is not paused), its last
    STACK_KEEP_CHARS characters; or why there is none."""
    exe = py_spy()
    if exe is None:
        return "no stack: py-spy is not installed (pip install py-spy)"
    try:
        with HELPERS_LOCK:  # the supervisor's helper, never a process of the run's tree
            p = subprocess.Popen([exe, "dump", "--pid", str(pid), "--nonblocking"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            HELPER_PIDS.add(p.pid)
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            return f"no stack: py-spy ran over {timeout_s:g} s"
        finally:
            with HELPERS_LOCK:
                HELPER_PIDS.discard(p.pid)
    except OSError as e:
        return f"no stack: could not run py-spy: {e}"
    text = out.decode("utf-8", "replace")
    return text[-STACK_KEEP_CHARS:] if p.returncode == 0 else f"no stack (py-spy exit {p.returncode}): {text[-500:]}"


def rank_pid(snap: Snapshot, rank: Any) -> int | None:
    """The pid of ``rank``'s latest process in the snapshot's ranks."""
    return next((r["pid"] for r in reversed(snap.get("ranks") or []) if r.get("rank") == rank), None)


def stack_target(snap: Snapshot, alert: Mapping[str, Any]) -> int | None:
    """The pid whose stack explains ``alert`` (a stuck rank, or the straggler), else None."""
    sg = snap.get("straggler") or {}
    if alert.get("kind") == "straggler":
        return rank_pid(snap, sg.get("rank"))
    if alert.get("kind") == "stuck_rank":
        key = str(alert.get("id", "")).split("stuck_rank-", 1)[-1]
        rank = next((s["rank"] for s in sg.get("stuck") or [] if f"{s['rank']}-{s['last_step']}" == key), None)
        return rank_pid(snap, rank)
    return None


def record_stack_later(alert_id: str, pid: int, append: Callable[[dict[str, Any]], None],
                       log: Callable[[str], None]) -> threading.Thread:
    """Take ``pid``'s stack in a daemon thread and append ``{"kind": "stack", ...}``."""
    def run() -> None:
        stack = python_stack(pid)
        try:
            append({"v": 1, "kind": "stack", "alert_id": alert_id, "pid": pid, "stack": stack, "t": time.time()})
        except (OSError, ValueError) as e:
            log(f"could not record the stack for {alert_id}: {e}")

    t = threading.Thread(target=run, name="py-spy", daemon=True)
    t.start()
    return t
