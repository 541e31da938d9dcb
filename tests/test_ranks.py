"""Many ranks on one node (issue 17): real ``torchrun --nproc_per_node 2`` runs on the CPU (gloo).
The supervisor records each rank's process (RANK from its environment) and how it ended; a rank's
death is an alert naming the rank, its pid and the signal within 2 s; a frozen rank does not outlive
``stepwatch stop``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import FIXTURES_REAL, make_repo, stepwatch, wait_until
from stepwatch.monitors.parsers.torchrun import FailureTable
from stepwatch.monitors.runfiles import read_json

DDP_PY = '''\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} pid {os.getpid()} up", flush=True)
for step in range(1, int(sys.argv[1]) + 1):
    dist.all_reduce(torch.ones(10))
    time.sleep(0.1)
    if rank == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
dist.destroy_process_group()
'''
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def test_the_failure_table_of_a_real_torchrun_names_the_root_cause():
    table = FailureTable()
    for line in (FIXTURES_REAL / "torchrun_sigkill_rank1.log").read_text().splitlines():
        table.feed(line)
    got = [(e.rank, e.local_rank, e.exitcode, e.root_cause, e.how()) for e in table.entries]
    assert got == [(0, 0, -15, False, "killed by SIGTERM"), (1, 1, -9, True, "killed by SIGKILL")]
    assert all(e.pid > 0 for e in table.entries)
    control = FailureTable()  # a log with no table: nothing
    for line in (FIXTURES_REAL / "hf_trainer_plain.log").read_text().splitlines():
        control.feed(line)
    assert control.entries == []


def _launch_ddp(tmp_path: Path, steps: int) -> Path:
    repo = make_repo(tmp_path / "repo", {"ddp.py": DDP_PY})
    r = stepwatch("launch", "--no-tui", "--name", "ddp", "--", TORCHRUN, "--nproc_per_node", "2",
                  "--monitor-interval", "0.1", "ddp.py", str(steps), cwd=repo, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return repo / "runs" / "ddp"


def _ranks(run_dir: Path) -> dict[int, dict]:
    procs = (read_json(run_dir / "procs.json") or {}).get("processes") or []
    ranked = {p["pid"]: p for p in procs if p.get("rank") is not None}
    return {p["rank"]: p for p in ranked.values()
            if not (ranked.get(p["ppid"]) and ranked[p["ppid"]]["rank"] == p["rank"])}


def _wait_both_ranks_step(run_dir: Path) -> dict[int, dict]:
    wait_until(lambda: "step 10" in (run_dir / "train.log").read_text(), 60, what="the ranks to step")
    return wait_until(lambda: len(r := _ranks(run_dir)) == 2 and r, 10, what="both ranks recorded")


@pytest.mark.slow
def test_sigkill_of_rank_1_is_an_alert_naming_rank_pid_and_signal_within_2_s(tmp_path: Path):
    run_dir = _launch_ddp(tmp_path, 600)
    ranks = _wait_both_ranks_step(run_dir)
    victim = ranks[1]["pid"]
    t_kill = time.time()
    os.kill(victim, signal.SIGKILL)
    rec = wait_until(lambda: next((json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()
                                   if '"rank_death"' in ln), None), 15, interval_s=0.05, what="the rank_death alert")
    print(f"rank_death recorded {rec['t'] - t_kill:.3f} s after the kill")
    assert rec["t"] - t_kill < 2.0, f"recorded {rec['t'] - t_kill:.2f} s after the kill"
    msg = rec["message"]
    assert msg.startswith(f"rank 1 (local_rank 1, pid {victim}) killed by SIGKILL"), msg
    wait_until(lambda: read_json(run_dir / "exit.json"), 60, what="torchrun to end")
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    by_rank = {r["rank"]: r for r in snap["ranks"]}
    assert by_rank[1]["pid"] == victim and by_rank[1]["signal"] == "SIGKILL" and not by_rank[1]["alive"]
    assert by_rank[1]["exit_source"] == "kernel"  # read by the supervisor before torchrun reaped it
    assert by_rank[0]["signal"] == "SIGTERM"  # torchrun's teardown of the other rank
    deaths = [a for a in snap["alerts"] if a["kind"] == "rank_death"]
    assert len(deaths) == 1 and f"pid {victim}" in deaths[0]["message"], deaths  # rank 0's teardown rides along
    text = stepwatch("status", str(run_dir)).stdout
    assert f"rank 1 pid {victim} killed by SIGKILL" in text, text


@pytest.mark.slow
def test_a_clean_two_rank_run_raises_no_rank_alert(tmp_path: Path):
    run_dir = _launch_ddp(tmp_path, 20)
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 90, what="the end")
    assert ex["returncode"] == 0
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert sorted(r["rank"] for r in snap["ranks"]) == [0, 1]
    assert all(r["returncode"] == 0 and r["exit_source"] == "kernel" for r in snap["ranks"]), snap["ranks"]
    assert [a["kind"] for a in snap["alerts"]] == []


@pytest.mark.slow
def test_a_frozen_rank_does_not_outlive_stop(tmp_path: Path):
    run_dir = _launch_ddp(tmp_path, 600)
    ranks = _wait_both_ranks_step(run_dir)
    os.kill(ranks[1]["pid"], signal.SIGSTOP)
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    recorded = [(p["pid"], p["create_time"]) for p in read_json(run_dir / "procs.json")["processes"]]
    assert len(recorded) >= 3  # torchrun and both ranks

    def gone(pid: int, ctime: float) -> bool:
        try:
            p = psutil.Process(pid)
            return abs(p.create_time() - ctime) > 0.5 or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(lambda: all(gone(*x) for x in recorded), 10, what="every process of the run to be gone")
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert snap["survivors"] == [] and not [a for a in snap["alerts"] if a["kind"] == "rank_death"]
