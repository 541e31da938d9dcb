"""Run every stepwatch benchmark and print one table: key, figure, baseline, ratio, spread, target, verdict.

    python bench/run.py [--quick] [--json FILE] [--only NAME[,NAME]]

Each benchmark is its own script (runnable alone, see bench/README.md); this runs each in its own
session with ``--json`` to a temporary file and a time limit (the whole process group is killed when
it runs over), so one failure gives null figures and a note, never a crash. ``--quick`` finishes in
under two minutes on 2 cores, the full run in under fifteen.

Verdicts: PASS / MISS against the issue's target. For the ratios of noisy timings (medians of
interleaved A/B pairs) the spread (p10..p90 of the pairs) is printed beside the figure; when that
spread is wider than the target's margin (target - 1) and the target lies inside it, the verdict is
NOISY instead of PASS / MISS, and a line under the table gives the 95 % confidence interval of the
median (order statistics) to say which way it leans. A figure that could not be taken is NULL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_num, machine_info, run_child_json, utc_now  # noqa: E402

HERE = Path(__file__).resolve().parent
PY = sys.executable

#: The issue's table: key -> (target, unit, kind). kind "ratio": a median of interleaved pairs.
TARGETS: dict[str, tuple[float, str, str]] = {
    "emitter_us_per_step": (20.0, "us", "abs"),
    "emitter_overhead_ratio": (1.02, "x", "ratio"),
    "callback_overhead_ratio": (1.02, "x", "ratio"),
    "attach_events_s": (1.0, "s", "abs"),
    "attach_events_ratio": (3.0, "x", "ratio"),
    "attach_log_s": (0.2, "s", "abs"),
    "watchdog_latency_s": (0.01, "s", "abs"),
    "stats_update_us": (20.0, "us", "abs"),
    "monitor_cpu_share": (0.02, "s/s", "abs"),
    "tui_cpu_share": (0.05, "s/s", "abs"),
    "tui_bytes_per_s": (8000.0, "B/s", "abs"),
    "tui_bytes_per_s_low": (1000.0, "B/s", "abs"),
    "tui_first_frame_s": (1.0, "s", "abs"),
    "gpu_sampler_cpu_share": (0.01, "s/s", "abs"),
}
#: Figures reported beside the table's keys (same verdict rules when they have a target).
EXTRA_TARGETS: dict[str, tuple[float, str, str]] = {
    "log_search_s": (1.0, "s", "abs"),
    "watchdog_latency_poll_s": (1.0, "s", "abs"),
    "attach_events_cold_s": (1.0, "s", "abs"),
    "gpu_sampler_cpu_share_nvml": (0.01, "s/s", "abs"),
    "log_timing_p50_error_250ms": (0.05, "x", "abs"),
    "log_timing_p99_error_250ms": (0.05, "x", "abs"),
    "log_timing_p50_error_20ms": (0.10, "x", "abs"),
    "alert_latency_kill_s": (2.0, "s", "abs"),
    "supervisor_cpu_share": (0.02, "s/s", "abs"),
    "exporter_cpu_share_at_5s": (0.01, "s/s", "abs"),
    "cold_status_ratio": (3.0, "x", "ratio"),
    "cold_status_peak_rss_mb": (500.0, "MB", "abs"),
    "log_pump_ratio": (1.10, "x", "ratio"),
}

#: name -> (script, quick args, full args, quick timeout s, full timeout s, group). Benchmarks of one
#: group run at the same time (only CPU-share measurements of light processes share a group).
BENCHES: list[tuple[str, str, list[str], list[str], float, float, str]] = [
    ("emitter", "emitter_cost.py", ["--quick", "--pairs", "200"], ["--with-dynamo"], 60, 240, "emitter"),
    ("callback", "callback_overhead.py", ["--quick", "--pairs", "40"], [], 90, 420, "callback"),
    ("attach_events", "attach_events.py", ["--quick", "--budget", "14"], [], 90, 600, "attach_events"),
    ("attach_log", "attach_log.py", ["--quick", "--repeat", "3"], [], 60, 400, "attach_log"),
    ("watchdog", "watchdog_latency.py", ["--quick"], [], 60, 120, "watchdog"),
    ("stats_update", "stats_update.py", ["--quick"], [], 60, 240, "stats_update"),
    ("monitor_cpu", "monitor_cpu.py", ["--quick", "--warmup", "2", "--window", "7"], [], 60, 200, "light"),
    ("gpu_sampler", "gpu_sampler_cost.py", ["--quick", "--window", "4"], [], 40, 120, "light"),
    ("supervisor_watch", "supervisor_watch.py", ["--quick"], [], 240, 600, "supervisor_watch"),
    ("tui", "tui_pty.py", ["--quick", "--warmup", "3", "--window", "6", "--launches", "1"], [], 100, 400, "tui"),
    ("log_search", "log_search.py", ["--quick", "--repeat", "3"], [], 60, 120, "log_search"),
    ("exporter", "exporter_cost.py", ["--quick"], [], 60, 180, "exporter"),
    ("cold_status", "cold_status.py", ["--quick"], [], 90, 900, "cold_status"),
    ("log_pump", "log_pump.py", ["--quick"], [], 60, 180, "log_pump"),
]


#: which benchmark produces which key (for the note of a key left null by a failed benchmark)
KEY_BENCH = {
    "emitter_us_per_step": "emitter", "emitter_overhead_ratio": "emitter", "callback_overhead_ratio": "callback",
    "attach_events_s": "attach_events", "attach_events_ratio": "attach_events",
    "attach_events_cold_s": "attach_events", "attach_log_s": "attach_log",
    "watchdog_latency_s": "watchdog", "watchdog_latency_poll_s": "watchdog", "stats_update_us": "stats_update",
    "monitor_cpu_share": "monitor_cpu", "tui_cpu_share": "tui", "tui_bytes_per_s": "tui",
    "tui_bytes_per_s_low": "tui", "tui_first_frame_s": "tui", "gpu_sampler_cpu_share": "gpu_sampler",
    "gpu_sampler_cpu_share_nvml": "gpu_sampler",
    "log_timing_p50_error_250ms": "supervisor_watch", "log_timing_p99_error_250ms": "supervisor_watch",
    "log_timing_p50_error_20ms": "supervisor_watch", "alert_latency_kill_s": "supervisor_watch",
    "supervisor_cpu_share": "supervisor_watch",
    "log_search_s": "log_search", "log_search_again_s": "log_search", "log_search_ratio": "log_search",
    "cold_status_ratio": "cold_status", "cold_status_peak_rss_mb": "cold_status",
    "log_pump_ratio": "log_pump", "log_pump_mb_per_s": "log_pump",
    "exporter_cpu_s_per_scrape": "exporter", "exporter_cpu_share_at_5s": "exporter", "exporter_vs_floor": "exporter",
}


def _cpu_busy_jiffies() -> int | None:
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
        vals = [int(x) for x in parts]
        return sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)  # minus idle and iowait
    except (OSError, ValueError, IndexError):
        return None


def _our_cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def median_ci95(n: int) -> tuple[int, int] | None:
    """1-based ranks (lo, hi) of a distribution-free ~95 % confidence interval of the median of n values."""
    if n < 6:
        return None
    h = 1.96 * math.sqrt(n) / 2
    return max(1, int(math.floor(n / 2 - h))), min(n, int(math.ceil(n / 2 + 1 + h)))


def verdict(key: str, value: Any, spread: dict | None, target: float, kind: str) -> tuple[str, str | None]:
    """(PASS | MISS | NOISY | NULL, the median's lean when NOISY)."""
    if value is None:
        return "NULL", None
    plain = "PASS" if value <= target else "MISS"
    if kind == "ratio" and spread and spread.get("p10") is not None and spread.get("p90") is not None:
        width = spread["p90"] - spread["p10"]
        if width > (target - 1.0) and spread["p10"] <= target <= spread["p90"]:
            return "NOISY", plain
    return plain, None


def run_all(quick: bool, only: set[str] | None, tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the benchmarks; return (merged results, per-benchmark run info)."""
    merged: dict[str, Any] = {"figures": {}, "baselines": {}, "spreads": {}, "notes": {}, "details": {}}
    runs: dict[str, Any] = {}
    groups: dict[str, list] = {}
    for b in BENCHES:
        if only and b[0] not in only:
            continue
        groups.setdefault(b[6], []).append(b)
    for members in groups.values():
        started = []
        for name, script, qargs, fargs, qto, fto, _ in members:
            jp = tmp / f"{name}.json"
            argv = [PY, str(HERE / script), *(qargs if quick else fargs), "--json", str(jp)]
            started.append((name, argv, jp, qto if quick else fto, time.monotonic()))
        print(f"[{utc_now()}] running {', '.join(s[0] for s in started)} ...", flush=True)
        results = {}
        if len(started) == 1:
            name, argv, jp, to, t0 = started[0]
            results[name] = (*run_child_json(argv, to, jp), time.monotonic() - t0)
        else:  # a group: run its members side by side, one thread each
            import threading

            def one(name, argv, jp, to, t0):
                results[name] = (*run_child_json(argv, to, jp), time.monotonic() - t0)

            ths = [threading.Thread(target=one, args=s) for s in started]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
        for name, (res, out, note, elapsed) in results.items():
            runs[name] = {"elapsed_s": round(elapsed, 1), "error": note,
                          "argv": next(s[1] for s in started if s[0] == name)[1:]}
            if res is None:
                runs[name]["output_tail"] = out[-2000:]
                merged["notes"][f"bench:{name}"] = note
                continue
            for sect in ("figures", "baselines", "spreads", "notes"):
                merged[sect].update(res.get(sect) or {})
            merged["details"][name] = res.get("details")
            for line in out.strip().splitlines()[-12:]:
                print(f"    {line}")
    return merged, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short windows and fewer pairs: under 2 minutes on 2 cores")
    ap.add_argument("--json", metavar="FILE", help="write every figure (null + a note when not taken) as one object")
    ap.add_argument("--only", help="comma-separated benchmark names: " + ", ".join(b[0] for b in BENCHES))
    a = ap.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None

    t_start, wall0 = time.monotonic(), utc_now()
    busy0, ours0 = _cpu_busy_jiffies(), _our_cpu_s()
    load0 = machine_info().get("loadavg_1_5_15")
    tmp = Path(tempfile.mkdtemp(prefix="stepwatch-bench-all-"))
    try:
        merged, runs = run_all(a.quick, only, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t_start
    busy1, ours1 = _cpu_busy_jiffies(), _our_cpu_s()
    other_share = None
    if busy0 is not None and busy1 is not None:
        hz = os.sysconf("SC_CLK_TCK")
        other_share = max(0.0, ((busy1 - busy0) / hz - (ours1 - ours0)) / elapsed)

    F, B, S, N = merged["figures"], merged["baselines"], merged["spreads"], merged["notes"]
    out: dict[str, Any] = {}
    verdicts: dict[str, str] = {}
    leans: dict[str, str] = {}
    rows = []
    for key, (target, unit, kind) in list(TARGETS.items()) + list(EXTRA_TARGETS.items()):
        if key in EXTRA_TARGETS and key not in F:
            continue
        val = F.get(key)
        if key in TARGETS:
            out[key] = val
        if val is None and key not in N:
            bn = KEY_BENCH.get(key, "?")
            N[key] = (f"benchmark {bn} gave no result: {N[f'bench:{bn}']}" if f"bench:{bn}" in N
                      else f"benchmark {bn} not run" if bn not in runs else f"benchmark {bn} did not report it")
        v, lean = verdict(key, val, S.get(key), target, kind)
        verdicts[key] = v
        if lean:
            leans[key] = lean
        base = (B.get(key) or {}).get("value")
        ratio = None
        if kind == "abs" and val is not None and isinstance(base, (int, float)) and base:
            ratio = val / base
        sp = S.get(key) if kind == "ratio" else None
        rows.append((key, val, unit, base, ratio, sp, target, v))

    hdr = (f"{'key':27} {'figure':>12} {'baseline':>12} {'ratio':>7} {'spread p10..p90':>15} "
           f"{'target':>11}  verdict")
    print()
    print(hdr)
    print("-" * len(hdr))
    for key, val, unit, base, ratio, sp, target, v in rows:
        u = "" if unit == "x" else " " + unit
        bu = (B.get(key) or {}).get("unit") or ""
        base_s = "-" if base is None else fmt_num(base) + (" " + bu if bu else "")
        if (B.get(key) or {}).get("quoted"):
            base_s += "*"
        spread_s = f"{sp['p10']:.3f}..{sp['p90']:.3f}" if sp and sp.get("p10") is not None else "-"
        print(f"{key:27} {fmt_num(val) + (u if val is not None else ''):>12} {base_s:>12} "
              f"{fmt_num(ratio) if ratio is not None else '-':>7} {spread_s:>15} {'<= ' + fmt_num(target) + u:>11}  {v}")
    if any((b or {}).get("quoted") for b in B.values()):
        print("* quoted from the floors measured on the 2-core development VM (2026-11-30), not measured in this run")
    print()
    for key, lean in leans.items():
        sp = S.get(key) or {}
        cis = _median_ci_values(merged, key)
        ci_s = f"; 95 % CI of the median {cis[0]:.4f}..{cis[1]:.4f}" if cis else ""
        if cis:
            sp["median_ci95"] = list(cis)
        print(f"NOISY {key}: the median {fmt_num(F.get(key))} alone would say {lean}; the pairs' p10..p90 "
              f"{fmt_num(sp.get('p10'))}..{fmt_num(sp.get('p90'))} ({sp.get('n')} pairs) straddle the target{ci_s}")
    for key, note in N.items():
        if key in TARGETS or key in EXTRA_TARGETS or key.startswith("bench:"):
            print(f"note {key}: {note}")
    mi = machine_info()
    print(f"\n{mi.get('cores')} cores ({mi.get('cpu_model', '?')}), Python {mi['python']}; load average at start "
          f"{load0}, at end {mi.get('loadavg_1_5_15')}; other work on the machine used "
          f"{fmt_num(other_share)} cores on average during the run; {elapsed:.0f} s "
          f"({'quick' if a.quick else 'full'})")

    if a.json:
        extra = {k: F.get(k) for k in EXTRA_TARGETS if k in F}
        extra.update({k: v for k, v in F.items() if k not in TARGETS and k not in EXTRA_TARGETS})
        for k in ("tui_cpu_share_low",):
            d = (merged["details"].get("tui") or {}).get(k)
            if d is not None:
                extra[k] = d
        obj = dict(out)
        obj.update({
            "notes": {k: v for k, v in N.items()},
            "machine": dict(mi, date_utc=wall0, loadavg_at_start=load0, other_work_cores_during_run=other_share),
            "cores": mi.get("cores"), "python": mi.get("python"), "date": wall0,
            "quick": a.quick, "elapsed_s": round(elapsed, 1),
            "targets": {k: t[0] for k, t in {**TARGETS, **EXTRA_TARGETS}.items()},
            "verdicts": verdicts, "noisy_median_leans": leans,
            "extra_figures": extra, "baselines": B, "spreads": S, "runs": runs, "details": merged["details"],
        })
        Path(a.json).write_text(json.dumps(obj, indent=1, default=str) + "\n")
        print(f"wrote {a.json}")
    return 0


def _median_ci_values(merged: dict[str, Any], key: str) -> tuple[float, float] | None:
    """The 95 % CI of a ratio's median from the per-pair ratios a benchmark kept in its details."""
    d = merged["details"]
    ratios = None
    if key == "emitter_overhead_ratio":
        ratios = ((d.get("emitter") or {}).get("loop") or {}).get("ratios")
    elif key == "callback_overhead_ratio":
        ratios = (d.get("callback") or {}).get("ratios")
    elif key == "attach_events_ratio":
        ratios = (d.get("attach_events") or {}).get("ratios")
    if not ratios:
        return None
    r = sorted(ratios)
    ci = median_ci95(len(r))
    if not ci:
        return None
    return r[ci[0] - 1], r[ci[1] - 1]


if __name__ == "__main__":
    sys.exit(main())
