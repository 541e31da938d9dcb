"""A tiny PyTorch Lightning run on the CPU: 3 epochs of ``--samples / 8`` batches (default 40), a
``--sleep`` (default 20 ms) in each training step, a validation pass (a quarter of the samples) every
epoch; the TQDM bar (redrawn every batch), or Lightning's RichProgressBar with ``--rich``.

Used by capture.sh for lightning_tqdm.log and lightning_rich.log, and by tests/test_logformats.py
for real Lightning runs launched by stepwatch (``--sleep 0.1 --samples 160``).

``--max-steps N`` passes ``max_steps=N`` and no ``max_epochs`` (Lightning then sets max_epochs=-1,
so the Rich bar's header reads ``Epoch 0/-2``); ``--default-bar`` passes no progress-bar callback
(Lightning picks its default: RichProgressBar when rich is installed); ``--clock FILE`` writes
``time.time()`` at each on_train_batch_end, one float per line (the program's own step clock).
Without these options the run and its output are unchanged.
"""

import argparse
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--rich", action="store_true")
ap.add_argument("--sleep", type=float, default=0.02)
ap.add_argument("--samples", type=int, default=320)
ap.add_argument("--max-steps", type=int, default=None, help="max_steps=N and no max_epochs")
ap.add_argument("--default-bar", action="store_true", help="no progress-bar callback: Lightning's default")
ap.add_argument("--clock", default=None, help="write time.time() at each on_train_batch_end to FILE")
args = ap.parse_args()


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        time.sleep(args.sleep)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


g = torch.Generator().manual_seed(0)
x = torch.randn(args.samples, 16, generator=g)
y = x.sum(1, keepdim=True)
n_val = args.samples // 4


class Clock(Callback):
    def __init__(self, path):
        self.f = open(path, "w")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.f.write(f"{time.time()!r}\n")
        self.f.flush()


bar = RichProgressBar() if args.rich else TQDMProgressBar(refresh_rate=1)
callbacks: list[Callback] = [] if args.default_bar else [bar]
if args.clock:
    callbacks.append(Clock(args.clock))
# Trainer's own defaults are max_epochs=None, max_steps=-1: with --max-steps, max_epochs stays unset
max_epochs, max_steps = (3, -1) if args.max_steps is None else (None, args.max_steps)
L.Trainer(max_epochs=max_epochs, max_steps=max_steps, accelerator="cpu", callbacks=callbacks, logger=False, enable_checkpointing=False,
          enable_model_summary=False).fit(Tiny(), DataLoader(TensorDataset(x, y), batch_size=8),
                                          DataLoader(TensorDataset(x[:n_val], y[:n_val]), batch_size=8))
print("done", flush=True)
