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
from stepwatch.monitors.runfiles import read_json

TRAIN_PY = r'''
import argparse, os, signal
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--output_dir", required=True)
ap.add_argument("--resume_from_checkpoint")
a = ap.parse_args()


class Tokens(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = [torch.randint(0, 128, (16,), generator=g) for _ in range(320)]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class KillAt57(TrainerCallback):  # the first attempt dies at step 57 (no resume given)
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 57 and a.resume_from_checkpoint is None:
            os.kill(os.getpid(), signal.SIGKILL)


model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
args = TrainingArguments(output_dir=a.output_dir, max_steps=80, per_device_train_batch_size=4, save_steps=20,
                         logging_steps=1, report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0)
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
