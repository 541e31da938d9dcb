"""The restart policy's budget and its choice of checkpoint, live (system tier: real supervisors, real runs).

- ``max_restarts = 2`` and a run that dies three times, each time further on: two restarts, each from the newest
  complete checkpoint, then STOP naming the budget.
- A real tiny HF Trainer SIGKILLed while ``checkpoint-60`` is being written (its model saved, its
  ``trainer_state.json`` never): the policy resumes from ``checkpoint-40``, never the broken one, and the run completes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from tiny_hf import PREAMBLE
from stepwatch.monitors.runfiles import read_json

DIES_FURTHER_PY = r'''
import os, signal, sys, time
from pathlib import Path
start = int(Path(sys.argv[2]).name.split("_")[1]) if len(sys.argv) > 2 else 0
die_at = start + 25  # each attempt gets 25 steps further than its checkpoint, then dies
for i in range(start + 1, 101):
    time.sleep(0.02)
    print(f"step {i}/100 loss {1 / i:.4f}", flush=True)
    if i % 20 == 0:
        d = Path(f"ckpt_{i}")
        d.mkdir(exist_ok=True)
        (d / "DONE").write_text("ok")
    if i == die_at:
        os.kill(os.getpid(), signal.SIGKILL)
'''

HF_MID_SAVE_PY = PREAMBLE + r'''

class DiesMidSave(Trainer):  # the first attempt dies inside checkpoint-60's save: model written, no trainer_state.json
    def _save_rng_state(self, output_dir):
        if self.state.global_step == 60 and a.resume_from_checkpoint is None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super()._save_rng_state(output_dir)


DiesMidSave(model=model, args=args, train_dataset=Tokens()).train(resume_from_checkpoint=a.resume_from_checkpoint)
'''


def _restart_json(run_dir: Path, attempts: int) -> dict:
    return wait_until(lambda: (rec if (rec := read_json(run_dir / "restart.json")) and len(rec.get("attempts") or [])
                               >= attempts and rec.get("decision", {}).get("attempt") == attempts else None),
                      400, interval_s=0.5, what=f"{attempts} attempts ended")


@pytest.mark.slow
def test_max_restarts_2_with_three_progressing_deaths_restarts_twice_then_stops_naming_the_budget(tmp_path: Path):
    config = (f'name = "budget"\ncommand = [{json.dumps(sys.executable)}, "dies.py"]\n[restart]\nmode = "enforce"\n'
              'max_restarts = 2\nbackoff_s = 0.5\nstorm_attempts = 10\ncheckpoints = "ckpt_*"\n'
              'complete_marker = "DONE"\nresume = ["--resume", "{checkpoint}"]\n')
    repo = make_repo(tmp_path / "repo", {"dies.py": DIES_FURTHER_PY, ".gitignore": "ckpt_*\n", "budget.toml": config})
    assert stepwatch("launch", "--no-tui", "budget.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "budget"
    rec = _restart_json(run_dir, 3)
    print(json.dumps(rec["decision"], indent=1))
    assert [(a["cause"], a["checkpoint_step"]) for a in rec["attempts"]] == [
        ("killed_by_signal", 20), ("killed_by_signal", 40), ("killed_by_signal", 60)], rec["attempts"]
    d = rec["decision"]
    assert d["verdict"] == "STOP" and "the restart budget is spent: 2 restart(s) of max_restarts 2" in d["reason"], d
    run = read_json(run_dir / "run.json") or {}
    assert run["attempt"] == 3 and run["argv"][-2:] == ["--resume", str(repo / "ckpt_40")], run["argv"]
    assert "restart budget is spent" in stepwatch("status", "budget", cwd=repo).stdout


@pytest.mark.slow
def test_a_trainer_killed_while_checkpoint_60_is_written_resumes_from_checkpoint_40(tmp_path: Path):
    config = (f'name = "midsave"\ncommand = [{json.dumps(sys.executable)}, "train.py", "--output_dir", "out"]\n'
              '[restart]\nmode = "enforce"\nbackoff_s = 1\nresume = "hf"\n[log]\nlogging_steps = 1\n')
    repo = make_repo(tmp_path / "repo", {"train.py": HF_MID_SAVE_PY, ".gitignore": "out/\n", "midsave.toml": config})
    assert stepwatch("launch", "--no-tui", "midsave.toml", cwd=repo, timeout=180).returncode == 0
    run_dir = repo / "runs" / "midsave"
    rec = _restart_json(run_dir, 2)
    first, second = rec["attempts"]
    print(json.dumps(first, indent=1))
    broken = repo / "out" / "checkpoint-60"
    assert first["checkpoint_step"] == 40 and first["checkpoint"] == str(repo / "out" / "checkpoint-40"), first
    assert first["cause"] in ("save_crash", "killed_by_signal"), first
    assert second["cause"] == "completed" and second["step"] == 80, second
    run = read_json(run_dir / "run.json") or {}
    assert run["argv"][-1] == str(repo / "out" / "checkpoint-40"), run["argv"]
    assert (broken / "trainer_state.json").exists()  # attempt 2 passed step 60 again and wrote it whole
    steps = [r for x in (run_dir / "logsteps.jsonl").read_text().splitlines() if (r := json.loads(x))["kind"] == "step"]
    assert steps[0]["step"] >= 41, steps[:2]


DDP_CKPT_PY = r'''
import os, signal, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
start = int(Path(sys.argv[2]).name.split("_")[1]) if len(sys.argv) > 2 else 0
print(f"rank {rank} starts after step {start}", flush=True)
for i in range(start + 1, 61):
    t = torch.ones(1)
    dist.all_reduce(t)  # the group steps together
    time.sleep(0.02)
    if rank == 0:
        print(f"step {i}/60 loss {1 / i:.4f}", flush=True)
        if i % 20 == 0:
            Path(f"ckpt_{i}").mkdir(exist_ok=True)
            (Path(f"ckpt_{i}") / "DONE").write_text("ok")
    if rank == 1 and i == 45 and start == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # one rank dies: torchrun tears the group down
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_a_2_rank_torchrun_run_with_one_rank_killed_restarts_the_whole_group_from_the_newest_checkpoint(tmp_path: Path):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    command = [torchrun, "--nproc_per_node", "2", "--monitor-interval", "0.1", "ddp.py"]
    config = (f'name = "ddp"\ncommand = {json.dumps(command)}\nenv = {{ OMP_NUM_THREADS = "1" }}\n[restart]\n'
              'mode = "enforce"\nbackoff_s = 0.5\ncheckpoints = "ckpt_*"\ncomplete_marker = "DONE"\n'
              'resume = ["--resume", "{checkpoint}"]\n')
    repo = make_repo(tmp_path / "repo", {"ddp.py": DDP_CKPT_PY, ".gitignore": "ckpt_*\n", "ddp.toml": config})
    assert stepwatch("launch", "--no-tui", "ddp.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "ddp"
    rec = _restart_json(run_dir, 2)
    first, second = rec["attempts"]
    print(json.dumps(first, indent=1))
    assert first["checkpoint_step"] == 40 and first["cause"] != "completed", first
    assert "rank 1" in first["evidence"] or "SIGKILL" in first["evidence"], first  # torchrun's root cause
    assert (second["cause"], second["step"]) == ("completed", 60), second
    run = read_json(run_dir / "run.json") or {}
    assert run["argv"][-2:] == ["--resume", str(repo / "ckpt_40")], run["argv"]
    log = (run_dir / "train.log").read_text()
    assert "rank 0 starts after step 40" in log and "rank 1 starts after step 40" in log, log[-2000:]  # the whole group
