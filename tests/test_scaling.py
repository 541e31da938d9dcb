"""The step's scaling curve from the run itself (step seconds as a·Σbw + b·Σbw² + c): controls on
synthetic step streams whose truth is known, the whole path from events.jsonl to ``status --json``,
and a real tiny Trainer run with dynamic padding on the CPU."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import stepwatch
from stepwatch.monitors.detectors.scaling import MIN_POINTS, MIN_SPREAD, SKIP_STEPS, ScalingFit

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


@pytest.mark.system
def test_status_json_and_plain_words_carry_the_fit_from_the_events(tmp_path: Path):
    e_w = sum(WIDTHS) / len(WIDTHS)
    _events_run(tmp_path / "runs" / "quad", stream(1e-5, 1e-5 / e_w, 0.0005))
    snap = json.loads(stepwatch("status", str(tmp_path / "runs" / "quad"), "--json").stdout)
    assert snap["scaling"]["verdict"] == "quadratic" and snap["padding"]["unpadded_share"] > 0.3
    plain = stepwatch("status", str(tmp_path / "runs" / "quad")).stdout
    assert "scaling: quadratic: attention (w²) is ~" in plain and "% of the step at the run's widths" in plain, plain
    assert "% of steps unpadded" in plain


@pytest.mark.system
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


@pytest.mark.system
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


# ------------------------------------------------------------------------------------------------
# ScalingFit's figures to their printed digits: the fit's parameters, standard errors, R², residual and shares
# against numpy's least squares on the same points; which steps are taken; the spread and count gates at their
# edges; the width moments; the padding figures and their cut.


SEQS = 4


def _fit(rows, skip: bool = True) -> ScalingFit:
    """``rows``: (seconds, width) at SEQS sequences, every step padded (real tokens 3/4 of the padded)."""
    f = ScalingFit()
    if skip:
        for _ in range(SKIP_STEPS):
            f.add(9.0, SEQS * 100, 100, SEQS, None, False)  # warm-up steps: left out
    for dt, w in rows:
        f.add(dt, SEQS * w, w, SEQS, None, False)
    return f


def _reference(rows):
    """numpy's least squares of the same points: (a, b, c), R², residual RMS, standard errors."""
    x = np.array([[SEQS * w, SEQS * w * w, 1.0] for _, w in rows], dtype=float)
    y = np.array([dt for dt, _ in rows], dtype=float)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    rss = float(resid @ resid)
    tss = float(((y - y.mean()) ** 2).sum())
    n = len(rows)
    cov = rss / (n - 3) * np.linalg.inv(x.T @ x)
    return beta, 1.0 - rss / tss, math.sqrt(rss / n), np.sqrt(np.diag(cov)), float(y.mean()), x.mean(axis=0)


def _noisy_rows(a, b, c, n=40, widths=(64, 96, 128, 192, 256)):
    wobble = [0.03, -0.02, 0.01, -0.04, 0.02, 0.0, -0.01, 0.035]
    rows = []
    for i in range(n):
        w = widths[i % len(widths)]
        rows.append(((a * SEQS * w + b * SEQS * w * w + c) * (1 + wobble[i % len(wobble)]), w))
    return rows


def _digits_safe(x: float, nd: int) -> bool:
    """x is not within 1e-9 of a rounding boundary at nd decimals (a reference computed another way
    rounds the same)."""
    scaled = abs(x) * 10**nd
    return abs(scaled - math.floor(scaled) - 0.5) > 1e-9 * max(1.0, scaled)


