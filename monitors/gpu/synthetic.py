"""Generator of the SYNTHETIC GPU recordings in ``assets/gpu_recordings/``.

No GPU was there to record from, so these files are made, not measured. They are shaped after NVML's
documented values and data sheets (H100 SXM5 80GB: enforced power limit 700 W, 81559 MiB, SM clock up
to 1980 MHz, memory clock 2619 MHz; A100 SXM4 80GB: 400 W, 81920 MiB, 1410 / 1593 MHz) and after the
SM-busy, tensor-idle reading of ARCHITECTURE.md's "Reference runs" (100% utilisation at 279-292 W).
Every file says "synthetic" in its name and in its first (header) line. Deterministic (seeded), so the files can be regenerated and compared::

    python -m stepwatch.monitors.gpu.synthetic assets/gpu_recordings

Replace them with real recordings (a run's ``gpu.jsonl`` replays as is) when a GPU is available.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.gpu.schema import empty_device, make_record

T0 = 1780000000.0
MIB = 1 << 20
H100 = {"name": "NVIDIA H100 80GB HBM3", "mem_total_bytes": 81559 * MIB, "power_limit_w": 700.0,
        "sm_clock_max": 1980, "mem_clock_mhz": 2619}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "mem_total_bytes": 81920 * MIB, "power_limit_w": 400.0,
        "sm_clock_max": 1410, "mem_clock_mhz": 1593}
A10_VGPU = {"name": "NVIDIA A10-24Q", "mem_total_bytes": 24576 * MIB, "power_limit_w": None,
            "sm_clock_max": 1695, "mem_clock_mhz": 6251}
RUN_PID = 4242
GPM_FIRST = "GPM: first sample only seeds the interval"
GPM_NO = "GPM unavailable: nvmlGpmQueryDeviceSupport says this device does not support GPM"
LOST = "GPU is lost: nvmlDeviceGetHandleByIndex: GPU is lost (NVMLError_GpuIsLost)"


def _uuid(kind: str, index: int) -> str:
    return f"GPU-synthetic-{kind}-{index:04d}"


def _device(rng: random.Random, spec: dict[str, Any], index: int, kind: str, *, util: float, power_w: float | None,
            mem_used: int, sm: float | None, occ: float | None, tensor: float | None, gpm: str | None,
            temp: float, first: bool = False, in_run: bool = True) -> dict[str, Any]:
    """One device as the real backend writes it. ``gpm``: None = supported, else the reason."""
    d = empty_device(index)
    d.update(name=spec["name"], uuid=_uuid(kind, index), util_pct=int(round(util)), mem_used_bytes=int(mem_used),
             mem_total_bytes=spec["mem_total_bytes"], mem_clock_mhz=spec["mem_clock_mhz"],
             temperature_c=int(round(temp)), mig_enabled=False, used_by_run=in_run)
    d["sm_clock_mhz"] = spec["sm_clock_max"] if util < 50 else spec["sm_clock_max"] - rng.choice((0, 15, 30, 45))
    if spec["power_limit_w"] is None:
        d["unsupported"]["power_w"] = ("nvmlDeviceGetTotalEnergyConsumption: Not Supported (NVMLError_NotSupported); "
                                       "nvmlDeviceGetPowerUsage: Not Supported (NVMLError_NotSupported)")
        d["unsupported"]["power_limit_w"] = "nvmlDeviceGetEnforcedPowerLimit: Not Supported (NVMLError_NotSupported)"
    else:
        d["power_limit_w"] = spec["power_limit_w"]
        d["power_w"] = round(power_w, 3) if power_w is not None else None
        # the first tick has no energy delta yet: the backend falls back to the ~1 s average
        d["power_source"] = "power_usage_avg" if first else "energy_counter"
    if gpm is None:
        d["gpm_supported"] = True
        if first:
            for k in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"):
                d["unsupported"][k] = GPM_FIRST
        else:
            d.update(sm_active_pct=round(sm, 2), sm_occupancy_pct=round(occ, 2), tensor_active_pct=round(tensor, 2))
    else:
        d["gpm_supported"] = False
        for k in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"):
            d["unsupported"][k] = gpm
    d["processes"] = ([{"pid": RUN_PID, "used_memory_bytes": int(mem_used) - 512 * MIB, "kind": "compute",
                        "mig_uuid": None, "in_run": True}] if d["used_by_run"] else [])
    return d


def _lost(spec: dict[str, Any], index: int, kind: str, since_t: float, retry_s: float) -> dict[str, Any]:
    from stepwatch.monitors.runfiles import utc_iso

    d = empty_device(index)
    d.update(name=spec["name"], uuid=_uuid(kind, index),
             error=f"{LOST} since {utc_iso(since_t)}; next retry in {retry_s:.0f} s")
    return d


def _busy(rng: random.Random, spec: dict[str, Any], i: int, index: int, kind: str, *, p_lo: float, p_hi: float,
          t_lo: float, t_hi: float, gpm: str | None, first: bool) -> dict[str, Any]:
    return _device(rng, spec, index, kind, util=rng.choice((100, 100, 100, 99, 98)), power_w=rng.uniform(p_lo, p_hi),
                   mem_used=int(spec["mem_total_bytes"] * 0.86), sm=rng.uniform(90, 98), occ=rng.uniform(45, 62),
                   tensor=rng.uniform(t_lo, t_hi), gpm=gpm, temp=60 + 6 * rng.random(), first=first)


def healthy(rng: random.Random) -> list[dict[str, Any]]:
    """H100, compute-bound bf16 training: 100% kernel-active, 560-690 W, tensor cores 55-72% (GPM);
    a 10 s load phase (idle) at the start and a 6 s checkpoint save (idle dip) in the middle."""
    out = []
    for i in range(150):
        first = i == 0
        if i < 10 or 90 <= i < 96:
            d = _device(rng, H100, 0, "h100", util=rng.choice((0, 0, 0, 2)), power_w=rng.uniform(72, 120),
                        mem_used=(2 + i) << 30 if i < 10 else int(H100["mem_total_bytes"] * 0.86), sm=rng.uniform(0, 2),
                        occ=rng.uniform(0, 2), tensor=0.0, gpm=None, temp=40 + rng.random() * 3, first=first)
        else:
            d = _busy(rng, H100, i, 0, "h100", p_lo=560, p_hi=690, t_lo=55, t_hi=72, gpm=None, first=first)
        out.append(make_record(T0 + i, [d], None, "synthetic"))
    return out


def sm_busy_tensor_idle(rng: random.Random) -> list[dict[str, Any]]:
    """H100 with GPM: 100% kernel-active at 279-292 W (~41% of 700 W) with tensor cores 1-4% --
    the SM-busy, tensor-idle shape (elementwise/attention work that is not matrix multiplication)."""
    return [make_record(T0 + i, [_busy(rng, H100, i, 0, "h100", p_lo=279, p_hi=292, t_lo=1, t_hi=4, gpm=None,
                                       first=i == 0)], None, "synthetic") for i in range(90)]


def sm_busy_power_only(rng: random.Random) -> list[dict[str, Any]]:
    """A100 (no GPM before Hopper): 100% kernel-active at 150-170 W of 400 W; the verdict can only be
    inferred from power and says so."""
    return [make_record(T0 + i, [_busy(rng, A100, i, 0, "a100", p_lo=150, p_hi=170, t_lo=0, t_hi=0, gpm=GPM_NO,
                                       first=i == 0)], None, "synthetic") for i in range(90)]


def without_power(rng: random.Random) -> list[dict[str, Any]]:
    """A vGPU guest (A10-24Q): power draw and power limit are NOT_SUPPORTED, no GPM; 100% kernel-active.
    Nothing can tell tensor-idle from busy here, and the verdict must not claim it."""
    return [make_record(T0 + i, [_busy(rng, A10_VGPU, i, 0, "a10vgpu", p_lo=0, p_hi=0, t_lo=0, t_hi=0, gpm=GPM_NO,
                                       first=i == 0)], None, "synthetic") for i in range(90)]


def gpu_lost(rng: random.Random) -> list[dict[str, Any]]:
    """Two H100s, healthy; GPU 0 is lost at t+40 s (NVML_ERROR_GPU_IS_LOST) and stays lost, retried with
    back-off (2, 4, 8, 16, 32, 60 s); GPU 1 keeps running."""
    out = []
    lost_at = 40
    retries = [lost_at]
    delay = 2.0
    while retries[-1] < 120:
        retries.append(int(retries[-1] + delay))
        delay = min(delay * 2, 60.0)
    for i in range(120):
        devs = []
        if i < lost_at:
            devs.append(_busy(rng, H100, i, 0, "h100", p_lo=560, p_hi=690, t_lo=55, t_hi=72, gpm=None, first=i == 0))
        else:
            nxt = min(r for r in retries if r > i) if any(r > i for r in retries) else i
            devs.append(_lost(H100, 0, "h100", T0 + lost_at, nxt - i))
        devs.append(_busy(rng, H100, i, 1, "h100", p_lo=560, p_hi=690, t_lo=55, t_hi=72, gpm=None, first=i == 0))
        out.append(make_record(T0 + i, devs, None, "synthetic"))
    return out


def idle(rng: random.Random) -> list[dict[str, Any]]:
    """H100 with nothing running: 0-2% kernel-active at 68-75 W (~10% of the limit), tensor 0% --
    low power and idle tensor cores, yet not "SM-busy"."""
    return [make_record(T0 + i, [_device(rng, H100, 0, "h100", util=rng.choice((0, 0, 0, 0, 1, 2)),
                                         power_w=rng.uniform(68, 75), mem_used=512 * MIB, sm=rng.uniform(0, 1),
                                         occ=rng.uniform(0, 1), tensor=0.0, gpm=None, temp=31 + rng.random(),
                                         first=i == 0, in_run=False)], None, "synthetic") for i in range(90)]


#: file name -> (generator, expected final verdict code per device index, what it is shaped after)
RECORDINGS: dict[str, tuple[Callable[[random.Random], list[dict[str, Any]]], dict[int, str], str]] = {
    "synthetic_h100_healthy_compute_bound.jsonl": (healthy, {0: "busy"}, "H100 SXM5 80GB, NVML documented units"),
    "synthetic_h100_sm_busy_tensor_idle.jsonl": (sm_busy_tensor_idle, {0: "SM-busy, tensor-idle"},
                                                 "ARCHITECTURE.md, Reference runs: 100% utilisation at 279-292 W; H100 700 W limit"),
    "synthetic_a100_sm_busy_power_only.jsonl": (sm_busy_power_only, {0: "SM-busy, tensor-idle"},
                                                "A100 SXM4 80GB (400 W, no GPM)"),
    "synthetic_gpu_without_power_readings.jsonl": (without_power, {0: "busy"},
                                                   "vGPU guest: nvmlDeviceGetPowerUsage NOT_SUPPORTED"),
    "synthetic_h100_gpu_lost_mid_run.jsonl": (gpu_lost, {0: "no reading", 1: "busy"},
                                              "NVML_ERROR_GPU_IS_LOST mid-run on one of two H100s"),
    "synthetic_h100_idle.jsonl": (idle, {0: "idle"}, "H100 idle draw ~70 W"),
}


def header(name: str) -> dict[str, Any]:
    gen, expected, shaped_after = RECORDINGS[name]
    return {"recording": "synthetic", "name": name,
            "warning": "SYNTHETIC: no GPU was recorded; made by monitors/gpu/synthetic.py",
            "description": " ".join((gen.__doc__ or "").split()), "shaped_after": shaped_after,
            "expected_verdicts": {str(k): v for k, v in expected.items()},
            "generated_by": "python -m stepwatch.monitors.gpu.synthetic assets/gpu_recordings", "interval_s": 1.0}


def render(name: str) -> str:
    """The full text of one recording file."""
    gen = RECORDINGS[name][0]
    rng = random.Random(f"stepwatch-{name}")
    lines = [json.dumps(header(name), separators=(",", ":"))]
    lines += [json.dumps(r, separators=(",", ":")) for r in with_energy(gen(rng))]
    return "\n".join(lines) + "\n"


#: The energy counter's value at the first sample (mJ since an imagined driver load, an hour of 700 W)
ENERGY_BASE_MJ = 2_520_000_000


def with_energy(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each device its ``energy_mj`` counter as the real backend records it: the integral of its
    power over the records' times (the power is the counter's mean over the interval before the
    sample, so E(t_k) = E(t_k-1) + P_k·(t_k - t_k-1)); a device with no power reading has no counter
    (its ``unsupported`` says why), a lost one none this tick."""
    energy: dict[int, float] = {}
    prev_t: float | None = None
    for rec in records:
        for d in rec["devices"]:
            i = d["index"]
            if d.get("power_limit_w") is None and d.get("power_w") is None:
                if d.get("error") is None:
                    d["unsupported"]["energy_mj"] = ("nvmlDeviceGetTotalEnergyConsumption: Not Supported "
                                                     "(NVMLError_NotSupported)")
                continue
            if i not in energy:
                energy[i] = ENERGY_BASE_MJ
            elif prev_t is not None and d.get("power_w") is not None:
                energy[i] += d["power_w"] * 1000.0 * (rec["t"] - prev_t)
            d["energy_mj"] = int(round(energy[i]))
        prev_t = rec["t"]
    return records


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "assets/gpu_recordings")
    out.mkdir(parents=True, exist_ok=True)
    for name in RECORDINGS:
        (out / name).write_text(render(name), encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
