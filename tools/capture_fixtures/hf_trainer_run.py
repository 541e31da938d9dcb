"""Tiny randomly-initialised Llama trained with the HF Trainer on synthetic token ids.

No hub downloads: the model is built from a LlamaConfig, the data are random ints.
Usage (run by tools/capture_fixtures/capture.sh, from its staging folder):
    python scripts/hf_trainer_run.py --out-dir <run_dir> [--steps 60] [--compile] [--varlen]
        [--disable-tqdm] [--samples N] [--clock FILE]

``--disable-tqdm`` sets ``disable_tqdm=True`` (no bar: PrinterCallback prints the log dicts);
``--samples N`` sizes the dataset (default steps * batch, one epoch; fewer samples make max_steps
span several epochs); ``--clock FILE`` adds a TrainerCallback whose on_step_end writes
``time.time()``, one float per line (the program's own step clock). Defaults leave the run unchanged.
"""
import argparse
import random
import time

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class SyntheticTokens(Dataset):
    def __init__(self, n, seq_len, vocab, varlen, seed=0):
        g = torch.Generator().manual_seed(seed)
        rnd = random.Random(seed)
        self.items = []
        for _ in range(n):
            L = seq_len if not varlen else rnd.choice([17, 33, 49, 65, 81, 97, 113, 129])
            ids = torch.randint(0, vocab, (L,), generator=g)
            self.items.append(ids)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids = self.items[i]
        return {"input_ids": ids, "labels": ids.clone()}


class Clock(TrainerCallback):
    def __init__(self, path):
        self.f = open(path, "w")

    def on_step_end(self, args, state, control, **kwargs):
        self.f.write(f"{time.time()!r}\n")
        self.f.flush()


SHAPE_LOG = None  # optional file: one padded batch length per line, in fetch order


def collate(batch):
    # pad to the longest in the batch with token 0 and label -100
    L = max(b["input_ids"].shape[0] for b in batch)
    if SHAPE_LOG:
        with open(SHAPE_LOG, "a") as f:
            f.write("%d\n" % L)
    ids = torch.zeros(len(batch), L, dtype=torch.long)
    labels = torch.full((len(batch), L), -100, dtype=torch.long)
    att = torch.zeros(len(batch), L, dtype=torch.long)
    for i, b in enumerate(batch):
        n = b["input_ids"].shape[0]
        ids[i, :n] = b["input_ids"]
        labels[i, :n] = b["labels"]
        att[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": att}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--varlen", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--logging-steps", type=int, default=10)
    ap.add_argument("--shape-log", default=None, help="append each padded batch length to this file")
    ap.add_argument("--disable-tqdm", action="store_true", help="disable_tqdm=True (PrinterCallback)")
    ap.add_argument("--samples", type=int, default=None, help="dataset size (default steps * batch)")
    ap.add_argument("--clock", default=None, help="on_step_end writes time.time() to this file")
    a = ap.parse_args()
    global SHAPE_LOG
    SHAPE_LOG = a.shape_log

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=a.hidden,
        intermediate_size=2 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=max(256, a.seq_len),
    )
    model = LlamaForCausalLM(cfg)
    ds = SyntheticTokens(a.samples or a.steps * a.batch, a.seq_len, cfg.vocab_size, a.varlen)
    args = TrainingArguments(
        output_dir=a.out_dir,
        max_steps=a.steps,
        per_device_train_batch_size=a.batch,
        learning_rate=1e-3,
        warmup_steps=5,
        logging_steps=a.logging_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=a.disable_tqdm,
        use_cpu=True,
        torch_compile=a.compile,
        dataloader_num_workers=0,
        seed=0,
    )
    callbacks: list[TrainerCallback] | None = [Clock(a.clock)] if a.clock else None
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collate, callbacks=callbacks)
    out = trainer.train()
    print("TrainOutput:", out)


if __name__ == "__main__":
    main()