def test_the_fit_matches_numpys_least_squares_to_the_printed_digits():
    rows = _noisy_rows(2e-5, 1e-7, 0.004)
    s = _fit(rows).scaling()
    beta, r2, resid, se, mean_y, mean_x = _reference(rows)
    assert s["steps"] == len(rows) and s["distinct_widths"] == 5
    for got, want in zip((s["a_s_per_token"], s["b_s_per_token_width"], s["c_s"]), beta):
        assert got == pytest.approx(want, rel=1e-6)
    for got, want in zip((s["a_se"], s["b_se"], s["c_se"]), se):
        assert got == pytest.approx(want, rel=1e-6)
    assert _digits_safe(r2, 5) and s["r2"] == round(r2, 5)
    assert _digits_safe(resid, 6) and s["residual_s"] == round(resid, 6)
    assert s["residual_share"] == round(resid / mean_y, 4)
    parts = {"linear": beta[0] * mean_x[0], "quadratic": beta[1] * mean_x[1], "constant": beta[2]}
    total = sum(max(0.0, v) for v in parts.values())
    want_shares = {k: round(max(0.0, v) / total, 4) for k, v in parts.items()}
    assert all(_digits_safe(max(0.0, v) / total, 4) for v in parts.values())
    assert s["shares"] == want_shares and s["verdict"] in ("linear", "quadratic", "launch-bound")


def test_a_negative_term_counts_as_zero_in_the_shares():
    """A fit whose constant comes out negative (a per-token cost that grows with the width): the
    shares are of the positive terms only, and still sum to 1."""
    rows = _noisy_rows(3e-5, 2e-7, -0.01, widths=(128, 192, 256, 384))
    s = _fit(rows).scaling()
    beta, *_rest, mean_y, mean_x = _reference(rows)
    assert beta[2] < 0 and s["c_s"] == pytest.approx(beta[2], rel=1e-6)
    lin, quad = beta[0] * mean_x[0], beta[1] * mean_x[1]
    assert s["shares"] == {"linear": round(lin / (lin + quad), 4), "quadratic": round(quad / (lin + quad), 4),
                           "constant": 0.0}


def test_constant_step_times_have_r2_1_and_a_launch_bound_verdict():
    """Every step the same 0.25 s whatever its width: nothing to explain (total sum of squares 0),
    R² 1.0, the constant all of the step."""
    s = _fit([(0.25, w) for w in (64, 96, 128, 192, 256) * 4]).scaling()
    assert (s["verdict"], s["r2"], s["residual_s"], s["shares"]["constant"]) == ("launch-bound", 1.0, 0.0, 1.0)


def test_steps_of_zero_seconds_are_undetermined_not_a_crash():
    s = _fit([(0.0, w) for w in (64, 96, 128, 192, 256) * 4]).scaling()
    assert s["verdict"] == "undetermined" and s["residual_share"] is None
    assert s["reason"].startswith("the residuals do not close")


def test_residuals_that_do_not_close_give_their_share_in_words():
    rows = [(0.01 * (1 + (3.0 if i % 2 else -0.6)), w) for i, w in enumerate((64, 96, 128, 192, 256) * 4)]
    s = _fit(rows).scaling()
    rel = s["residual_share"]
    assert s["verdict"] == "undetermined" and rel > 0.1
    assert s["reason"] == (f"the residuals do not close: their RMS is {100 * rel:.0f}% of the mean step (at most 10%; "
                           f"R² {s['r2']:.2f}): the step time depends on more than the batch shape")


@pytest.mark.parametrize("widths, spread_ok", [((100, 125, 150), True), ((100, 125, 149), False)])
def test_the_width_spread_gate_is_at_exactly_1_5x(widths, spread_ok):
    assert MIN_SPREAD == 1.5
    s = _fit([(1e-5 * SEQS * w + 0.01, w) for w in widths * 5]).scaling()
    assert (s["reason"] is None or not s["reason"].startswith("widths")) == spread_ok, s["reason"]
    if not spread_ok:
        assert s["reason"] == "widths 100..149 spread less than 1.5x: the terms cannot be told apart"


