"""How long the log panel's `/` takes on a big train.log: LogLines' first read plus one search over
100,000 lines (the worst case: the one match is the first line, searched from the end), beside a
plain read of the same file and ``str.find`` over its text in the same run (the floor).

    python bench/log_search.py [--lines 100000] [--repeat 5] [--json FILE]

Figures: ``log_search_s`` (median seconds of read + split + search, cold: a new LogLines each
time), ``log_search_again_s`` (a second search on the same LogLines: what n / N cost), and
``log_search_ratio`` (log_search_s ÷ the floor). Target: log_search_s ≤ 1 s for 100,000 lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)

from stepwatch.monitors.readers.loglines import LogLines, literal  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = common.new_result("log_search", args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        lines = [f"step {i} loss {1.0 / i:.6f} lr 0.0003 grad_norm 0.51 tokens 4096" for i in range(1, args.lines + 1)]
        lines[0] = "step 1 the needle"
        path.write_text("\n".join(lines) + "\n")
        needle = literal("needle")
        cold, again, floor = [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            ll = LogLines(path)
            ll.refresh()
            no = ll.find(needle, ll.last_line + 1, forward=False)
            cold.append(time.perf_counter() - t0)
            assert no == 1, no
            t0 = time.perf_counter()
            ll.find(needle, ll.last_line + 1, forward=False)
            again.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            text = path.read_text()
            text.lower().find("needle")
            floor.append(time.perf_counter() - t0)
        size = path.stat().st_size
    c, a, f = statistics.median(cold), statistics.median(again), statistics.median(floor)
    res["figures"] = {"log_search_s": round(c, 4), "log_search_again_s": round(a, 4),
                      "log_search_ratio": round(c / f, 2) if f else None}
    res["baselines"] = {"log_search_ratio": {"what": "read_text + str.find of the same file", "value": round(f, 4),
                                             "unit": "s"}}
    res["spreads"] = {"log_search_s": common.spread(cold)}
    res["details"] = {"lines": args.lines, "bytes": size, "repeat": args.repeat}
    print(f"log_search: {args.lines:,} lines ({size / 1e6:.1f} MB): first search {c:.3f} s, again {a:.3f} s; "
          f"floor (read + find) {f:.3f} s; ratio {c / f:.1f}")
    common.write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
