"""The loss-health sentinel on real tiny HF Trainer runs launched by stepwatch (issue 47, system tier): a learning rate
multiplied by 60 at step 300 (a callback of the test's) is a loss alert whose onset is within 2 logged steps of the
jump; the same run without the jump, 2,000 logged steps, raises no loss alert; a NaN from step 35 is one alert, the
nonfinite loss's, naming 35. Learnable rows (arithmetic sequences), so the loss falls well below the uniform level
and a wrecked model shows at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json

TRAIN_PY = r'''
import argparse, math, os, time
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--output_dir", default="out")
ap.add_argument("--steps", type=int, default=600)
ap.add_argument("--jump_at", type=int)
ap.add_argument("--nan_at", type=int)
ap.add_argument("--step_sleep_s", type=float, default=0.0)
a = ap.parse_args()
torch.set_num_threads(1)


class Rows(Dataset):  # 320 arithmetic sequences of 16 tokens: learnable
    def __len__(self):
        return 320

    def __getitem__(self, i):
        ids = (torch.arange(16) * (1 + i % 3) + i) % 128
        return {"input_ids": ids, "labels": ids.clone()}


class Upset(TrainerCallback):
    def on_step_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step == a.jump_at:  # the learning rate times 60 from here on
            lr_scheduler.base_lrs = [x * 60 for x in lr_scheduler.base_lrs]
            for g in optimizer.param_groups:
                g["lr"] *= 60
        time.sleep(a.step_sleep_s)  # a step of a real run takes longer than the tiny model's 5 ms
        if a.nan_at is not None and state.global_step == a.nan_at - 1:  # step nan_at's loss is NaN
            with torch.no_grad():
                next(model.parameters()).fill_(math.nan)


model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
args = TrainingArguments(output_dir=a.output_dir, max_steps=a.steps, per_device_train_batch_size=4, learning_rate=1e-3,
                         save_steps=100, save_total_limit=2, logging_steps=1, logging_nan_inf_filter=False,
                         report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0)
Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Upset()]).train()
'''


def run(tmp_path: Path, name: str, *flags: str) -> tuple[Path, Path, list[dict]]:
    config = (f'name = "{name}"\ncommand = {json.dumps([sys.executable, "train.py", "--output_dir", "out", *flags])}\n'
              'env = { OMP_NUM_THREADS = "1" }\n[log]\nlogging_steps = 1\n')
    repo = make_repo(tmp_path / name, {"train.py": TRAIN_PY, ".gitignore": "out/\n", f"{name}.toml": config})
    r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo, timeout=120)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / name
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 300, interval_s=0.5, what=f"the {name} run to end")
    assert ex["returncode"] == 0, ex
    wait_until(lambda: json.loads(stepwatch("status", name, "--json", cwd=repo).stdout)["supervisor_alive"] is False,
               60, interval_s=0.5, what="the supervisor's last look")
    alerts = [json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()] \
        if (run_dir / "alerts.jsonl").exists() else []
    return repo, run_dir, [x for x in alerts if x["kind"] == "alert"]


@pytest.mark.slow
def test_a_learning_rate_jump_is_a_loss_alert_whose_onset_is_within_two_logged_steps(tmp_path: Path):
    # 30 ms a step: the rotation deletes checkpoint-200 at step 400, 3 s after the onset (the supervisor looks each
    # second; a rollback point rotated away before its first look cannot be kept, and the alert says so)
    repo, run_dir, alerts = run(tmp_path, "jump", "--steps", "600", "--jump_at", "300", "--step_sleep_s", "0.03")
    loss = [x for x in alerts if x["alert_kind"].startswith("loss_")]
    print(json.dumps([(x["alert_kind"], x["message"]) for x in loss], indent=1))
    assert loss and loss[0]["alert_kind"] == "loss_spike", alerts
    onset = int(loss[0]["id"].rsplit("-", 1)[1])  # a1-loss_spike-loss-<onset>: the episode may have ended by then
    # step 301 is the first with the jumped rate; within 2 logged steps of it (the tracker labels a dict with the bar
    # frame drawn after it, which may be the next step's)
    assert 301 <= onset <= 303, loss[0]
    status = json.loads(stepwatch("status", "jump", "--json", cwd=repo).stdout)["loss_health"]
    assert status["episodes"] >= 1 and onset in [
        e["onset_step"] for e in status["ended"] + ([status["episode"]] if status["episode"] else [])], status
    # the rollback point: the newest complete checkpoint at or before the level's window (step ~285): checkpoint-200,
    # kept although save_total_limit = 2 deleted it from out/ at step 400
    assert f"rollback checkpoint-200 (step 200): kept in {run_dir / 'kept' / 'checkpoint-200'}" in loss[0]["message"]
    assert not (repo / "out" / "checkpoint-200").exists()
    kept = run_dir / "kept" / "checkpoint-200"
    assert json.loads((kept / "trainer_state.json").read_text())["global_step"] == 200
    assert (kept / "model.safetensors").stat().st_size > 0
    listed = json.loads((run_dir / "kept.json").read_text())["all"]
    assert (listed[0]["step"], listed[0]["how"], listed[0]["onset_step"]) == (200, "hard links", onset), listed
    shown = json.loads(stepwatch("status", "jump", "--json", cwd=repo).stdout)["loss_health"]["rollback"]
    assert (shown["step"], shown["how"]) == (listed[-1]["step"], "hard links"), shown  # the newest episode's
    assert f"· rollback checkpoint-{shown['step']} kept" in stepwatch("status", "jump", cwd=repo).stdout


@pytest.mark.slow
def test_the_same_run_without_the_jump_raises_no_loss_alert_over_2000_logged_steps(tmp_path: Path):
    repo, _run_dir, alerts = run(tmp_path, "calm", "--steps", "2000")
    assert not [x for x in alerts if x["alert_kind"].startswith("loss_") or x["alert_kind"] == "nonfinite_loss"], alerts
    status = json.loads(stepwatch("status", "calm", "--json", cwd=repo).stdout)["loss_health"]
    assert status["state"] == "ok" and status["episodes"] == 0 and status["values"] >= 1900, status  # it was judged
    assert "loss: ok (level " in stepwatch("status", "calm", cwd=repo).stdout


@pytest.mark.slow
def test_a_nan_from_step_35_is_one_alert_naming_35(tmp_path: Path):
    repo, _run_dir, alerts = run(tmp_path, "nan", "--steps", "60", "--nan_at", "35")
    bad = [x for x in alerts if x["alert_kind"].startswith("loss_") or x["alert_kind"] == "nonfinite_loss"]
    assert [x["alert_kind"] for x in bad] == ["nonfinite_loss"], bad
    assert "first at step 35" in bad[0]["message"], bad[0]
    status = json.loads(stepwatch("status", "nan", "--json", cwd=repo).stdout)["loss_health"]
    assert status["state"] == "catastrophic" and status["episode"]["onset_step"] == 35, status
