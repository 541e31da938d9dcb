"""Print what stepwatch's real NVML backend reads on this machine, per device.

    python tools/gpu_probe.py               # 3 samples, 1 s apart, a table per device
    python tools/gpu_probe.py --json        # the last sample as JSON, plus timings and GPM support
    python tools/gpu_probe.py --samples 5 --interval 0.5

Run it on a GPU machine: it shows each field with its unit, which power source was used
(energy-counter delta or nvmlDeviceGetPowerUsage), whether GPM is supported (Hopper and later) and, for
every null field, the reason NVML gave. The first sample only seeds GPM and the energy delta, so at
least two samples are taken. On a machine without NVML it prints the "NVML unavailable: ..." line and
exits 0 -- that is a normal state, not a failure. Exit 1 only for a bug (an exception escaping).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepwatch.monitors.gpu.backend import NvmlBackend  # noqa: E402
from stepwatch.monitors.gpu.reading import power_share  # noqa: E402

FIELDS = (
    ("util_pct", "kernel-active", "%"),
    ("power_w", "power", "W"),
    ("power_limit_w", "enforced power limit", "W"),
    ("mem_used_bytes", "memory used", "bytes"),
    ("mem_total_bytes", "memory total", "bytes"),
    ("sm_clock_mhz", "SM clock", "MHz"),
    ("mem_clock_mhz", "memory clock", "MHz"),
    ("temperature_c", "temperature", "C"),
    ("sm_active_pct", "SM active (GPM)", "%"),
    ("sm_occupancy_pct", "SM occupancy (GPM)", "%"),
    ("tensor_active_pct", "tensor-core active (GPM)", "%"),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--samples", type=int, default=3, help="samples to take (>= 2)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-call deadline, seconds")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)

    b = NvmlBackend(call_timeout_s=args.timeout, init_timeout_s=max(10.0, args.timeout))
    timings = []
    snap: dict = {"devices": [], "gpu_error": None}
    try:
        for i in range(max(2, args.samples)):
            if i:
                time.sleep(args.interval)
            t = time.monotonic()
            snap = b.sample()
            timings.append(round(time.monotonic() - t, 4))
            if snap["gpu_error"] and not snap["devices"]:
                break
        gpm = b.gpm_status()
        threads = b.worker_threads()
    finally:
        b.close()

    if args.json:
        print(json.dumps({"sample": snap, "sample_seconds": timings, "gpm": {str(k): v for k, v in gpm.items()},
                          "worker_threads": len(threads)}, indent=2))
        return 0
    print(f"sample wall times (s): {timings}; worker threads: {len(threads)}")
    if snap["gpu_error"]:
        print(f"gpu_error: {snap['gpu_error']}")
    if not snap["devices"] and not snap["gpu_error"]:
        print("NVML answered: no GPU devices")
    for d in snap["devices"]:
        print(f"\nGPU {d['index']}: {d['name']}  {d['uuid']}")
        if d["error"]:
            print(f"  ERROR: {d['error']}")
        print(f"  GPM: {gpm.get(d['index'], 'unknown')}   MIG enabled: {d['mig_enabled']}")
        for key, label, unit in FIELDS:
            v = d[key]
            shown = "null" if v is None else f"{v} {unit}"
            why = f"   <- {d['unsupported'][key]}" if v is None and key in d["unsupported"] else ""
            print(f"  {label:<26} {shown}{why}")
        print(f"  {'power source':<26} {d['power_source']}")
        share = power_share(d["power_w"], d["power_limit_w"])
        print(f"  {'power share':<26} {'null' if share is None else f'{share:.1%}'}")
        for inst in d["mig_instances"]:
            print(f"  MIG {inst['index']}: {inst['uuid']} gi={inst['gpu_instance_id']} "
                  f"mem {inst['mem_used_bytes']}/{inst['mem_total_bytes']} bytes")
        procs = d["processes"]
        if procs is None:
            print(f"  processes: null   <- {d['unsupported'].get('processes')}")
        else:
            for p in procs:
                print(f"  process {p['pid']} ({p['kind']}): {p['used_memory_bytes']} bytes")
        others = {k: v for k, v in d["unsupported"].items() if k not in dict((f[0], 1) for f in FIELDS) and k != "processes"}
        for k, v in others.items():
            print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
