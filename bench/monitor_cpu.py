"""CPU share of ``stepwatch watch RUN --plain`` following a steady run (target <= 0.02 CPU-s per s).

    python bench/monitor_cpu.py [--quick] [--json FILE]

Launches the steady fake run (bench/steady_run.py: 10 step events/s through StepTelemetry, 100 log
lines/s, launched by stepwatch's own launcher, so its supervisor and GPU sampler run too), starts
``python -m stepwatch.tui.cli watch RUN --plain`` with its stdout in a file, lets it catch up for ``--warmup``
seconds, then reads its CPU time (user + system, psutil) at both ends of a ``--window`` seconds
window. The figure is CPU seconds per wall second. For scale, the same is reported for the run's
supervisor (which copies the job's output into train.log) and for the fake job itself.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, kill_group, new_result, write_json  # noqa: E402
from steady_run import steady_run  # noqa: E402

TARGET = 0.02


def cpu_s(p) -> float | None:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except Exception:
        return None


def measure(warmup_s: float, window_s: float) -> dict:
    import psutil

    from stepwatch.monitors.runfiles import RUN_JSON, read_json

    with steady_run(max_s=warmup_s + window_s + 120) as run_dir:
        run = read_json(run_dir / RUN_JSON) or {}
        out_path = run_dir.parent / "watch.out"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "stepwatch.tui.cli", "watch", str(run_dir), "--plain"],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(ROOT))
        try:
            p = psutil.Process(proc.pid)
            others = {k: psutil.Process(int((run.get(k) or {})["pid"])) for k in ("supervisor", "process")
                      if (run.get(k) or {}).get("pid")}
            time.sleep(warmup_s)
            ev0 = (run_dir / "events.jsonl").stat().st_size
            c0, w0 = cpu_s(p), time.monotonic()
            o0 = {k: cpu_s(q) for k, q in others.items()}
            time.sleep(window_s)
            c1, w1 = cpu_s(p), time.monotonic()
            o1 = {k: cpu_s(q) for k, q in others.items()}
            ev1 = (run_dir / "events.jsonl").stat().st_size
            alive = proc.poll() is None
        finally:
            kill_group(proc)
        lines = out_path.read_text(errors="replace").splitlines()
    wall = w1 - w0
    return {
        "cpu_share": (c1 - c0) / wall if c0 is not None and c1 is not None else None,
        "cpu_s": None if c0 is None or c1 is None else c1 - c0, "wall_s": wall,
        "watch_alive_at_end": alive, "watch_output_lines": len(lines), "watch_output_tail": lines[-3:],
        "events_bytes_in_window": ev1 - ev0,
        "others_cpu_share": {k: ((b - a) / wall if (a := o0.get(k)) is not None and (b := o1.get(k)) is not None
                                 else None) for k in others},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 s window instead of 60 s")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--window", type=float)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    window = a.window or (10.0 if a.quick else 60.0)
    res = new_result("monitor_cpu", a.quick)
    key = "monitor_cpu_share"
    try:
        r = measure(a.warmup, window)
        res["details"] = r
        res["figures"][key] = r["cpu_share"]
        if not r["watch_alive_at_end"]:
            res["notes"][key] = "watch exited during the window: " + " | ".join(r["watch_output_tail"])
        print(f"watch --plain: {r['cpu_share']:.4f} CPU-s per wall-s over {r['wall_s']:.1f} s "
              f"(target <= {TARGET}); supervisor {r['others_cpu_share'].get('supervisor')}, "
              f"fake job {r['others_cpu_share'].get('process')}; {r['watch_output_lines']} lines printed")
    except Exception as e:  # a benchmark never crashes the suite
        res["figures"][key] = None
        res["notes"][key] = f"{type(e).__name__}: {e}"
        print(f"monitor_cpu failed: {e!r}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
