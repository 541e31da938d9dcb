"""A tiny PyTorch Lightning run on the CPU: 3 epochs of ``--samples / 8`` batches (default 40), a
``--sleep`` (default 20 ms) in each training step, a validation pass (a quarter of the samples) every
epoch; the TQDM bar (redrawn every batch), or Lightning's RichProgressBar with ``--rich``.

Used by capture.sh for lightning_tqdm.log and lightning_rich.log, and by tests/test_logformats.py
for real Lightning runs launched by stepwatch (``--sleep 0.1 --samples 160``).
"""

import argparse
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--rich", action="store_true")
ap.add_argument("--sleep", type=float, default=0.02)
ap.add_argument("--samples", type=int, default=320)
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
bar = RichProgressBar() if args.rich else TQDMProgressBar(refresh_rate=1)
L.Trainer(max_epochs=3, accelerator="cpu", callbacks=[bar], logger=False, enable_checkpointing=False,
          enable_model_summary=False).fit(Tiny(), DataLoader(TensorDataset(x, y), batch_size=8),
                                          DataLoader(TensorDataset(x[:n_val], y[:n_val]), batch_size=8))
print("done", flush=True)
