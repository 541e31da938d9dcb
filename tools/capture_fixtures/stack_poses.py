"""Ours: three poses a stuck run is found in, for py-spy dumps (capture step 21).

  gloo    under torchrun, 3 gloo ranks: every rank all_reduces each step; rank 1 sleeps 60 s at step
          20, before its all_reduce, so ranks 0 and 2 wait in the collective
  save    torch.save of a model's state_dict into a FIFO nobody reads yet: held inside torch.save
  loader  a DataLoader (2 workers) whose dataset sleeps 60 s on item 64: the loop waits for its batch
"""

from __future__ import annotations

import os
import sys
import time

import torch

mode = sys.argv[1]
if mode == "gloo":
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(4)
    for step in range(1, 1000):
        time.sleep(0.1)
        if rank == 1 and step == 20:
            time.sleep(60)
        dist.all_reduce(x)
        if rank == 0:
            print(f"step {step} loss {1 / step:.4f}", flush=True)
    dist.destroy_process_group()
elif mode == "save":
    fifo = sys.argv[2]
    os.mkfifo(fifo)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
    print("saving checkpoint", flush=True)
    torch.save(model.state_dict(), fifo)  # opening a FIFO blocks until a reader comes
elif mode == "loader":
    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10_000

        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 64:
                time.sleep(60)
            return torch.ones(4) * i

    for step, batch in enumerate(torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=2), 1):
        print(f"step {step} loss {float(batch.mean()):.4f}", flush=True)
else:
    sys.exit(f"unknown mode {mode}")