@pytest.mark.parametrize("accepted, args", [
    (True, (0.1, 4 * 100, 100, 4, None)),
    (True, (0.1, 999_999_999_999_999, 100, 4, None)),  # just below 1e15 padded tokens
    (True, (0.0, 400, 999_999_999, 4, None)),  # a width just below 1e9; a 0 s step
    (True, (0.1, 1, 1, 1, None)),  # one sequence of one token
    (False, (0.1, 400, -100, 4, None)),
    (False, (0.1, 400, 2e9, 4, None)),
    (True, (9_999_999.5, 400, 100, 4, None)),  # just below 1e7 s
    (False, (1e7 + 1, 400, 100, 4, None)),
    (False, (0.1, 2 * 10**15, 100, 4, None)),
    (False, (0.1, 10**15, 100, 4, None)),
    (False, (0.1, -400, 100, 4, None)),
    (False, (0.1, 0, 100, 4, None)),
    (False, (0.1, 400, 0, 4, None)),
    (False, (0.1, 400, 10**9, 4, None)),
    (False, (0.1, 400, "100", 4, None)),
    (False, (-0.1, 400, 100, 4, None)),
    (False, (1e7, 400, 100, 4, None)),
])
def test_which_steps_are_taken(accepted, args):
    f = ScalingFit()
    for _ in range(SKIP_STEPS + 1):
        f.add(*args, False)
    f.add(*args[:4], 300, False)  # with real tokens too: counted in the padding figures when taken
    assert f.scaling()["steps"] == (2 if accepted else 0)
    assert f.padding()["steps"] == (1 if accepted and args[1] >= 300 else 0)


def test_too_few_points_say_how_many():
    s = _fit([(1e-5 * SEQS * w + 0.01, w) for w in (64, 128, 256) * 3 + (64, 128)]).scaling()
    assert s["reason"] == f"11 steps fitted: at least {MIN_POINTS} needed"
    s = _fit([(1e-5 * SEQS * w + 0.01, w) for w in (64, 128, 256) * 4]).scaling()
    assert MIN_POINTS == 12 and s["steps"] == 12 and s["reason"] is None and s["verdict"] != "undetermined"


@pytest.mark.parametrize("tokens, counted", [(0, True), (400, True), (401, False), (-1, False), (-5, False), (None, False)])
def test_which_real_token_counts_go_into_the_padding(tokens, counted):
    f = ScalingFit()
    f.add(0.1, 400, 100, 4, tokens, False)
    p = f.padding()
    assert p["steps"] == (1 if counted else 0)
    if counted:
        assert p["share"] == round(1 - tokens / 400, 4)


def test_a_step_without_sequences_is_fitted_but_not_in_the_width_moments():
    f = ScalingFit()
    for _ in range(SKIP_STEPS):
        f.add(1.0, 999, 999, 1, None, False)
    f.add(0.1, 400, 100, 0, None, False)  # batch size 0: no sequences to weigh
    f.add(0.1, 64, 64, 1, None, False)
    s = f.scaling()
    assert s["steps"] == 2 and (s["e_w"], s["e_w2"]) == (64.0, 4096.0)


def test_the_width_moments_of_one_sequence_and_of_many():
    """E[w], E[w²] per sequence and their ratio, from the fitted steps' batch sizes (the warm-up's
    left out); a single fitted sequence already gives them."""
    f = ScalingFit()
    for _ in range(SKIP_STEPS):
        f.add(1.0, 999, 999, 1, None, False)
    f.add(0.1, 64, 64, 1, None, False)  # one sequence of width 64
    s = f.scaling()
    assert (s["e_w"], s["e_w2"], s["e_w2_over_e_w_sq"]) == (64.0, 4096.0, 1.0)
    f.add(0.3, 3 * 128, 128, 3, None, False)  # three of width 128
    s = f.scaling()
    e_w, e_w2 = (64 + 3 * 128) / 4, (64**2 + 3 * 128**2) / 4
    assert (s["e_w"], s["e_w2"], s["e_w2_over_e_w_sq"]) == (round(e_w, 3), round(e_w2, 3), round(e_w2 / e_w**2, 4))
    assert s["e_w2_over_e_w_sq"] == 1.0612  # 13312 / 112**2


