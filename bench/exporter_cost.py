"""What the Prometheus endpoint costs the supervisor: CPU seconds per scrape of a big run's snapshot
(8 GPUs, 8 ranks, a Slurm job, a dozen alerts), served by :class:`Exporter` in a child process and
scraped over HTTP from this one, beside the floor measured in the same run: a child serving one
gauge with prometheus_client's own server (what any endpoint costs per scrape).

    python bench/exporter_cost.py [--scrapes 400] [--json FILE]

Figures: ``exporter_cpu_s_per_scrape`` (the child's user+system CPU per scrape, psutil),
``exporter_cpu_share_at_5s`` (that over a 5 s scrape interval: the share of one core; target <= 0.01),
``exporter_vs_floor`` (per-scrape CPU against the one-gauge endpoint's). The snapshot itself is made
by the supervisor's detector loop whether or not anything scrapes: not counted here.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)

CHILD = r'''
import json, sys, time
from pathlib import Path
kind, port = sys.argv[1], int(sys.argv[2])
if kind == "exporter":
    from stepwatch.monitors.export.prometheus import Exporter
    from stepwatch.monitors.snapshot.observer import snapshot
    snap = snapshot(Path(sys.argv[3]))
    snap["gpu"] = [{"index": i, "util_pct": 97.0, "sm_active_pct": 80.0, "tensor_active_pct": 55.0, "power_w": 600.0,
                    "power_limit_w": 700.0, "mem_used_bytes": 7e10, "used_by_run": True} for i in range(8)]
    snap["ranks"] = [{"rank": r, "alive": True, "steps": {"p50": 0.25}} for r in range(8)]
    snap["scheduler"] = {"state": "RUNNING", "time_left_s": 3000.0, "time_limit_s": 3600.0}
    snap["alerts"] = list(snap["alerts"]) * 4
    ex = Exporter(f"127.0.0.1:{port}")
    ex.update(snap)
    ex.start()
else:
    from prometheus_client import CollectorRegistry, Gauge, start_http_server
    reg = CollectorRegistry(auto_describe=False)
    Gauge("floor_value", "one gauge", registry=reg).set(1)
    start_http_server(port, addr="127.0.0.1", registry=reg)
print("ready", flush=True)
time.sleep(3600)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cost(kind: str, scrapes: int, run_dir: Path) -> tuple[float, int]:
    """(CPU seconds per scrape of the serving child, bytes per scrape)."""
    port = _free_port()
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind, str(port), str(run_dir)], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/metrics"
        size = len(urllib.request.urlopen(url, timeout=5).read())  # warm: the first scrape imports and builds
        proc = psutil.Process(child.pid)
        t0 = sum(proc.cpu_times()[:2])
        for _ in range(scrapes):
            urllib.request.urlopen(url, timeout=5).read()
        return (sum(proc.cpu_times()[:2]) - t0) / scrapes, size
    finally:
        common.kill_group(child)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=400)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    scrapes = 100 if args.quick else args.scrapes
    res = common.new_result("exporter_cost", args.quick)
    run_dir = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "runs" / "ended-sigkill"
    ours, floor = [], []
    size = fsize = 0  # set by the rounds below
    for _ in range(3):  # interleaved, so a busy moment of the machine falls on both
        c, size = _cost("exporter", scrapes, run_dir)
        ours.append(c)
        f, fsize = _cost("floor", scrapes, run_dir)
        floor.append(f)
    c, f = sorted(ours)[1], sorted(floor)[1]
    res["figures"] = {"exporter_cpu_s_per_scrape": round(c, 6), "exporter_cpu_share_at_5s": round(c / 5.0, 6),
                      "exporter_vs_floor": round(c / f, 2) if f else None}
    res["baselines"] = {"exporter_vs_floor": {"what": "prometheus_client's own server, one gauge", "value": round(f, 6),
                                              "unit": "CPU s per scrape"}}
    res["details"] = {"scrapes": scrapes, "bytes_per_scrape": size, "floor_bytes_per_scrape": fsize,
                      "runs": {"exporter": ours, "floor": floor}}
    print(f"exporter_cost: {c * 1e3:.2f} ms CPU per scrape ({size:,} bytes), {100 * c / 5.0:.3f}% of a core at a 5 s "
          f"scrape interval (target <= 1%); floor (one gauge) {f * 1e3:.2f} ms; ratio {c / f:.1f}")
    common.write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
