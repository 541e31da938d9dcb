"""Two (or more) ranks on gloo, CPU: an all_reduce every 0.1 s; one rank may SIGKILL itself.

    torchrun --nproc_per_node 2 torchrun_ddp.py [--steps 200] [--kill-rank R --kill-at STEP]

Rank 0 prints ``step N`` every 10 steps; every rank prints ``rank R pid P up`` once. Used by
capture.sh for torchrun_sigkill_rank1.log (torchrun's failure table, the root cause a SIGKILL).
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--kill-rank", type=int, default=None)
ap.add_argument("--kill-at", type=int, default=None)
args = ap.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} pid {os.getpid()} up", flush=True)
for step in range(1, args.steps + 1):
    if rank == args.kill_rank and step == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(10))
    time.sleep(0.1)
    if rank == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
dist.destroy_process_group()
