"""A plain PyTorch loop (Linear(16, 1), SGD, synthetic data) with a tqdm bar and a loss postfix.

    python tqdm_loop.py [--steps 100] [--desc train] [--sleep 0.05] [--clock FILE]
                        [--epochs E] [--kill-at K] [--postfix-every 1]

The loop is the common idiom ``for step in (bar := tqdm(range(N), desc=desc)):`` with
``bar.set_postfix(loss=...)`` (tqdm's default ``refresh=True``: each call redraws the bar). tqdm
writes to stderr; nothing else is printed. ``--epochs E`` draws one bar per epoch,
``tqdm(range(steps), desc=f"Epoch {e}")`` (the counter restarts every epoch; ``--desc`` is then not
used). ``--clock FILE`` writes each step's end time (``time.time()``, one float per line, after the
step's work, sleep and postfix) to FILE, flushed per line: the program's own clock. ``--kill-at K``
SIGKILLs the process at the start of (global, 1-based) step K, so the last bytes of the log are
whatever ``\\r`` bar segment tqdm drew last (no closing newline).

Used by capture.sh for tqdm_desc_postfix.log, tqdm_epochs.log, tqdm_sigkill.log and (through
tqdm_two_procs.py) tqdm_two_procs.log.
"""

import argparse
import os
import signal
import time

import torch
from tqdm import tqdm

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100, help="steps per bar (per epoch with --epochs)")
ap.add_argument("--desc", default="train")
ap.add_argument("--sleep", type=float, default=0.05, help="seconds slept in each step")
ap.add_argument("--clock", default=None, help="write each step's end time.time() to this file")
ap.add_argument("--epochs", type=int, default=None, help="one bar per epoch, desc 'Epoch {e}'")
ap.add_argument("--kill-at", type=int, default=None, help="SIGKILL self at the start of this step")
ap.add_argument("--postfix-every", type=int, default=1, help="set_postfix every N steps")
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

torch.manual_seed(args.seed)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 16)
y = x.sum(1, keepdim=True)
clock = open(args.clock, "w") if args.clock else None
done = 0  # global steps finished


def one_step(bar, step):
    global done
    if args.kill_at is not None and done + 1 == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    i = (done * 8) % 64
    loss = torch.nn.functional.mse_loss(model(x[i : i + 8]), y[i : i + 8])
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.sleep)
    if step % args.postfix_every == 0:
        bar.set_postfix(loss=loss.item())
    done += 1
    if clock:
        clock.write(f"{time.time()!r}\n")
        clock.flush()


if args.epochs is None:
    for step in (bar := tqdm(range(args.steps), desc=args.desc)):
        one_step(bar, step)
else:
    for e in range(args.epochs):
        for step in (bar := tqdm(range(args.steps), desc=f"Epoch {e}")):
            one_step(bar, step)
if clock:
    clock.close()
