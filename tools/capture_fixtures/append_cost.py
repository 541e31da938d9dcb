"""Cost of a per-step JSON-line append + flush (what a telemetry callback would do), and of
time.perf_counter(). CPU-only machine: torch.cuda.synchronize() is not measured (no CUDA).

Usage (run by tools/capture_fixtures/capture.sh, from its staging folder):
    python scripts/append_cost.py --file <tmp_file> --json append_cost.json
"""
import argparse
import json
import os
import platform
import statistics
import time

N = 10_000
REPEATS = 5


def line_for(i):
    rec = {
        "t": 1764484993.123456 + i,
        "step": i,
        "loss": 5.557166290283203,
        "grad_norm": 0.6276842355728149,
        "lr": 3.3333333333333335e-05,
        "dt": 0.017174,
        "tok": 2560 * i,
    }
    return json.dumps(rec, separators=(",", ":")) + "\n"


def bench_append(path):
    lines = [line_for(i) for i in range(N)]  # built outside the timed loop
    per = []
    for _ in range(REPEATS):
        if os.path.exists(path):
            os.remove(path)
        with open(path, "a", encoding="utf-8") as f:
            t0 = time.perf_counter()
            for ln in lines:
                f.write(ln)
                f.flush()
            t1 = time.perf_counter()
        per.append((t1 - t0) / N * 1e6)
    return per, len(lines[0].encode()), sum(len(x) for x in lines) / N


def bench_append_with_dumps(path):
    per = []
    for _ in range(REPEATS):
        if os.path.exists(path):
            os.remove(path)
        with open(path, "a", encoding="utf-8") as f:
            t0 = time.perf_counter()
            for i in range(N):
                f.write(line_for(i))
                f.flush()
            t1 = time.perf_counter()
        per.append((t1 - t0) / N * 1e6)
    return per


def bench_perf_counter():
    per = []
    for _ in range(REPEATS):
        n = 1_000_000
        pc = time.perf_counter
        t0 = pc()
        for _ in range(n):
            pc()
        t1 = pc()
        # subtract empty-loop cost
        t2 = pc()
        for _ in range(n):
            pass
        t3 = pc()
        per.append(((t1 - t0) - (t3 - t2)) / n * 1e9)
    return per


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()

    flush_only, first_len, mean_len = bench_append(a.file)
    with_dumps = bench_append_with_dumps(a.file)
    pc = bench_perf_counter()
    try:
        import torch

        cuda = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    except Exception as e:  # noqa: BLE001
        cuda = {"error": repr(e)}
    os.remove(a.file)
    out = {
        "python": platform.python_version(),
        "n_appends_per_repeat": N,
        "repeats": REPEATS,
        "line_bytes_first": first_len,
        "line_bytes_mean": mean_len,
        "append_write_flush_us_per_line": {
            "repeats": [round(x, 3) for x in flush_only],
            "median": round(statistics.median(flush_only), 3),
        },
        "append_dumps_write_flush_us_per_line": {
            "repeats": [round(x, 3) for x in with_dumps],
            "median": round(statistics.median(with_dumps), 3),
        },
        "perf_counter_ns_per_call": {
            "repeats": [round(x, 2) for x in pc],
            "median": round(statistics.median(pc), 2),
        },
        "cuda_synchronize": "not measured: CPU-only machine (torch.cuda.is_available() is False)",
        "torch_cuda": cuda,
    }
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
