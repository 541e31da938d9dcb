"""The restart policy in a reused output directory (issue 44): another run left ckpt_100…ckpt_400 in it; this run,
killed at step 95 (enforce), resumes from its own newest complete checkpoint (ckpt_80), never from ckpt_400 (305
steps never trained), and the decision, restart.json and the page name the refused ckpt_400 and why. System tier:
a real supervisor, the alert command."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from test_restart_observe_live import PAGE_PY  # the alert command that writes each page to a file

TRAIN_PY = r'''
import os, signal, sys, time
from pathlib import Path
start = 0
if "--resume" in sys.argv:
    start = int(Path(sys.argv[sys.argv.index("--resume") + 1]).name.split("_")[1])
    print(f"resuming from step {start}", flush=True)
for i in range(start + 1, 121):
    time.sleep(0.02)
    print(f"step {i}/120 loss {1 / i:.4f}", flush=True)
    if i % 20 == 0:
        d = Path(f"out/ckpt_{i}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "DONE").write_text("ok")
    if i == 95 and start == 0:
        os.kill(os.getpid(), signal.SIGKILL)
'''



@pytest.mark.slow
def test_a_reused_output_dir_holding_another_runs_newer_checkpoint_resumes_from_this_runs_own(tmp_path: Path):
    pages = tmp_path / "pages.jsonl"
    config = (f'name = "reuse"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
              f"[alerts]\ncommand = {json.dumps([sys.executable, str(tmp_path / 'repo' / 'page.py'), str(pages)])}\n"
              '[restart]\nmode = "enforce"\nbackoff_s = 1\ncheckpoints = "out/ckpt_*"\ncomplete_marker = "DONE"\n'
              'resume = ["--resume", "{checkpoint}"]\n')
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY, "page.py": PAGE_PY, ".gitignore": "out/\n",
                                         "reuse.toml": config})
    an_hour_ago = time.time() - 3600
    for step in (100, 200, 300, 400):  # the earlier run's, complete, left in the same out/
        d = repo / "out" / f"ckpt_{step}"
        d.mkdir(parents=True)
        (d / "DONE").write_text("ok")
        for p in (d / "DONE", d):
            os.utime(p, (an_hour_ago, an_hour_ago))
    assert stepwatch("launch", "--no-tui", "reuse.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "reuse"
    rec: dict = wait_until(lambda: (r := read_json(run_dir / "restart.json")) and len(r.get("attempts") or []) == 2 and r or None,
                     90, interval_s=0.5, what="two attempts ended")
    first = rec["attempts"][0]
    assert (first["cause"], first["step"], first["checkpoint_step"]) == ("killed_by_signal", 95, 80), first
    assert first["checkpoint"] == str(repo / "out" / "ckpt_80")
    log = (run_dir / "train.log").read_text().splitlines()
    assert log[0] == "resuming from step 80" and log[1].startswith("step 81/120"), log[:2]
    assert rec["attempts"][1]["cause"] == "completed"
    pages_seen = [json.loads(x) for x in pages.read_text().splitlines()] if pages.exists() else []
    restart_pages = [p for p in pages_seen if p["kind"] == "restart"]
    assert restart_pages, pages_seen
    message = restart_pages[0]["message"]
    assert f"not resuming from {repo / 'out' / 'ckpt_400'} and 3 more (not this run's: last written " in message, message
    assert "before the run's first launch" in message, message
    # by hand: relaunch --from-checkpoint offers this run's newest (ckpt_120, its second attempt's), not ckpt_400
    wait_until(lambda: (read_json(run_dir / "restart.json") or {}).get("decision", {}).get("verdict") == "STOP", 30,
               what="the policy's STOP after the run completed")
    r = stepwatch("relaunch", "--no-tui", "--from-checkpoint", "reuse", cwd=repo)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run = read_json(run_dir / "run.json") or {}
    assert run["attempt"] == 3 and run["argv"][-2:] == ["--resume", str(repo / "out" / "ckpt_120")], run["argv"]
    # the operator may take another run's checkpoint, by name: recorded as theirs
    wait_until(lambda: (read_json(run_dir / "exit.json") or {}).get("returncode") == 0, 30, what="attempt 3's end")
    r = stepwatch("relaunch", "--no-tui", "--checkpoint", "out/nowhere", "reuse", cwd=repo)
    assert r.returncode != 0 and "--checkpoint out/nowhere: reuse cannot resume from it: it is none of" in r.stderr + r.stdout
    r = stepwatch("relaunch", "--no-tui", "--checkpoint", "out/ckpt_400", "reuse", cwd=repo)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run = read_json(run_dir / "run.json") or {}
    assert run["attempt"] == 4 and run["argv"][-1] == str(repo / "out" / "ckpt_400"), run["argv"]
    assert run["resumed_from"]["by"] == "operator" and run["resumed_from"]["step"] == 400


@pytest.mark.slow
def test_a_run_launched_with_override_is_restarted_by_the_policy_with_the_operators_reason_carried(tmp_path: Path):
    """A run launched with --override past a failing checklist item was never restarted (issue 44): the restart's
    launch ran the checklist again and refused. The operator's reason holds for the policy's restarts (as for a
    requeued Slurm job's), recorded in the restarted attempt's run.json."""
    config = (f'name = "forced"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
              f'[preflight]\ntest_command = ["{sys.executable}", "-c", "raise SystemExit(1)"]\n'
              '[restart]\nmode = "enforce"\nbackoff_s = 1\ncheckpoints = "out/ckpt_*"\ncomplete_marker = "DONE"\n'
              'resume = ["--resume", "{checkpoint}"]\n')
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY, ".gitignore": "out/\n", "forced.toml": config})
    refused = stepwatch("launch", "--no-tui", "forced.toml", cwd=repo)
    assert refused.returncode != 0 and "--override" in refused.stderr + refused.stdout  # the control: the item fails
    r = stepwatch("launch", "--no-tui", "--override", "the suite is known red on this branch", "forced.toml", cwd=repo)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = repo / "runs" / "forced"
    rec: dict = wait_until(lambda: (x := read_json(run_dir / "restart.json")) and len(x.get("attempts") or []) == 2
                           and x or None, 120, interval_s=0.5, what="the restarted attempt to end")
    assert rec["attempts"][1]["cause"] == "completed", rec  # the restarted attempt ran (the code before: none)
    run = read_json(run_dir / "run.json")
    assert run is not None, "run.json"
    assert run["attempt"] == 2 and run["preflight"]["override_reason"] == \
        "the suite is known red on this branch", run["preflight"]  # the restart's launch carried the reason