def test_the_padding_figures_from_the_first_step_and_their_cut_at_16_widths():
    f = ScalingFit()
    f.add(0.5, 400, 100, 4, 300, True)  # a flagged step still counts for the padding
    p = f.padding()
    assert (p["steps"], p["share"], p["unpadded_steps"], p["unpadded_share"]) == (1, 0.25, 0, 0.0)
    f = ScalingFit()
    for w in range(100, 117):  # 17 widths, each padded and unpadded once
        f.add(0.1234567, 4 * w, w, 4, 4 * w - 1, False)
        f.add(0.1000004, 4 * w, w, 4, 4 * w, False)
    rows = f.padding()["same_width"]
    assert [r["width"] for r in rows] == list(range(100, 116))
    assert rows[0] == {"width": 100, "padded_s": 0.123457, "unpadded_s": 0.1, "padded_steps": 1,
                       "unpadded_steps": 1, "padded_excess": 0.2346}
    f = ScalingFit()
    f.add(0.1, 400, 100, 4, 399, False)
    f.add(0.0765432, 400, 100, 4, 400, False)  # 7 decimals: printed to 6
    assert f.padding()["same_width"][0]["unpadded_s"] == 0.076543


def test_unpadded_steps_of_zero_seconds_give_no_excess():
    f = ScalingFit()
    f.add(0.2, 400, 100, 4, 300, False)
    f.add(0.0, 400, 100, 4, 400, False)
    [row] = f.padding()["same_width"]
    assert (row["padded_s"], row["unpadded_s"], row["padded_excess"]) == (0.2, 0.0, None)


def test_the_width_moments_to_their_printed_digits():
    """One sequence of width 63 and two of 65: E[w] = 193/3, E[w²] = 12419/3, neither a short decimal."""
    f = ScalingFit()
    for _ in range(SKIP_STEPS):
        f.add(1.0, 999, 999, 1, None, False)
    f.add(0.1, 63, 63, 1, None, False)
    f.add(0.2, 130, 65, 2, None, False)
    s = f.scaling()
    assert (s["e_w"], s["e_w2"], s["e_w2_over_e_w_sq"]) == (64.333, 4139.667, round((12419 / 3) / (193 / 3) ** 2, 4))


