"""CPU cost of the GPU sampler: CPU seconds per wall second at 1 Hz, on the recorded backend.

    python bench/gpu_sampler_cost.py            # 60 s window, 8 devices
    python bench/gpu_sampler_cost.py --quick    # 5 s window
    python bench/gpu_sampler_cost.py --json F   # also the common --json shape (bench/common.py)

Runs :class:`stepwatch.monitors.gpu.sampler.GpuSampler` on its own thread, replaying a bundled synthetic
recording whose devices are copied ``--devices`` times (an 8-GPU node by default), writing gpu.jsonl
to a temporary run dir, watching this process's own pid (so the run-tree lookup runs too). The whole
process's CPU time (``time.process_time``: user + system, all threads) over the window, divided by the
window's wall time, is the sampler's cost -- nothing else runs in the process meanwhile.

What it does not include: time spent inside NVML itself (the real backend's driver calls, typically
well under a millisecond each); run ``tools/gpu_probe.py`` on a GPU machine for those.

When NVML answers (a GPU machine), the same window is also measured on the real backend
(``NvmlBackend``, every device of the machine): ``details.nvml``; without NVML that part is skipped
and ``notes`` says so. ``--no-nvml`` skips it.

Prints one line per backend; exits 1 when the cost is above the target (0.01 CPU-s per s).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording, load_recording  # noqa: E402
from stepwatch.monitors.gpu.sampler import GpuSampler  # noqa: E402

TARGET = 0.01


def widened_recording(src: Path, devices: int, dst: Path) -> Path:
    """Copy ``src`` with each record's first device repeated ``devices`` times (indices/uuids renumbered)."""
    headers, samples = load_recording(src)
    with open(dst, "w", encoding="utf-8") as f:
        for h in headers:
            f.write(json.dumps(h) + "\n")
        for s in samples:
            base = s["devices"][0]
            devs = []
            for i in range(devices):
                d = copy.deepcopy(base)
                d["index"], d["uuid"] = i, f"{base['uuid']}-{i}"
                devs.append(d)
            f.write(json.dumps(dict(s, devices=devs)) + "\n")
    return dst


def nvml_present() -> str | None:
    """None when NVML initialises here, else why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return None if n > 0 else "NVML found no device"
    except Exception as e:
        return f"NVML unavailable here ({type(e).__name__}: {e})"


def measure(window_s: float, interval_s: float, devices: int, recording: str, real: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-") as tmp:
        if real:
            from stepwatch.monitors.gpu.backend import NvmlBackend

            backend = NvmlBackend()
        else:
            rec = widened_recording(bundled_recording(recording), devices, Path(tmp) / recording)
            backend = RecordedBackend(rec)
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        sampler = GpuSampler(run_dir, os.getpid(), interval_s=interval_s, backend=backend)
        stop = threading.Event()
        th = threading.Thread(target=sampler.run, args=(stop,), daemon=True)
        th.start()
        # let the first ticks (imports, file creation) pass before measuring
        warm_until = time.monotonic() + min(2.0, window_s / 4)
        while time.monotonic() < warm_until:
            time.sleep(0.05)
        ticks0, cpu0, wall0 = sampler.ticks, time.process_time(), time.monotonic()
        time.sleep(window_s)
        cpu1, wall1, ticks1 = time.process_time(), time.monotonic(), sampler.ticks
        stop.set()
        th.join(5)
    return {"cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "ticks": ticks1 - ticks0,
            "cost": (cpu1 - cpu0) / (wall1 - wall0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s window instead of 60 s")
    ap.add_argument("--window", type=float, default=None, help="measurement window, seconds")
    ap.add_argument("--interval", type=float, default=1.0, help="sampler interval, seconds (1 Hz by default)")
    ap.add_argument("--devices", type=int, default=8, help="devices per record")
    ap.add_argument("--recording", default="synthetic_h100_healthy_compute_bound.jsonl")
    ap.add_argument("--no-nvml", action="store_true", help="do not measure the real NVML backend even if present")
    ap.add_argument("--json", metavar="FILE", help="write the common --json shape")
    args = ap.parse_args(argv)
    window = args.window or (5.0 if args.quick else 60.0)
    key = "gpu_sampler_cpu_share"
    out = _new_result(args.quick)
    out["figures"][key] = None
    worst = 0.0
    try:
        r = measure(window, args.interval, args.devices, args.recording)
        out["figures"][key] = r["cost"]
        out["details"]["recorded"] = dict(r, devices=args.devices, recording=args.recording)
        worst = r["cost"]
        verdict = "OK" if r["cost"] <= TARGET else "OVER TARGET"
        print(f"gpu sampler cost: {r['cost']:.5f} CPU-s per wall-s ({r['cpu_s']*1000:.1f} ms CPU over "
              f"{r['wall_s']:.1f} s, {r['ticks']} ticks at {1/args.interval:g} Hz, recorded backend, "
              f"{args.devices} devices; target <= {TARGET}) {verdict}")
    except Exception as e:
        out["notes"][key] = f"recorded backend: {type(e).__name__}: {e}"
        print(f"gpu sampler (recorded) failed: {e!r}")
    why = "skipped (--no-nvml)" if args.no_nvml else nvml_present()
    if why is None:
        try:
            r = measure(window, args.interval, args.devices, args.recording, real=True)
            out["details"]["nvml"] = r
            out["figures"]["gpu_sampler_cpu_share_nvml"] = r["cost"]
            worst = max(worst, r["cost"])
            print(f"gpu sampler cost, real NVML backend: {r['cost']:.5f} CPU-s per wall-s ({r['ticks']} ticks)")
        except Exception as e:
            out["notes"]["gpu_sampler_cpu_share_nvml"] = f"real backend: {type(e).__name__}: {e}"
    else:
        out["figures"]["gpu_sampler_cpu_share_nvml"] = None
        out["notes"]["gpu_sampler_cpu_share_nvml"] = f"real backend not measured: {why}"
        print(f"real NVML backend not measured: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if worst <= TARGET else 1


def _new_result(quick: bool) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_common", Path(__file__).with_name("common.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {spec}")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common.new_result("gpu_sampler_cost", quick)


if __name__ == "__main__":
    sys.exit(main())
