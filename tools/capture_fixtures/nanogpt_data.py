"""Synthetic data for nanoGPT's train.py in the shape its prepare.py writes (train.bin / val.bin of
uint16 token ids, meta.pkl with vocab_size): 65 symbols, seeded, nothing downloaded.

    python nanogpt_data.py OUT_DIR      # then: train.py --dataset=<name of OUT_DIR under data/>
"""

import pickle
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for split, n in (("train", 200_000), ("val", 20_000)):
    rng.integers(0, 65, n, dtype=np.uint16).tofile(out / f"{split}.bin")
with open(out / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": 65}, f)
