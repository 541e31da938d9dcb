"""Ours: short real training runs that END in different ways (capture step 22), for the
"why did the run end" classifier. Plain torch / transformers, CPU only, no downloads (a random-init
tiny Llama: hidden 32, 2 layers, seq 16; synthetic token ids from hf_trainer_run.py).

Usage (run by tools/capture_fixtures/capture.sh, from its staging folder):
    python scripts/deaths.py valueerror-at 10 --out-dir <run_dir>
        HF Trainer, 30 steps, logging_steps=5; a TrainerCallback's on_step_end raises
        ValueError("demo: bad batch at step 10"): the Trainer's own traceback, exit status 1.
    python scripts/deaths.py before-first-step --out-dir <run_dir>
        HF Trainer whose data hold token ids >= vocab_size (256): torch's embedding raises
        IndexError in the first forward, inside trainer.train(), before any optimizer step.
    python scripts/deaths.py cpu-oom
        plain torch loop printing ``step N loss X`` for 3 steps; step 4 asks torch for a 2**62-byte
        CPU tensor: torch's own allocation RuntimeError.
    torchrun --nproc_per_node 2 --tee 3 scripts/deaths.py gloo-timeout
        2 gloo ranks, init_process_group(timeout=5 s); rank 0 prints ``step N loss X``; at step 4
        rank 1 sleeps 30 s before its all_reduce, so rank 0's all_reduce times out.
    python scripts/deaths.py nan-loss --out-dir <run_dir>
        HF Trainer, 20 steps, logging_steps=1, learning_rate=1e6 (and logging_nan_inf_filter=False:
        with the default True the Trainer logs the window's mean instead of a nan step loss).
    python scripts/deaths.py save-steps --out-dir <run_dir> --json FILE [--logs-dir DIR]
        two child runs of ``save-child``: save_steps=20, max_steps=60 to the end, and the same run
        SIGKILLed by a thread that on_step_end of step 40 starts: it polls for the checkpoint-40
        folder and kills the process the moment it appears (mid-save, before trainer_state.json).
        FILE gets a listing of both output dirs (checkpoint-* file names, sizes, global_step).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch

HIDDEN, LAYERS, SEQ, BATCH, VOCAB = 32, 2, 16, 8, 256


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg)


def hf_trainer(out_dir, steps, *, logging_steps=5, callbacks=None, lr=1e-3, vocab=VOCAB, **extra):
    """The tiny Trainer run of hf_trainer_run.py (same dataset and collate), smaller model."""
    from transformers import Trainer, TrainingArguments

    from hf_trainer_run import SyntheticTokens, collate

    model = tiny_llama()
    ds = SyntheticTokens(steps * BATCH, SEQ, vocab, False)
    kw: dict = dict(save_strategy="no")  # any TrainingArguments keyword
    kw.update(extra)
    args = TrainingArguments(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=lr,
        warmup_steps=5,
        logging_steps=logging_steps,
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        **kw,
    )
    return Trainer(model=model, args=args, train_dataset=ds, data_collator=collate, callbacks=callbacks)


def cmd_valueerror_at(a):
    from transformers import TrainerCallback

    class RaiseAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == a.step:
                raise ValueError(f"demo: bad batch at step {a.step}")

    out = hf_trainer(a.out_dir, 30, callbacks=[RaiseAt()]).train()
    print("TrainOutput:", out)


def cmd_before_first_step(a):
    # ids drawn from [0, 512) for a 256-token vocabulary: the first forward fails in nn.Embedding
    out = hf_trainer(a.out_dir, 30, vocab=2 * VOCAB).train()
    print("TrainOutput:", out)


def cmd_cpu_oom(a):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, 11):
        x, y = torch.randn(BATCH, 32), torch.randn(BATCH, 1)
        if step == 4:
            scratch = torch.empty(2**62, dtype=torch.uint8)  # an absurd activation buffer
            x = x + scratch[:0].sum()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.05)


def cmd_gloo_timeout(a):
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    w = torch.zeros(8, requires_grad=True)
    for step in range(1, 21):
        loss = ((w - torch.randn(8)) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            if rank == 1 and step == 4:
                time.sleep(30)
            dist.all_reduce(w.grad)
            w -= 0.1 * w.grad / dist.get_world_size()  # type: ignore
            w.grad.zero_()  # type: ignore
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.1)
    dist.destroy_process_group()


def cmd_nan_loss(a):
    out = hf_trainer(a.out_dir, 20, logging_steps=1, lr=1e6, logging_nan_inf_filter=False).train()
    print("TrainOutput:", out)


def cmd_save_child(a):
    from transformers import TrainerCallback

    class KillMidSave(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == a.kill_during_save:
                ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")  # type: ignore

                def watch():
                    while not os.path.isdir(ckpt):
                        time.sleep(0.0002)
                    os.kill(os.getpid(), signal.SIGKILL)

                threading.Thread(target=watch, daemon=True).start()

    cbs = [KillMidSave()] if a.kill_during_save else None
    out = hf_trainer(a.out_dir, a.steps, logging_steps=10, callbacks=cbs, save_strategy="steps",
                     save_steps=a.save_steps).train()
    print("TrainOutput:", out)


def listing(out_dir):
    top = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else None
    ckpts = {}
    for name in sorted(n for n in (top or []) if n.startswith("checkpoint-")):
        d = os.path.join(out_dir, name)
        files = sorted(os.listdir(d))
        state = os.path.join(d, "trainer_state.json")
        step = None
        if os.path.exists(state):
            with open(state) as f:
                step = json.load(f).get("global_step")
        ckpts[name] = {
            "files": files,
            "sizes": {f: os.path.getsize(os.path.join(d, f)) for f in files if os.path.isfile(os.path.join(d, f))},
            "trainer_state_global_step": step,
        }
    return {"top_level": top, "checkpoints": ckpts}


def cmd_save_steps(a):
    result = {}
    runs = [("complete_run", []), ("killed_run", ["--kill-during-save", "40"])]
    for name, extra in runs:
        out_dir = os.path.join(a.out_dir, name)
        cmd = [sys.executable, os.path.abspath(__file__), "save-child", "--out-dir", out_dir,
               "--steps", "60", "--save-steps", "20", *extra]
        log = os.path.join(a.logs_dir, f"save_steps_{name}.log") if a.logs_dir else os.devnull
        with open(log, "wb") as f:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        rc = p.returncode
        result[name] = {
            "command": f"scripts/deaths.py save-child --out-dir <run_dir>/{name} --steps 60 --save-steps 20"
            + ("".join(" " + x for x in extra)),
            "returncode": rc,
            "signal": signal.Signals(-rc).name if rc < 0 else None,
            **listing(out_dir),
        }
        print(f"{name}: returncode {rc}", flush=True)
    with open(a.json, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # type: ignore
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("valueerror-at")
    p.add_argument("step", type=int)
    p.add_argument("--out-dir", required=True)
    p.set_defaults(fn=cmd_valueerror_at)
    p = sub.add_parser("before-first-step")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(fn=cmd_before_first_step)
    p = sub.add_parser("cpu-oom")
    p.set_defaults(fn=cmd_cpu_oom)
    p = sub.add_parser("gloo-timeout")
    p.set_defaults(fn=cmd_gloo_timeout)
    p = sub.add_parser("nan-loss")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(fn=cmd_nan_loss)
    p = sub.add_parser("save-steps")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--logs-dir", default=None, help="keep each child's stdout+stderr here")
    p.set_defaults(fn=cmd_save_steps)
    p = sub.add_parser("save-child")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-steps", type=int, default=20)
    p.add_argument("--kill-during-save", type=int, default=None)
    p.set_defaults(fn=cmd_save_child)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
