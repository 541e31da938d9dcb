"""stepwatch's bundled demo job: a tiny randomly initialised causal LM trained with
``transformers.Trainer`` on synthetic token ids, on the CPU, with ``StepwatchCallback``.

Nothing is downloaded: the model is built from a ``LlamaConfig``, the data are random integers.
Flags make it show each of stepwatch's alerts on a real process:

  --crash-at STEP     raise at the start of that optimizer step (watchdog alert, traceback)
  --hang-at STEP      stop making progress at that step (stall)
  --fallback-at STEP  SIMULATION of a silent dynamo fallback to eager: from that step on, every step
                      really runs ~20x more work (extra matmuls) so step times jump (fallback alert)
  --compile           torch.compile(dynamic=False) with recompile_limit lowered to 2 and batches of
                      changing length, to reach dynamo's real recompile-limit warning (slow on a CPU:
                      each compile takes 15-25 s on two cores)

Run it through stepwatch (``stepwatch demo``); run alone it trains and writes no telemetry.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback, TrainingArguments

from stepwatch.telemetry import StepwatchCallback

ATTN_IMPLEMENTATION = "sdpa"  # what this harness asks for; the callback records what it resolved to


class SyntheticTokens(Dataset):
    """``n`` random token sequences (length ``seq_len``, or a random length per item with ``varlen``)."""

    def __init__(self, n: int, seq_len: int, vocab: int, varlen: bool, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        rnd = random.Random(seed)
        lengths = [max(8, seq_len // 4 * k) for k in (1, 2, 3, 4)]
        self.items = [torch.randint(0, vocab, (rnd.choice(lengths) if varlen else seq_len,), generator=g)
                      for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.items[i]}


def collate(batch: list[dict]) -> dict:
    """Right-pad to the longest sequence: pad id 0, label -100, attention_mask 0."""
    length = max(b["input_ids"].shape[0] for b in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    att = torch.zeros(len(batch), length, dtype=torch.long)
    for i, b in enumerate(batch):
        n = b["input_ids"].shape[0]
        ids[i, :n] = b["input_ids"]
        labels[i, :n] = b["input_ids"]
        att[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": att}


class DemoFaults(TrainerCallback):
    """Injects the demo's crash, hang and (simulated) fallback at the given optimizer steps."""

    def __init__(self, crash_at: int | None, hang_at: int | None, fallback_at: int | None, factor: float):
        self.crash_at, self.hang_at, self.fallback_at, self.factor = crash_at, hang_at, fallback_at, factor
        self.step_times: list[float] = []
        self._t_end: float | None = None
        self._announced = False

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step + 1  # the optimizer step now starting
        if self.crash_at is not None and step == self.crash_at:
            raise RuntimeError(f"demo crash at step {step} (--crash-at {self.crash_at})")
        if self.hang_at is not None and step == self.hang_at:
            print(f"demo: hanging at step {step} (--hang-at {self.hang_at}); the process stays alive", flush=True)
            while True:
                time.sleep(3600)
        if self.fallback_at is not None and step >= self.fallback_at:
            if not self._announced:
                print(f"demo: SIMULATION of a dynamo fallback to eager from step {step} (--fallback-at): each step "
                      f"now runs ~{self.factor:g}x the work", flush=True)
                self._announced = True
            base = sorted(self.step_times)[len(self.step_times) // 2] if self.step_times else 0.05
            _burn(base * (self.factor - 1))

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._t_end is not None and (self.fallback_at is None or state.global_step < self.fallback_at):
            self.step_times.append(now - self._t_end)
        self._t_end = now


def _burn(seconds: float) -> None:
    """Real extra compute (matmuls) for about ``seconds``: the simulated eager fallback's cost."""
    a = torch.randn(256, 256)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps (default 150, about a minute)")
    ap.add_argument("--hidden", type=int, default=256, help="model width (default 256: ~0.5 s/step on 2 cores)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (0: never)")
    ap.add_argument("--crash-at", type=int)
    ap.add_argument("--hang-at", type=int)
    ap.add_argument("--fallback-at", type=int)
    ap.add_argument("--fallback-factor", type=float, default=20.0)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=2 * a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                      max_position_embeddings=max(256, a.seq_len))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=ATTN_IMPLEMENTATION)
    if a.compile:
        import torch._dynamo as dynamo

        dynamo.config.recompile_limit = 2
        model.forward = torch.compile(model.forward, dynamic=False)
        print("demo: torch.compile(dynamic=False), recompile_limit=2, batches of changing length", flush=True)
    ds = SyntheticTokens(a.steps * a.batch, a.seq_len, cfg.vocab_size, varlen=a.compile)
    scratch = tempfile.TemporaryDirectory(prefix="stepwatch-demo-out-")  # removed at exit: ~95 MB per run
    out_dir = scratch.name
    targs = TrainingArguments(
        output_dir=out_dir, max_steps=a.steps, per_device_train_batch_size=a.batch, learning_rate=1e-3,
        warmup_steps=5, logging_steps=10, save_strategy="steps" if a.save_every else "no",
        save_steps=a.save_every or 500, report_to="none", disable_tqdm=False, use_cpu=True,
        dataloader_num_workers=0, seed=0,
    )
    print(f"demo: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, {a.steps} steps, "
          f"checkpoints in {out_dir} (removed at exit)", flush=True)
    trainer = Trainer(model=model, args=targs, train_dataset=ds, data_collator=collate, callbacks=[
        StepwatchCallback(attn_implementation_requested=ATTN_IMPLEMENTATION),
        DemoFaults(a.crash_at, a.hang_at, a.fallback_at, a.fallback_factor),
    ])
    try:
        out = trainer.train()
    finally:
        scratch.cleanup()
    loss = out.training_loss
    print(f"demo: done, training loss {loss:.4f}{'' if math.isfinite(loss) else ' (not finite!)'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
