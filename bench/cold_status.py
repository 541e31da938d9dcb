"""A cold ``stepwatch status RUN --json`` of a big events.jsonl, against parsing its lines with orjson.

    python bench/cold_status.py [--quick] [--steps N] [--dir DIR] [--rounds N] [--json FILE]

Builds (in a temporary directory deleted afterwards, or in ``--dir``, kept and reused when it
already holds a run of that size) the finished run of ``bench/attach_events.py`` with ``--steps``
step events: 5,000,000 by default (about 1 GB of events.jsonl, 5.5 M lines), 100,000 with
``--quick`` (20 MB). There is no events.state.json (the run had no supervisor), so ``status``
parses and folds every line: the cold path. Then, in ``--rounds`` rounds (default 3), order
alternating:

* A, the baseline: read events.jsonl in 1 MiB chunks, split the lines, ``orjson.loads`` each;
* B: ``python -m stepwatch.tui.cli status RUN --json`` as a child process (interpreter start,
  imports, the whole fold, the JSON out to /dev/null), its wall time.

Figures: ``cold_status_ratio`` (median of the per-round B/A, target <= 3) and
``cold_status_peak_rss_mb`` (the largest peak RSS of the B children, from
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, target < 500). Details: the times, the same in
CPU seconds (``cpu_ratio``: the child's user + system time over the parse's process time, steadier
than wall time on a shared machine), the file's size, steps and lines, and the snapshot's step
count (checked: every step but the first and the saves' counted).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, new_result, spread, write_json  # noqa: E402

TARGET_RATIO, TARGET_RSS_MB = 3.0, 500.0
_CHUNK = 1 << 20


def time_orjson_parse(path: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds to read ``path`` in 1 MiB chunks and ``orjson.loads`` every line; the
    line count."""
    import orjson

    loads = orjson.loads
    n = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    carry = b""
    with open(path, "rb") as f:
        while data := f.read(_CHUNK):
            lines = (carry + data).split(b"\n")
            carry = lines.pop()
            for line in lines:
                if line:
                    loads(line)
            n += len(lines)
    if carry:
        loads(carry)
        n += 1
    return time.perf_counter() - t0, time.process_time() - c0, n


def time_cold_status(run_dir: Path) -> tuple[float, float, float, dict]:
    """Wall and CPU (user + system) seconds of ``stepwatch status RUN --json`` in a child, the
    peak RSS (MB) of the largest child so far, and the snapshot it printed."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(run_dir), "--json"],
                       cwd=ROOT, stdout=subprocess.PIPE, check=True)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rss_mb = r1.ru_maxrss / 1024.0  # KiB on Linux
    return dt, cpu, rss_mb, json.loads(p.stdout)


def ensure_run(run_dir: Path, steps: int) -> dict:
    """The finished run of ``steps`` steps in ``run_dir`` (built unless a run of that size is there)."""
    from attach_events import build_run

    marker = run_dir / "bench-info.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("step_events") == steps and (run_dir / "events.jsonl").stat().st_size == info["events_bytes"]:
            info["built_s"] = None
            return info
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    info = build_run(run_dir, steps)
    info["built_s"] = time.perf_counter() - t0
    (run_dir / "events.state.json").unlink(missing_ok=True)
    marker.write_text(json.dumps(info))
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100,000 steps (20 MB)")
    ap.add_argument("--steps", type=int, help="step events (default 5,000,000: about 1 GB)")
    ap.add_argument("--dir", type=Path, help="build (or reuse) the run here and keep it (under /tmp, not the repo)")
    ap.add_argument("--rounds", type=int, help="rounds of (A, B), order alternating (default 3)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    steps = a.steps or (100_000 if a.quick else 5_000_000)
    rounds = a.rounds or 3
    res = new_result("cold_status", a.quick)
    F, N = res["figures"], res["notes"]
    F["cold_status_ratio"] = F["cold_status_peak_rss_mb"] = None
    tmp = None if a.dir else Path(tempfile.mkdtemp(prefix="stepwatch-bench-cold-"))
    try:
        run_dir = a.dir if a.dir else tmp / "finished-run"  # type: ignore[operator]
        info = ensure_run(run_dir, steps)
        ev = run_dir / "events.jsonl"
        got: list[dict[str, float]] = []
        rss: list[float] = []
        snap: dict = {}
        for i in range(rounds):
            r: dict[str, float] = {}
            for k in ("AB" if i % 2 == 0 else "BA"):
                if k == "A":
                    r["A"], r["A_cpu"], lines = time_orjson_parse(ev)
                    info["lines"] = lines
                else:
                    r["B"], r["B_cpu"], peak, snap = time_cold_status(run_dir)
                    rss.append(peak)
            got.append(r)
        ratios = [g["B"] / g["A"] for g in got]
        F["cold_status_ratio"] = statistics.median(ratios)
        F["cold_status_peak_rss_mb"] = max(rss)
        res["spreads"]["cold_status_ratio"] = spread(ratios)
        res["baselines"]["cold_status_ratio"] = {"what": "read + orjson.loads of every line of events.jsonl (median)",
                                                 "value": statistics.median(g["A"] for g in got), "unit": "s"}
        n = (snap.get("step_seconds") or {}).get("n")
        # every step but the first and those flagged `save` (the one after each 500th: attach_events.event_lines),
        # whose interval held a save and which no percentile counts
        counted = steps - 1 - (steps - 1) // 500
        if n != counted:
            N["cold_status_ratio"] = f"the snapshot counted {n} steps, expected {counted}"
        if (snap.get("events") or {}).get("resume") is not None:
            N["cold_status_ratio"] = f"not a cold status: {snap['events']['resume']}"
        info.update({"rounds": len(got), "status_s": spread(g["B"] for g in got),
                     "orjson_parse_s": spread(g["A"] for g in got), "ratios": ratios, "snapshot_step_n": n,
                     # CPU seconds: steadier than wall time on a shared machine (no target)
                     "status_cpu_s": spread(g["B_cpu"] for g in got),
                     "orjson_parse_cpu_s": spread(g["A_cpu"] for g in got),
                     "cpu_ratio": statistics.median(g["B_cpu"] / g["A_cpu"] for g in got)})
        res["details"] = info
        print(f"finished run: {steps:,} step events, {info.get('lines', 0):,} lines, "
              f"{info['events_bytes'] / 1e6:.0f} MB")
        print(f"cold `stepwatch status RUN --json`: median {statistics.median(g['B'] for g in got):.2f} s; "
              f"read + orjson.loads of every line: median {statistics.median(g['A'] for g in got):.2f} s; "
              f"ratio {F['cold_status_ratio']:.2f} (target <= {TARGET_RATIO:g}); peak RSS "
              f"{F['cold_status_peak_rss_mb']:.0f} MB (target < {TARGET_RSS_MB:g}); {len(got)} round(s); in CPU "
              f"seconds {statistics.median(g['B_cpu'] for g in got):.2f} / {statistics.median(g['A_cpu'] for g in got):.2f} "
              f"= {info['cpu_ratio']:.2f}")
    except Exception as e:
        for k in ("cold_status_ratio", "cold_status_peak_rss_mb"):
            if F[k] is None:
                N[k] = f"{type(e).__name__}: {e}"
        print(f"cold_status failed: {e!r}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
