"""Python stacks by py-spy (a well-kept tool for exactly this), taken by the supervisor (the run's owner
and the processes' ancestor, so ptrace is allowed) and appended to alerts.jsonl as a ``stack`` record
beside the alert they explain. A ``stuck_rank`` or ``straggler`` alert gets its rank's stack; a ``stall``
(the run confirmed stuck) gets the stacks of every live process of the tree, grouped by where each stands
(:mod:`stepwatch.monitors.parsers.pystacks`: the odd one out named, the phase they show), and its delivery
waits for them (bounded) so that the page says it. Without py-spy the record says so. Each runs in a daemon
thread: the detector loop never waits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping

from stepwatch.monitors import fdreserve
from stepwatch.monitors.parsers.pystacks import ProcessStack, group_stacks
from stepwatch.monitors.proctree import HELPER_PIDS, HELPERS_LOCK, recorded_processes
from stepwatch.monitors.runfiles import PROCS_JSON
from stepwatch.monitors.watchdog import is_alive
from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.monitors.states import EVALUATING, SAVING

PY_SPY_TIMEOUT_S = 20.0
STACK_KEEP_CHARS = 8000
STACK_KINDS = ("stuck_rank", "straggler")
#: alert kinds that get every process's stack, grouped; their delivery waits for the stacks
TREE_STACK_KINDS = ("stall",)
#: processes of the tree whose stacks are taken at most, and at once
MOST_PROCESSES = 16
AT_ONCE = 4


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
    with fdreserve.room():  # an alert's evidence, with every other descriptor taken too
        return _python_stack(pid, timeout_s)


def _python_stack(pid: int, timeout_s: float) -> str:
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
                       log: Callable[[str], None], then: Callable[[str], None] | None = None) -> threading.Thread:
    """Take ``pid``'s stack in a daemon thread and append ``{"kind": "stack", ...}``; then hand the stack's text to
    ``then`` (whatever the disk did)."""
    def run() -> None:
        stack = python_stack(pid)
        try:
            append({"v": 1, "kind": "stack", "alert_id": alert_id, "pid": pid, "stack": stack, "t": time.time()})
        except (OSError, ValueError) as e:
            log(f"could not record the stack for {alert_id}: {e}")
        if then is not None:
            then(stack)

    t = threading.Thread(target=run, name="py-spy", daemon=True)
    t.start()
    return t


def tree_stacks(run_dir: Path) -> list[ProcessStack]:
    """The stack of each live process of the run's recorded tree (procs.json, each checked by identity:
    pid and create time), MOST_PROCESSES at most, AT_ONCE py-spy at a time. Only a procs.json this user wrote and
    no one else can have since (the trust rule): py-spy never attaches to a pid a member wrote into it."""
    live = [rp for rp in recorded_processes(Path(run_dir) / PROCS_JSON, os.geteuid())
            if not rp.ended and is_alive(rp.ref)]
    live = live[:MOST_PROCESSES]
    with ThreadPoolExecutor(AT_ONCE, thread_name_prefix="py-spy") as pool:
        texts = list(pool.map(lambda rp: python_stack(rp.ref.pid), live))
    return [{"pid": rp.ref.pid, "rank": rp.rank, "name": rp.name, "stack": text} for rp, text in zip(live, texts)]


def record_tree_stacks_later(alert: Mapping[str, Any], run_dir: Path, append: Callable[[dict[str, Any]], None],
                             deliver: Callable[[dict[str, Any]], None], log: Callable[[str], None],
                             phase_seen: Callable[[str, str], None] | None = None) -> threading.Thread:
    """In a daemon thread: take every process's stack, append ``{"kind": "stack", "summary": ...}`` (the
    odd one out's stack as ``stack``), then hand ``alert`` to ``deliver`` with the summary after its
    message (delivered as it is when the stacks could not be taken). A stall whose stacks show a save or an
    evaluation (the whole tree, or its odd one out) is no stall: it goes to ``phase_seen`` (the phase, the summary)
    instead, which judges the step against that phase's budget (a silent save on a slow file system, the CPU idle)."""
    def run() -> None:
        summary = ""
        try:
            tree = tree_stacks(run_dir)
            grouped = group_stacks(tree)
            summary = grouped["summary"]
            attached = next((s["stack"] for s in tree if s["pid"] == grouped["attached_pid"]), None)
            append({"v": 1, "kind": "stack", "alert_id": alert["id"], "pid": grouped["attached_pid"],
                    "stack": attached, "summary": summary, "phase": grouped["phase"], "groups": grouped["groups"],
                    "t": time.time()})
            if phase_seen is not None and grouped["phase"] in (SAVING, EVALUATING):
                phase_seen(grouped["phase"], summary)
                return
        except Exception as e:  # noqa: BLE001 - the page goes out whatever py-spy or the disk did
            log(f"could not record the stacks for {alert['id']}: {type(e).__name__}: {e}")
        deliver({**alert, "message": f"{alert['message']} · stacks: {summary}" if summary else alert["message"]})

    t = threading.Thread(target=run, name="py-spy-tree", daemon=True)
    t.start()
    return t
