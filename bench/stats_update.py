"""Microseconds per incremental StepStats.add at n = 10^6 counted steps (target <= 20 us).

Usage:  python bench/stats_update.py [--n 1000000] [--adds 20000] [--repeats 5] [--json FILE]

Fills a StepStats with ``--n`` steps (real-run-shaped durations, tokens on every step), then times
``--adds`` further adds, each followed by a read (``add`` only appends; the first read after it
inserts the step into the sorted durations, and a live view reads at least once a step), ``--repeats``
times, and reports the median and best us/add, plus the cost
of reading the summary and the process's resident memory (psutil, when installed). Runnable alone.
``--json`` writes the common shape of bench/common.py (figure ``stats_update_us``; the old fields
under ``details``). ``--quick``: 5,000 adds x 3 (the fill to 10^6 is the same).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from stepwatch.monitors.snapshot.eta import eta_part  # noqa: E402
from stepwatch.monitors.stats.stepstats import StepStats  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)

TARGET_US = 20.0


def rss_bytes() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--adds", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--quick", action="store_true", help="--adds 5000 --repeats 3")
    a = ap.parse_args(argv)
    if a.quick:
        a.adds, a.repeats = min(a.adds, 5000), min(a.repeats, 3)

    rng = random.Random(0)
    total = a.n + a.adds * a.repeats
    dts = [19.75 * rng.lognormvariate(0.0, 0.17) for _ in range(total)]
    rss0 = rss_bytes()
    s = StepStats()
    t0 = time.perf_counter()
    s.add(0, 45.79, ("first",), 26048, 26112)
    for i in range(a.n):
        s.add(i + 1, dts[i] * 1.0, (), 26048, 26112)  # a fresh float object, as from json.loads
    fill_s = time.perf_counter() - t0
    rss1 = rss_bytes()

    per_add: list[float] = []
    k = a.n
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.adds):
            k += 1
            s.add(k, dts[k - 1], (), 26048, 26112)
            s.n  # noqa: B018  add() defers the sorted insert to the next read: include it
        per_add.append((time.perf_counter() - t0) / a.adds * 1e6)

    t0 = time.perf_counter()
    reads = 200
    for _ in range(reads):
        s.summary()
    summary_us = (time.perf_counter() - t0) / reads * 1e6
    t0 = time.perf_counter()
    s.throughput()
    eta_part([r.dt_s for r in s.recent(64) if r.counted], 10**7, k, {"state": "ok"}, True, 0.0)
    s.histogram(40)
    screen_us = (time.perf_counter() - t0) * 1e6

    med = statistics.median(per_add)
    out = {
        "n_before": a.n + 1,
        "n_counted_after": s.n,
        "us_per_add_median": med,
        "us_per_add_best": min(per_add),
        "us_per_add_runs": per_add,
        "target_us": TARGET_US,
        "meets_target": med <= TARGET_US,
        "fill_s": fill_s,
        "summary_us": summary_us,
        "throughput_eta_histogram_us": screen_us,
        "rss_growth_bytes": (rss1 - rss0) if rss0 is not None and rss1 is not None else None,
        "python": sys.version.split()[0],
    }
    print(f"StepStats.add at n = {a.n:,}: median {med:.2f} us/add, best {min(per_add):.2f} "
          f"({a.repeats} x {a.adds:,} adds; target <= {TARGET_US:g} us: {'met' if out['meets_target'] else 'NOT met'})")
    print(f"fill of {a.n:,} steps: {fill_s:.1f} s; summary(): {summary_us:.1f} us; "
          f"throughput + eta + 40-bin histogram: {screen_us:.0f} us")
    if out["rss_growth_bytes"] is not None:
        print(f"resident memory growth for {a.n:,} steps: {out['rss_growth_bytes'] / 2**20:.0f} MiB "
              f"(the bench's own list of durations excluded: it was built before)")
    print(s.canonical_line())
    if a.json:
        res = common.new_result("stats_update", a.quick)
        res["figures"]["stats_update_us"] = med
        res["spreads"]["stats_update_us"] = common.spread(per_add)
        res["baselines"]["stats_update_us"] = {"what": "none (an absolute figure)", "value": None, "unit": "us"}
        res["details"] = out
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0 if out["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
