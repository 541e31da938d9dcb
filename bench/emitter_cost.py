"""What the telemetry emitter costs a training loop.

    python bench/emitter_cost.py [--quick] [--json FILE] [--dir DIR] [--with-dynamo]

Two measurements, both with a real ``StepTelemetry`` writing a real ``events.jsonl`` in a fresh
temporary directory (``--dir`` picks the file system; default: the system temp dir):

1. Per call: median microseconds of ``StepTelemetry.step_end(tokens=..., padded_tokens=...)`` (build
   the event, ``json.dumps``, one ``os.write`` on an ``O_APPEND`` descriptor; the once-a-second
   checks amortised in) against an empty Python function taking the same arguments, and against
   a no-op emitter (no run dir). Each figure is the median over repeats of the mean of a batch.
2. In a loop: a CPU-busy step of about 1 ms (a fixed amount of arithmetic, calibrated at start, NOT
   "spin until 1 ms passed", which would hide the cost) run K times without the emitter (A) and
   K times with ``step_end`` after each step (B), in interleaved pairs whose order alternates
   (A,B then B,A) so drift hits both sides. Reported: the median of the per-pair ratios B/A, the
   overhead in percent and in microseconds per step, and the spread (min, p10, p90, max of the
   ratios, nearest-rank).

``--with-dynamo`` imports ``torch._dynamo`` first (as ``import transformers.Trainer`` does), so the
emitter's once-a-second check reads real dynamo counters; the cost of one check (file + dynamo) is
reported beside the per-call figure (amortised: once per ``check_interval_s``, 1 s).

``--json`` writes the common shape of bench/common.py: figures ``emitter_us_per_step`` (median
``step_end`` µs, baseline: an empty function call) and ``emitter_overhead_ratio`` (median of the
per-pair ratios, with their spread), everything else under ``details``.

The numbers depend on the machine and the file system (no fsync: the page cache absorbs writes).
Compare with ``tests/fixtures/real/append_cost.json`` (write+flush of a pre-built ~148-byte line:
2.19 µs median; with ``json.dumps``: 10.18 µs; measured 2026-11-30 on 2 vCPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepwatch.telemetry import StepTelemetry, nearest_rank  # noqa: E402


def _empty(tokens=None, padded_tokens=None):
    return None


def per_call_us(fn, n: int, repeats: int) -> list[float]:
    """Mean µs per call of ``fn(tokens=..., padded_tokens=...)`` for each of ``repeats`` batches of ``n``."""
    out = []
    pc = time.perf_counter
    for _ in range(repeats):
        t0 = pc()
        for _ in range(n):
            fn(tokens=26048, padded_tokens=26112)
        out.append((pc() - t0) / n * 1e6)
    return out


def busy(iters: int) -> int:
    acc = 0
    for i in range(iters):
        acc += i * i
    return acc


def calibrate(target_s: float = 1e-3) -> int:
    """Loop count for which ``busy`` takes about ``target_s`` seconds (median of 5 tries)."""
    iters = 1000
    while True:
        t0 = time.perf_counter()
        busy(iters)
        dt = time.perf_counter() - t0
        if dt > 2e-4:
            break
        iters *= 2
    est = []
    for _ in range(5):
        t0 = time.perf_counter()
        busy(iters)
        est.append(time.perf_counter() - t0)
    return max(1, int(iters * target_s / statistics.median(est)))


def loop_pairs(tel: StepTelemetry, iters: int, k: int, pairs: int) -> list[tuple[float, float]]:
    """(A seconds, B seconds) per pair: A = k busy steps, B = k busy steps + step_end each."""
    pc = time.perf_counter

    def run_a() -> float:
        t0 = pc()
        for _ in range(k):
            busy(iters)
        return pc() - t0

    def run_b() -> float:
        t0 = pc()
        for _ in range(k):
            busy(iters)
            tel.step_end(tokens=26048, padded_tokens=26112)
        return pc() - t0

    return _common().interleaved_pairs(run_a, run_b, pairs, warmup=0)


def _common():
    """bench/common.py, loaded by path (this script also runs alone, without bench/ on sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_common", Path(__file__).with_name("common.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {spec}")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a few seconds)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--dir", metavar="DIR", help="where the temporary run dir is made")
    ap.add_argument("--with-dynamo", action="store_true", help="import torch._dynamo first (real counters checked)")
    ap.add_argument("--pairs", type=int, help="interleaved pairs (default 300 quick / 1500)")
    ap.add_argument("--k", type=int, default=5, help="steps per side of a pair (default 5: short sides, "
                                                    "so a preemption spoils few pairs)")
    a = ap.parse_args(argv)

    dynamo_loaded = False
    if a.with_dynamo:
        try:
            import torch._dynamo  # noqa: F401

            dynamo_loaded = True
        except Exception as e:  # no torch: the check has nothing to read, as in a torch-less job
            print(f"--with-dynamo: torch._dynamo not importable ({e}); measuring without it")
    n, repeats = (2000, 5) if a.quick else (20000, 9)
    k, pairs = a.k, a.pairs or (300 if a.quick else 1500)

    run_dir = tempfile.mkdtemp(prefix="stepwatch-bench-", dir=a.dir)
    try:
        tel = StepTelemetry(run_dir=run_dir)
        import stepwatch.telemetry.core as core

        core._warned_unset = True  # the no-op emitter below is deliberate: no warning line
        noop = StepTelemetry(run_dir=None, start=False)
        empty = per_call_us(_empty, n, repeats)
        noop_us = per_call_us(noop.step_end, n, repeats)
        emit = per_call_us(tel.step_end, n, repeats)
        line_bytes = os.path.getsize(os.path.join(run_dir, "events.jsonl")) / max(1, n * repeats + 1)

        iters = calibrate()
        t0 = time.perf_counter()
        busy(iters)
        step_s = time.perf_counter() - t0
        res = loop_pairs(tel, iters, k, pairs)
        checks = []
        for _ in range(50):
            t0 = time.perf_counter()
            tel._check(time.perf_counter())
            checks.append((time.perf_counter() - t0) * 1e6)
        check_us = statistics.median(checks)
        tel.close()
        ratios = sorted(b / a for a, b in res)
        deltas_us = sorted((b - a) / k * 1e6 for a, b in res)
        dropped = tel.dropped_events
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)

    med_ratio = statistics.median(ratios)
    result = {
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "quick": a.quick,
        "per_call_us": {
            "calls_per_repeat": n,
            "repeats": repeats,
            "empty_function_median": statistics.median(empty),
            "noop_emitter_median": statistics.median(noop_us),
            "step_end_median": statistics.median(emit),
            "step_end_repeats": emit,
            "step_end_minus_empty_median": statistics.median(emit) - statistics.median(empty),
            "line_bytes_mean": line_bytes,
        },
        "loop": {
            "busy_step_s": step_s,
            "steps_per_side": k,
            "pairs": pairs,
            "ratio_median": med_ratio,
            "ratios": ratios,
            "overhead_percent_median": (med_ratio - 1) * 100,
            "ratio_spread": {"min": ratios[0], "p10": nearest_rank(ratios, 10), "p90": nearest_rank(ratios, 90),
                             "max": ratios[-1]},
            "overhead_us_per_step_median": statistics.median(deltas_us),
            "overhead_us_per_step_spread": {"min": deltas_us[0], "p10": nearest_rank(deltas_us, 10),
                                            "p90": nearest_rank(deltas_us, 90), "max": deltas_us[-1]},
        },
        "dropped_events": dropped,
        "periodic_check_us_median": check_us,
        "dynamo_loaded": dynamo_loaded,
    }
    pc_, lp = result["per_call_us"], result["loop"]
    print(f"step_end (write+flush): median {pc_['step_end_median']:.2f} us/call; empty function "
          f"{pc_['empty_function_median']:.3f} us; no-op emitter {pc_['noop_emitter_median']:.3f} us "
          f"({n} calls x {repeats} repeats, ~{pc_['line_bytes_mean']:.0f} B/line)")
    sp = lp["ratio_spread"]
    print(f"~{step_s * 1e3:.2f} ms CPU-busy step: with/without emitter median ratio {med_ratio:.4f} "
          f"({lp['overhead_percent_median']:+.2f} %, {lp['overhead_us_per_step_median']:+.1f} us/step); "
          f"spread min {sp['min']:.4f} p10 {sp['p10']:.4f} p90 {sp['p90']:.4f} max {sp['max']:.4f} "
          f"({pairs} interleaved pairs of {k} steps)")
    print(f"periodic check (events file + dynamo{'' if dynamo_loaded else ', not loaded'}): "
          f"{check_us:.1f} us, once per second")
    if a.json:
        out = common_result(result, a.quick)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if dropped == 0 else 1


def common_result(result: dict, quick: bool) -> dict:
    """``result`` in the common --json shape of bench/common.py."""
    common = _common()
    out = common.new_result("emitter_cost", quick)
    pc_, lp = result["per_call_us"], result["loop"]
    out["figures"] = {"emitter_us_per_step": pc_["step_end_median"], "emitter_overhead_ratio": lp["ratio_median"]}
    out["baselines"] = {
        "emitter_us_per_step": {"what": "an empty function call with the same arguments (median)",
                                "value": pc_["empty_function_median"], "unit": "us"},
        "emitter_overhead_ratio": {"what": f"the same ~{lp['busy_step_s'] * 1e3:.1f} ms CPU-busy loop bare",
                                   "value": lp["busy_step_s"], "unit": "s"},
    }
    sp = dict(lp["ratio_spread"], n=lp["pairs"], median=lp["ratio_median"])
    out["spreads"] = {"emitter_overhead_ratio": sp}
    if result["dropped_events"]:
        out["notes"]["emitter_us_per_step"] = f"{result['dropped_events']} events dropped"
    out["details"] = result
    return out


if __name__ == "__main__":
    sys.exit(main())
