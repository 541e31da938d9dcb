"""A worker seen between its fork and its exec (issue 44): torchrun's agent forks each worker from a thread named
``pt_elastic`` and the worker's RANK arrives with its exec. The process tree's recorder saw one worker in about eight
launches in that window, recorded it as ``pt_elastic`` with its launcher's environment (no rank) and never looked
again: its freeze was paged without a rank, its death gave no rank_death. Here the window is held open by the test:
the child, forked, waits for a file before it execs with RANK=1. System tier: real processes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until
from stepwatch.monitors.proctree import TreeRecorder
from stepwatch.monitors.watchdog import ProcessRef


@pytest.mark.system
def test_a_worker_first_seen_before_its_exec_is_recorded_with_its_rank_once_it_execs(tmp_path: Path):
    assert "RANK" not in os.environ  # the launcher's environment: no rank
    gate = tmp_path / "exec-now"
    pid = os.fork()
    if pid == 0:  # the worker, between its fork and its exec, named as torchrun's thread names it
        try:
            Path("/proc/self/comm").write_text("pt_elastic")
            while not gate.exists():
                time.sleep(0.01)
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"],
                      {**os.environ, "RANK": "1", "LOCAL_RANK": "1"})
        finally:
            os._exit(1)
    try:
        rec = TreeRecorder(tmp_path, ProcessRef.of_pid(pid))
        rec.sample()
        before = next(r for r in rec.recorded() if r.ref.pid == pid)
        assert (before.rank, before.name) == (None, "pt_elastic")  # the control: seen before the exec
        gate.touch()
        wait_until(lambda: b"RANK=1" in Path(f"/proc/{pid}/environ").read_bytes(), 10, what="the worker's exec")
        rec.sample()
        after = next(r for r in rec.recorded() if r.ref.pid == pid)
        assert (after.rank, after.local_rank) == (1, 1), after
        procs = json.loads((tmp_path / "procs.json").read_text())["processes"]
        assert [(p["rank"], p["name"]) for p in procs if p["pid"] == pid] == [(1, after.name)]
        assert after.name != "pt_elastic", after.name  # its own name after the exec
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
