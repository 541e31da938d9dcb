"""The step's scaling curve from the run itself (issue 20; playbook 1.1, 1.2, 3.1): controls on
synthetic step streams whose truth is known, the whole path from events.jsonl to ``status --json``,
and a real tiny Trainer run with dynamic padding on the CPU."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from conftest import stepwatch
from stepwatch.monitors.detectors.scaling import ScalingFit

WIDTHS = [64, 96, 128, 192, 256, 384, 512]


def stream(a: float, b: float, c: float, widths=WIDTHS, n: int = 300, noise: float = 0.01, seqs: int = 8,
           seed: int = 1) -> list[tuple[float, int, int, int, int]]:
    """(seconds, padded tokens, width, sequences, real tokens) of ``n`` steps: t = a·Σbw + b·Σbw² + c, with
    ``noise`` relative Gaussian jitter; every third step unpadded."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        w = r.choice(widths)
        x1, x2 = seqs * w, seqs * w * w
        t = (a * x1 + b * x2 + c) * (1 + noise * r.gauss(0, 1))
        out.append((t, x1, w, seqs, x1 if i % 3 == 0 else x1 - r.randint(1, x1 // 4)))
    return out


def fit(points) -> ScalingFit:
    f = ScalingFit()
    for t, x1, w, b, tok in points:
        f.add(t, x1, w, b, tok, False)
    return f


def test_a_pure_linear_stream_reads_linear():
    s = fit(stream(1e-5, 0.0, 0.0005)).scaling()
    assert s["verdict"] == "linear", s
    assert s["a_s_per_token"] == pytest.approx(1e-5, rel=0.05) and s["shares"]["linear"] > 0.9


def test_a_stream_half_quadratic_at_its_widths_reads_quadratic_with_a_and_b_within_5_percent():
    e_w = sum(WIDTHS) / len(WIDTHS)
    b = 1e-5 / e_w  # the quadratic term equals the linear one at E[w]: ~50% of the step there
    s = fit(stream(1e-5, b, 0.0005)).scaling()
    assert s["verdict"] == "quadratic", s
    assert s["a_s_per_token"] == pytest.approx(1e-5, rel=0.05)
    assert s["b_s_per_token_width"] == pytest.approx(b, rel=0.05)
    assert 0.4 < s["shares"]["quadratic"] < 0.7
    assert s["a_se"] > 0 and s["b_se"] > 0 and s["residual_s"] > 0  # the uncertainty and the residuals, reported
    assert s["e_w2_over_e_w_sq"] > 1  # E[w²] is not E[w]²


def test_a_large_constant_reads_launch_bound():
    s = fit(stream(1e-7, 0.0, 0.2)).scaling()
    assert s["verdict"] == "launch-bound" and s["shares"]["constant"] > 0.9, s


def test_two_widths_or_residuals_that_do_not_close_read_undetermined_and_say_why():
    two = fit(stream(1e-5, 1e-8, 0.0005, widths=[128, 256])).scaling()
    assert two["verdict"] == "undetermined" and "2 distinct width(s)" in two["reason"], two
    noisy = fit(stream(1e-5, 0.0, 0.0005, noise=0.8)).scaling()
    assert noisy["verdict"] == "undetermined" and "residuals do not close" in noisy["reason"], noisy
    narrow = fit(stream(1e-5, 0.0, 0.0005, widths=[200, 210, 220, 230])).scaling()
    assert narrow["verdict"] == "undetermined" and "spread" in narrow["reason"], narrow
    assert ScalingFit().scaling()["reason"].startswith("no step records the batch shape")
    # controls: the same streams with three spread widths, or less noise, do judge
    assert fit(stream(1e-5, 0.0, 0.0005, widths=[128, 256, 512])).scaling()["verdict"] == "linear"
    assert fit(stream(1e-5, 0.0, 0.0005, noise=0.02)).scaling()["verdict"] == "linear"


def test_flagged_and_warm_up_steps_are_left_out_of_the_fit():
    pts = stream(1e-5, 0.0, 0.0005)
    f = ScalingFit()
    for i, (t, x1, w, b, tok) in enumerate(pts):
        f.add(t * (40 if i % 10 == 0 else 1), x1, w, b, tok, i % 10 == 0)  # a flagged save step, 40x slower
    s = f.scaling()
    assert s["verdict"] == "linear" and s["steps"] == len(pts) - len(pts) // 10 - 5, s


def test_padding_share_unpadded_steps_and_the_padded_excess_at_equal_width():
    pts = [(t * (1.0 if tok == x1 else 1.1), x1, w, b, tok) for t, x1, w, b, tok in stream(1e-5, 0.0, 0.0005, noise=0)]
    p = fit(pts).padding()
    assert p["unpadded_share"] == pytest.approx(1 / 3, abs=0.01)
    assert 0 < p["share"] < 0.25
    assert p["same_width"] and all(x["padded_excess"] == pytest.approx(0.1, abs=1e-6) for x in p["same_width"])


def _events_run(run_dir: Path, points) -> None:
    run_dir.mkdir(parents=True)
    t0 = 1_780_000_000.0
    (run_dir / "run.json").write_text(json.dumps({"v": 1, "name": run_dir.name, "attempt": 1, "launched_at_unix": t0,
                                                  "process": {"pid": 2_147_483_000, "create_time": t0}}))
    lines, t = [], t0
    for i, (dt, x1, w, b, tok) in enumerate(points, start=1):
        lines.append(json.dumps({"v": 1, "kind": "step", "t": t + dt, "step": i, "rank": 0, "dt": dt, "step_begin": t,
                                 "step_end": t + dt, "tokens": tok, "padded_tokens": x1,
                                 "flags": ["first"] if i == 1 else [], "batch_size": b, "width": w}))
        t += dt
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "exit.json").write_text(json.dumps({"returncode": 0, "signal": None, "ended_at_unix": t}))


def test_status_json_and_plain_words_carry_the_fit_from_the_events(tmp_path: Path):
    e_w = sum(WIDTHS) / len(WIDTHS)
    _events_run(tmp_path / "runs" / "quad", stream(1e-5, 1e-5 / e_w, 0.0005))
    snap = json.loads(stepwatch("status", str(tmp_path / "runs" / "quad"), "--json").stdout)
    assert snap["scaling"]["verdict"] == "quadratic" and snap["padding"]["unpadded_share"] > 0.3
    plain = stepwatch("status", str(tmp_path / "runs" / "quad")).stdout
    assert "scaling: quadratic: attention (w²) is ~" in plain and "% of the step at the run's widths" in plain, plain
    assert "% of steps unpadded" in plain


def test_a_real_trainer_run_with_dynamic_padding_records_widths_and_gets_a_verdict(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from stepwatch.monitors.fold.events import EventsFold
    from stepwatch.monitors.readers.jsonl import EventReader
    from stepwatch.telemetry import StepwatchCallback

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("STEPWATCH_RUN_DIR", str(run_dir))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=256, max_position_embeddings=512)
    g, rnd = torch.Generator().manual_seed(0), random.Random(0)
    items = [torch.randint(0, 256, (rnd.choice([8, 24, 48, 96, 160, 256]),), generator=g) for _ in range(160)]

    class Varied(torch.utils.data.Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return {"input_ids": items[i]}

    def collate(batch):  # dynamic padding: to the batch's longest sequence
        L = max(b["input_ids"].shape[0] for b in batch)
        ids = torch.zeros(len(batch), L, dtype=torch.long)
        att = torch.zeros(len(batch), L, dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, :b["input_ids"].shape[0]] = b["input_ids"]
            att[i, :b["input_ids"].shape[0]] = 1
        labels = ids.masked_fill(att == 0, -100)
        return {"input_ids": ids, "labels": labels, "attention_mask": att}

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=60, per_device_train_batch_size=2,
                             learning_rate=1e-3, save_strategy="no", report_to="none", disable_tqdm=True,
                             use_cpu=True, dataloader_num_workers=0, seed=0, logging_steps=1000)
    Trainer(model=LlamaForCausalLM(cfg), args=args, train_dataset=Varied(), data_collator=collate,
            callbacks=[StepwatchCallback()]).train()
    steps = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines() if '"kind":"step"' in ln]
    assert len(steps) == 60 and all(ev["batch_size"] == 2 and ev["width"] in (8, 24, 48, 96, 160, 256) for ev in steps)
    assert all(ev["tokens"] <= ev["padded_tokens"] == 2 * ev["width"] for ev in steps)  # the mask's sum, on the CPU
    fold = EventsFold()
    fold.fold(EventReader(run_dir / "events.jsonl"))
    s = fold.scaling.scaling()
    assert s["verdict"] in ("linear", "quadratic", "launch-bound", "undetermined") and s["steps"] >= 40, s
    assert s["residual_s"] is not None and s["r2"] is not None, s  # a fit, with its residuals
    assert s["e_w2_over_e_w_sq"] > 1, s
    assert fold.scaling.padding()["share"] > 0


def test_the_callbacks_shapes_sum_a_steps_micro_batches_token_weighted():
    """Gradient accumulation: the micro-batches of one optimizer step are summed; the width is
    Σb·w² / Σb·w, so padded tokens × width = Σb·w² (the fit's second regressor) holds exactly."""
    torch = pytest.importorskip("torch")
    from stepwatch.telemetry.hf import BatchShapes

    class Model(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None):
            return input_ids

    m, shapes = Model(), BatchShapes()
    shapes.install(m)
    m.train()
    for b, w, real in ((4, 64, 200), (2, 128, 250)):  # two micro-batches of one step
        mask = torch.zeros(b, w, dtype=torch.long)
        mask.view(-1)[:real] = 1
        m(input_ids=torch.zeros(b, w, dtype=torch.long), attention_mask=mask)
    m.eval()
    m(input_ids=torch.zeros(8, 512, dtype=torch.long))  # an evaluation's forward: not the step's
    batch, width, padded, real = shapes.take()
    assert (batch, padded, real) == (6, 4 * 64 + 2 * 128, 450)
    assert padded * width == pytest.approx(4 * 64 ** 2 + 2 * 128 ** 2, rel=1e-5)
    m.train()
    m(input_ids=torch.zeros(3, 32, dtype=torch.long), attention_mask=torch.ones(3, 32, dtype=torch.long))
    assert shapes.take() == (3, 32, 96, 96)  # one width: an int, and the reset after take
    shapes.remove()
    m(input_ids=torch.zeros(3, 32, dtype=torch.long))
    assert shapes.take() == (None, None, None, None)  # removed: the hook sees nothing more
