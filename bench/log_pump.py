"""What the log pump costs a chatty run: a child that prints as fast as it can, its stdout a pipe that
:class:`stepwatch.monitors.watch.logpump.LogPump` copies into a file, beside the same child writing
straight into the file (what the supervisor did before the pump), in the same run.

    python bench/log_pump.py [--lines 500000] [--pairs 6] [--quick] [--json FILE]

Figures: ``log_pump_ratio`` (median per-pair ratio of the child's wall time, from start until its
bytes are all in the file: pumped ÷ direct; target ≤ 1.10) and ``log_pump_mb_per_s`` (what the
pump carried per second). A training run prints KB/s, not the hundreds of MB/s measured here: the
ratio is the worst case.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)

from stepwatch.monitors.watch.logpump import LogPump  # noqa: E402

CHILD = ("import os, sys\nline = b'step 1234 loss 2.3456 lr 0.0003 ' + b'x' * 160 + b'\\n'\n"
         "for _ in range(int(sys.argv[1])):\n    os.write(1, line)\n")


def _direct(path: Path, lines: int) -> float:
    path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(path, "ab", buffering=0) as f:
        subprocess.run([sys.executable, "-c", CHILD, str(lines)], stdout=f, check=True)
    return time.perf_counter() - t0


def _pumped(path: Path, lines: int) -> float:
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    t0 = time.perf_counter()
    r, w = os.pipe()
    pump = LogPump(r, path).start()
    subprocess.run([sys.executable, "-c", CHILD, str(lines)], stdout=w, check=True)
    os.close(w)
    assert pump.drain(60), "the pump did not drain"
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    lines = 100_000 if args.quick else args.lines
    res = common.new_result("log_pump", args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        pairs = common.interleaved_pairs(lambda: _direct(path, lines), lambda: _pumped(path, lines), args.pairs)
        size = path.stat().st_size
    ratio = common.ratio_of_pairs(pairs)
    pumped = sorted(b for _, b in pairs)[len(pairs) // 2]
    direct = sorted(a for a, _ in pairs)[len(pairs) // 2]
    res["figures"] = {"log_pump_ratio": round(ratio["median"], 3), "log_pump_mb_per_s": round(size / pumped / 1e6, 1)}
    res["baselines"] = {"log_pump_ratio": {"what": "the same child writing straight into the file", "value": round(direct, 4),
                                           "unit": "s"}}
    res["spreads"] = {"log_pump_ratio": ratio}
    res["details"] = {"lines": lines, "bytes": size, "pairs": args.pairs}
    print(f"log_pump: {lines:,} lines ({size / 1e6:.0f} MB): pumped {pumped:.3f} s, direct {direct:.3f} s; "
          f"ratio {ratio['median']:.3f} (p10 {ratio['p10']:.3f}, p90 {ratio['p90']:.3f}); {size / pumped / 1e6:.0f} MB/s")
    common.write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
