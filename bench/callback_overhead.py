"""What StepwatchCallback costs a real ``transformers.Trainer`` run, per optimizer step.

    python bench/callback_overhead.py [--quick] [--pairs N] [--block K] [--json FILE]

A tiny randomly initialised causal LM (``LlamaConfig``, as assets/demo_train.py: nothing downloaded,
synthetic token ids, CPU, one torch thread), one ``Trainer``, one ``train()``. ``STEPWATCH_RUN_DIR``
points at a temporary dir, so every event is really written and flushed. The optimizer steps are cut
into blocks of ``--block`` steps; in A blocks the per-step hooks of ``StepwatchCallback``
(``on_step_begin``, ``on_step_end``, ``on_log``) are not called (bare), in B blocks they are (its
``on_train_begin`` / ``on_train_end`` always run). Blocks are paired A B, B A, A B, ... so the two
sides of a pair are a few tens of milliseconds apart: on a shared machine, whole ``train()`` runs
drift by +-50 % from one to the next, adjacent blocks do not. A timing callback, last in the list,
stamps ``perf_counter()`` at each ``on_step_end``; a block's figure is the median step interval in
it. The figure is the median of the per-pair ratios B/A, with their spread; 2 warm-up pairs (the
first steps build the optimizer) are dropped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import new_result, ratio_of_pairs, spread, write_json  # noqa: E402

TARGET = 1.02


def measure(pairs: int, block: int, hidden: int, seq_len: int, batch: int, run_dir: str) -> dict:
    os.environ["STEPWATCH_RUN_DIR"] = run_dir
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    t_imp = time.perf_counter()
    import torch
    from torch.utils.data import Dataset
    from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback, TrainingArguments
    from transformers.utils import logging as hf_logging

    from stepwatch.telemetry import StepwatchCallback

    hf_logging.set_verbosity_error()
    import_s = time.perf_counter() - t_imp
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Tokens(Dataset):
        def __init__(self, n: int):
            g = torch.Generator().manual_seed(0)
            self.items = [torch.randint(0, 256, (seq_len,), generator=g) for _ in range(n)]

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int) -> dict:
            x = self.items[i]
            return {"input_ids": x, "labels": x, "attention_mask": torch.ones_like(x)}

    class Clock(TrainerCallback):
        """Stamps the end of every optimizer step (last in the list: the callback's work lands in its step)."""

        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.stamps.append(time.perf_counter())

    def mode_of(step: int) -> str:
        """'A' (bare) or 'B' (with the callback) for 1-based optimizer step ``step``: blocks of
        ``block`` steps, pairs of blocks ordered A B, then B A, then A B, ..."""
        b = (step - 1) // block
        first = "A" if (b // 2) % 2 == 0 else "B"
        return first if b % 2 == 0 else ("B" if first == "A" else "A")

    class Toggle(TrainerCallback):
        """Forwards every Trainer event to StepwatchCallback, except the per-step ones of A blocks."""

        def __init__(self, inner) -> None:
            self.inner = inner
            self.on = False

        def on_train_begin(self, args, state, control, **kw):
            return self.inner.on_train_begin(args, state, control, **kw)

        def on_train_end(self, args, state, control, **kw):
            return self.inner.on_train_end(args, state, control, **kw)

        def on_step_begin(self, args, state, control, **kw):
            self.on = mode_of(state.global_step + 1) == "B"
            if self.on:
                return self.inner.on_step_begin(args, state, control, **kw)

        def on_step_end(self, args, state, control, **kw):
            if self.on:
                return self.inner.on_step_end(args, state, control, **kw)

        def on_log(self, args, state, control, **kw):
            if self.on:
                return self.inner.on_log(args, state, control, **kw)

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=256, max_position_embeddings=max(256, seq_len))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    out_dir = tempfile.mkdtemp(prefix="stepwatch-bench-trainer-")
    # warm-up blocks (2 pairs) + measured pairs; the first steps (optimizer creation) fall in the warm-up
    warm_pairs = 2
    steps = (pairs + warm_pairs) * 2 * block
    try:
        targs = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=batch,
                                  learning_rate=1e-4, logging_steps=10, save_strategy="no", report_to="none",
                                  disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, seed=0)
        clock = Clock()
        toggle = Toggle(StepwatchCallback(attn_implementation_requested="sdpa"))
        trainer = Trainer(model=model, args=targs, train_dataset=Tokens(steps * batch), callbacks=[toggle, clock])
        import contextlib
        import io

        t_train = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its log dicts
            trainer.train()
        train_s = time.perf_counter() - t_train
        st = clock.stamps
        # interval i (i >= 1) is optimizer step i + 1: from the end of step i to the end of step i + 1
        by_block: dict[int, list[float]] = {}
        for i in range(1, len(st)):
            step = i + 1
            by_block.setdefault((step - 1) // block, []).append(st[i] - st[i - 1])
        pr = []
        for p in range(warm_pairs, pairs + warm_pairs):
            b0, b1 = 2 * p, 2 * p + 1
            if b0 not in by_block or b1 not in by_block:
                continue
            m0, m1 = statistics.median(by_block[b0]), statistics.median(by_block[b1])
            a_, b_ = (m0, m1) if mode_of(b0 * block + 1) == "A" else (m1, m0)
            pr.append((a_, b_))
        # cross-check: the callback's per-step hooks alone, in a tight loop on the Trainer's own state
        micro = StepwatchCallback(attn_implementation_requested="sdpa")
        state, control = trainer.state, trainer.control
        micro.on_train_begin(targs, state, control, model=model)
        gs0, hook_us = state.global_step, []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(400):
                state.global_step += 1
                micro.on_step_begin(targs, state, control)
                micro.on_step_end(targs, state, control)
            hook_us.append((time.perf_counter() - t0) / 400 * 1e6)
        state.global_step = gs0
        micro.on_train_end(targs, state, control)
        hooks_us = statistics.median(hook_us)
        events = Path(run_dir, "events.jsonl")
        n_events = events.read_bytes().count(b"\n") if events.exists() else 0
        n_step_events = events.read_bytes().count(b'"kind":"step"') if events.exists() else 0
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    rat = ratio_of_pairs(pr)
    a_med = statistics.median(p[0] for p in pr)
    b_med = statistics.median(p[1] for p in pr)
    return {"ratio": rat, "ratios": sorted(b / a for a, b in pr if a > 0), "bare_step_s": a_med, "with_callback_step_s": b_med,
            "delta_us_per_step": spread((b - a) * 1e6 for a, b in pr), "pairs": len(pr), "block_steps": block,
            "train_steps": steps, "train_s": train_s, "step_events_written": n_step_events,
            "model": {"hidden": hidden, "layers": 2, "seq_len": seq_len, "batch": batch,
                      "params": sum(p.numel() for p in model.parameters())},
            "hooks_us_per_step_tight_loop": hooks_us,
            "ratio_implied_by_tight_loop_hooks": 1 + hooks_us * 1e-6 / a_med if a_med else None,
            "import_s": import_s, "events_written": n_events,
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 pairs instead of 300")
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--block", type=int, default=5, help="steps per block (default 5)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    pairs = a.pairs or (60 if a.quick else 300)
    res = new_result("callback_overhead", a.quick)
    key = "callback_overhead_ratio"
    res["figures"][key] = None
    run_dir = tempfile.mkdtemp(prefix="stepwatch-bench-cb-")
    try:
        r = measure(pairs, a.block, a.hidden, a.seq_len, a.batch, run_dir)
        res["details"] = r
        res["figures"][key] = r["ratio"]["median"]
        res["spreads"][key] = r["ratio"]
        res["baselines"][key] = {"what": "the same Trainer's steps without the callback's hooks (median step)",
                                 "value": r["bare_step_s"], "unit": "s"}
        b_steps = (pairs + 2) * a.block + 2000  # B blocks, warm-up included, and the cross-check's steps
        if r["step_events_written"] < b_steps - 1:
            res["notes"][key] = f"only {r['step_events_written']} step events were written for {b_steps} B steps"
        s = r["ratio"]
        print(f"Trainer step {r['bare_step_s'] * 1e3:.2f} ms bare, {r['with_callback_step_s'] * 1e3:.2f} ms with "
              f"StepwatchCallback: ratio median {s['median']:.4f} (p10 {s['p10']:.4f}, p90 {s['p90']:.4f}; "
              f"{r['pairs']} pairs of {a.block}-step blocks; target <= {TARGET}); delta median "
              f"{r['delta_us_per_step']['median']:+.1f} us/step; {r['step_events_written']} step events written")
        print(f"cross-check: the callback's step hooks alone cost {r['hooks_us_per_step_tight_loop']:.1f} us/step in "
              f"a tight loop (would be a ratio of {r['ratio_implied_by_tight_loop_hooks']:.4f})")
    except Exception as e:
        res["notes"][key] = f"{type(e).__name__}: {e}"
        print(f"callback_overhead failed: {e!r}")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