def _exact(a: float, b: float, c: float, widths=(64, 128, 256), n: int = 24):
    return [(a * SEQS * w + b * SEQS * w * w + c, w) for w in widths * (n // len(widths))]


def test_a_constant_term_of_exactly_half_the_step_is_launch_bound():
    mean_x1 = SEQS * (64 + 128 + 256) / 3
    s = _fit(_exact(1e-5, 0.0, 1e-5 * mean_x1)).scaling()
    assert s["shares"]["constant"] == 0.5 and s["verdict"] == "launch-bound"


def test_a_quadratic_term_of_exactly_a_quarter_of_the_step_is_quadratic():
    widths = (64, 128, 256)
    mean_x1, mean_x2 = SEQS * sum(widths) / 3, SEQS * sum(w * w for w in widths) / 3
    a = 1e-5
    lin = a * mean_x1  # linear 1/2, quadratic 1/4, constant 1/4 of the mean step
    s = _fit(_exact(a, lin / 2 / mean_x2, lin / 2, widths)).scaling()
    assert (s["shares"]["linear"], s["shares"]["quadratic"], s["shares"]["constant"]) == (0.5, 0.25, 0.25)
    assert s["verdict"] == "quadratic"


def test_the_padding_shares_to_their_printed_digits_and_a_negative_excess():
    f = ScalingFit()
    f.add(0.05, 300, 100, 3, 100, False)  # a third of the tokens real, and faster than the unpadded step
    f.add(0.1, 300, 100, 3, 300, False)
    f.add(0.1, 300, 100, 3, 300, False)
    p = f.padding()
    assert (p["share"], p["unpadded_share"]) == (round(1 - 700 / 900, 4), round(2 / 3, 4)) == (0.2222, 0.6667)
    assert p["same_width"][0]["padded_excess"] == -0.5


def test_token_budget_batches_are_collinear_with_the_constant_and_say_so():
    """The same padded tokens every step (a token-budget sampler: fewer sequences when they are wider):
    Σb·w is the constant column again, the normal equations are singular."""
    f = ScalingFit()
    for i in range(40):
        w = (64, 128, 256)[i % 3]
        f.add(0.1 + 0.001 * (i % 3), 4096, w, 4096 // w, None, False)
    s = f.scaling()
    assert (s["verdict"], s["a_s_per_token"], s["r2"]) == ("undetermined", None, None)
    assert s["reason"] == "the shapes are collinear (every step has the same width mix): the fit is singular"


def test_constant_step_times_whose_float_sums_dip_below_zero_still_have_r2_1():
    """24 fitted steps of 0.1 s: yᵀy - (Σy)²/n comes out at -2.8e-17 in floats, not 0; R² is 1.0, not
    1 - rss / (a negative hair)."""
    f = ScalingFit()
    for i in range(SKIP_STEPS + 24):
        w = (64, 128, 256)[i % 3]
        f.add(0.1, SEQS * w, w, SEQS, None, False)
    s = f.scaling()
    assert (s["r2"], s["verdict"]) == (1.0, "launch-bound")


def test_the_batch_sizes_counted_in_the_width_moments():
    """Only a batch of 1 to 999,999,999 sequences weighs the moments; 0, negative or 1e9 do not."""
    f = ScalingFit()
    for _ in range(SKIP_STEPS):
        f.add(1.0, 999, 999, 1, None, False)
    for bad in (0, -3, 10**9, 2 * 10**9):
        f.add(0.1, 400, 100, bad, None, False)
    f.add(0.1, 64, 64, 1, None, False)
    f.add(0.1, 999_999_999 * 2, 2, 999_999_999, None, False)
    s = f.scaling()
    seqs = 1 + 999_999_999
    assert s["steps"] == 6 and s["e_w"] == round((64 + 999_999_999 * 2) / seqs, 3)


def test_the_widths_remembered_stop_at_4096():
    """4,200 distinct widths (4,195 fitted after the warm-up): 4,096 are counted and compared padded
    against unpadded; a width seen after the table is full is not, one seen before still is."""
    f = ScalingFit()
    for w in range(1, 4201):
        f.add(0.1, 4 * w, w, 4, 4 * w - 1, False)  # padded steps of 4,100 widths
    for w in (1, 4097):
        f.add(0.1, 4 * w, w, 4, 4 * w, False)  # an unpadded step of a width in the table, and of one past it
    assert f.scaling()["distinct_widths"] == 4096
    assert [r["width"] for r in f.padding()["same_width"]] == [1]


def test_a_fit_over_narrow_widths_matches_numpys_shares():
    """Widths 1, 2, 3 over 13 steps: the mean of Σb·w² (228 / 13) is no integer."""
    widths = (1, 2, 3)
    rows = [(2e-3 * SEQS * w + 1e-3 * SEQS * w * w + 0.01, widths[i % 3]) for i, w in
            enumerate([widths[i % 3] for i in range(13)])]
    s = _fit(rows).scaling()
    beta, *_rest, mean_y, mean_x = _reference(rows)
    parts = {"linear": beta[0] * mean_x[0], "quadratic": beta[1] * mean_x[1], "constant": beta[2]}
    total = sum(max(0.0, v) for v in parts.values())
    assert s["shares"] == {k: round(max(0.0, v) / total, 4) for k, v in parts.items()}
