"""Drive torch.compile (CPU inductor, dynamic=False) into its recompile limit with
step-to-step varying sequence lengths, time every training step, and dump dynamo counters.

Usage: run by tools/capture_fixtures/capture.sh (from its staging folder, as scripts/...), e.g.
    TORCH_LOGS="recompiles,graph_breaks" python scripts/dynamo_recompile.py \
        --csv dynamo_step_times.csv --counters dynamo_counters.json 2> dynamo_recompiles.log
Keep this docstring's line count: the captured logs name lines 61 and 183 of this file.

Phases written to the CSV (decided from observed signals, per step):
  compile        counters['stats']['unique_graphs'] grew during this step
  limit_hit      the 'torch._dynamo hit config.recompile_limit' warning was emitted during this step
  compiled       no new graph, and this seq_len was compiled earlier (cached graph reused)
  eager_fallback no new graph, seq_len never compiled, limit already hit (frame runs eagerly)
  eager_reference the same model NOT compiled, same lengths, for a same-length comparison
"""
import argparse
import csv
import json
import logging
import os
import sys
import time

import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

LENGTHS = [17, 33, 49, 65, 81, 97, 113, 129, 145]


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q = q.view(B, L, self.h, D // self.h).transpose(1, 2)
        k = k.view(B, L, self.h, D // self.h).transpose(1, 2)
        v = v.view(B, L, self.h, D // self.h).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=256, d=128, h=4, n=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(n)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, labels):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def counters_dict():
    from torch._dynamo.utils import counters

    return {str(k): {str(kk): vv for kk, vv in v.items()} for k, v in counters.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--counters", required=True)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()

    cfg = torch._dynamo.config
    info = {
        "torch": torch.__version__,
        "has_recompile_limit": hasattr(cfg, "recompile_limit"),
        "has_cache_size_limit": hasattr(cfg, "cache_size_limit"),
        "default_recompile_limit": getattr(cfg, "recompile_limit", None),
        "default_accumulated_recompile_limit": getattr(cfg, "accumulated_recompile_limit", None),
        "TORCH_LOGS": os.environ.get("TORCH_LOGS"),
        "num_threads": torch.get_num_threads(),
    }
    if hasattr(cfg, "recompile_limit"):
        cfg.recompile_limit = a.limit
    else:
        cfg.cache_size_limit = a.limit
    info["set_limit_to"] = a.limit
    info["cache_size_limit_reads_back"] = getattr(cfg, "cache_size_limit", None)
    print("INFO " + json.dumps(info), file=sys.stderr, flush=True)

    cap = Capture()
    logging.getLogger("torch._dynamo.convert_frame").addHandler(cap)

    torch.manual_seed(0)
    model = TinyLM()
    ref = TinyLM()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    cmodel = torch.compile(model, dynamic=False)

    from torch._dynamo.utils import counters

    rows = []
    compiled_lengths = set()
    limit_hit = False
    g = torch.Generator().manual_seed(1)
    step = 0
    for _cyc in range(a.cycles):
        for L in LENGTHS:
            step += 1
            ids = torch.randint(0, 256, (a.batch, L), generator=g)
            ug0 = counters["stats"]["unique_graphs"]
            n_warn0 = len(cap.records)
            t0 = time.perf_counter()
            loss = cmodel(ids, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            ug1 = counters["stats"]["unique_graphs"]
            if ug1 > ug0:
                phase = "compile"
                compiled_lengths.add(L)
            elif len(cap.records) > n_warn0:
                phase = "limit_hit"
                limit_hit = True
            elif L in compiled_lengths:
                phase = "compiled"
            elif limit_hit:
                phase = "eager_fallback"
            else:
                phase = "unknown"
            rows.append([step, L, "%.6f" % dt, phase, ug1])
            print(
                "STEP %d seq_len=%d seconds=%.4f phase=%s unique_graphs=%d loss=%.4f"
                % (step, L, dt, phase, ug1, loss.item()),
                file=sys.stderr,
                flush=True,
            )

    after_main = counters_dict()

    # eager reference: same architecture, never compiled, same lengths (2 cycles)
    for _cyc in range(2):
        for L in LENGTHS:
            step += 1
            ids = torch.randint(0, 256, (a.batch, L), generator=g)
            t0 = time.perf_counter()
            loss = ref(ids, ids)
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            rows.append([step, L, "%.6f" % dt, "eager_reference", counters["stats"]["unique_graphs"]])
            print("STEP %d seq_len=%d seconds=%.4f phase=eager_reference" % (step, L, dt),
                  file=sys.stderr, flush=True)

    # a deliberate graph break, so the log shows what one looks like
    @torch.compile(dynamic=False)
    def with_break(x):
        y = x * 2
        print("graph-break demo: print() inside a compiled function")
        return y + 1

    with_break(torch.ones(4))
    after_gb = counters_dict()

    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "seq_len", "seconds", "phase", "unique_graphs_cumulative"])
        w.writerows(rows)
    with open(a.counters, "w") as f:
        json.dump(
            {
                "info": info,
                "captured_convert_frame_warnings": cap.records,
                "after_main_loop": after_main,
                "after_graph_break_demo": after_gb,
            },
            f,
            indent=1,
        )
    print("DONE", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
