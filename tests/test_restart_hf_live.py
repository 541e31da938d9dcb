"""The restart policy on a real tiny HF Trainer run (issue 34, system tier): `save_steps=20`, SIGKILLed at step 57;
the policy (enforce, `resume = "hf"`) starts attempt 2 with `--resume_from_checkpoint <out>/checkpoint-40`, whose
first step is 41 or later, 17 steps lost (±1); the run then completes and the policy stops. The time from the
death to the new attempt's first step is printed (the launch's checklist and the checkpoint's load in it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from tiny_hf import PREAMBLE
from stepwatch.monitors.runfiles import read_json

TRAIN_PY = PREAMBLE + r'''

class KillAt57(TrainerCallback):  # the first attempt dies at step 57 (no resume given)
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 57 and a.resume_from_checkpoint is None:
            os.kill(os.getpid(), signal.SIGKILL)


Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[KillAt57()]).train(
    resume_from_checkpoint=a.resume_from_checkpoint)
'''


@pytest.mark.slow
def test_a_trainer_killed_at_step_57_resumes_from_checkpoint_40_and_completes(tmp_path: Path):
    config = (f'name = "hf"\ncommand = [{json.dumps(sys.executable)}, "train.py", "--output_dir", "out"]\n'
              '[restart]\nmode = "enforce"\nbackoff_s = 1\nresume = "hf"\n[log]\nlogging_steps = 1\n')
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY, ".gitignore": "out/\n", "hf.toml": config})
    r = stepwatch("launch", "--no-tui", "hf.toml", cwd=repo, timeout=180)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "hf"

    def ended_twice() -> dict | None:
        rec = read_json(run_dir / "restart.json")
        return rec if rec and len(rec.get("attempts") or []) == 2 else None

    rec = wait_until(ended_twice, 400, interval_s=1.0, what="two attempts ended")
    print(json.dumps(rec, indent=1))
    first, second = rec["attempts"]
    assert first["cause"] == "killed_by_signal" and first["checkpoint_step"] == 40, first
    assert first["checkpoint"] == str(repo / "out" / "checkpoint-40")
    assert 56 <= first["step"] <= 57, first  # the bar's last update before the kill
    assert (second["cause"], second["step"]) == ("completed", 80), second
    assert rec["decision"]["verdict"] == "STOP" and rec["decision"]["reason"] == "the run completed"
    run = read_json(run_dir / "run.json") or {}
    assert run["attempt"] == 2 and run["argv"][-2:] == ["--resume_from_checkpoint", str(repo / "out" / "checkpoint-40")]
    steps = [r for x in (run_dir / "logsteps.jsonl").read_text().splitlines() if (r := json.loads(x))["kind"] == "step"]
    assert steps and steps[0]["step"] >= 41, steps[:2]  # the resumed attempt starts after its checkpoint
    lost = first["step"] - first["checkpoint_step"]
    assert 16 <= lost <= 17, lost
    gap_s = steps[0]["t"] - first["ended_at_unix"]
    print(f"death to the resumed attempt's first step: {gap_s:.1f} s (back-off 1 s, the launch's checklist, the "
          f"trainer's import and the checkpoint's load); {lost} steps lost")

    # the ledger: where the two attempts' hours went, against the run's own records (attempt 1's launch, attempt
    # 2's exit), within 2 %; the 17 steps done again are lost work, and goodput is shown and exported
    first_run = next(read_json(p) or {} for p in run_dir.glob("run.*.json"))
    wall_s = (read_json(run_dir / "exit.json") or {})["ended_at_unix"] - first_run["launched_at_unix"]
    status = json.loads(stepwatch("status", "hf", "--json", cwd=repo).stdout)
    led = status["ledger"]
    print(json.dumps({k: led[k] for k in ("phases_s", "wall_s", "goodput")}, indent=1))
    assert [a["source"] for a in led["attempts"]] == ["record", "ended"], led["attempts"]
    assert 16 <= led["attempts"][0]["lost_steps"] <= 18 and led["phases_s"]["lost"] > 0, led["attempts"][0]
    assert abs(led["wall_s"] - wall_s) <= 0.02 * wall_s, (led["wall_s"], wall_s)
    assert abs(sum(led["phases_s"].values()) - wall_s) <= 0.02 * wall_s, (led["phases_s"], wall_s)
    assert led["phases_s"]["restart_gap"] > 0 and led["phases_s"]["training"] > 0 and 0 < led["goodput"] < 1
    assert f"goodput {100 * led['goodput']:.0f}%" in stepwatch("status", "hf", cwd=repo).stdout
    text = stepwatch("export", "hf", cwd=repo).stdout
    assert 'phase="lost"' in text and "stepwatch_goodput_ratio{" in text, text[-2000:]
