"""The shape of one ``gpu.jsonl`` record and of one device inside it.

Standard library only. Every key is always present (ARCHITECTURE.md R8: present-and-null); a number
that could not be read is ``None`` and the reason sits in the device's ``unsupported`` map, keyed
by the field name. A reading is never replaced by 0.

Record (one line of ``<run_dir>/gpu.jsonl`` per sampler tick)::

    {"v": 1, "t": <unix s>, "devices": [<device>, ...], "gpu_error": null | str,
     "backend": "nvml" | "recorded:<file name>"}

``gpu_error`` is set when there is no NVML session at all ("NVML unavailable: <reason>", "NVML not
answering since <ISO time> (<call>)"); then ``devices`` is ``[]``.

Device (units in the names; the NVML call each comes from in brackets)::

    index              int    NVML device index                     [nvmlDeviceGetHandleByIndex]
    name               str    marketing name                        [nvmlDeviceGetName]
    uuid               str    "GPU-..."                             [nvmlDeviceGetUUID]
    util_pct           num    "kernel-active %": share of the last sample period in which ANY
                              kernel ran -- not SM activity          [nvmlDeviceGetUtilizationRates .gpu]
    mem_used_bytes     int    device memory in use                  [nvmlDeviceGetMemoryInfo .used]
    mem_total_bytes    int    device memory                          [nvmlDeviceGetMemoryInfo .total]
    power_w            num    board power, W                         [see power_source]
    power_source       str    "energy_counter": mean over exactly the interval since the previous
                              tick, from the delta of nvmlDeviceGetTotalEnergyConsumption (mJ);
                              "power_usage_avg": nvmlDeviceGetPowerUsage (mW), a ~1 s moving
                              average on recent GPUs; null when power_w is null
    power_limit_w      num    enforced power limit, W               [nvmlDeviceGetEnforcedPowerLimit, mW]
    energy_mj          int    the board's energy counter since the driver loaded, mJ (Volta and
                              later); its deltas between step ends give joules per step
                              [nvmlDeviceGetTotalEnergyConsumption]
    sm_clock_mhz       int    SM clock, MHz                          [nvmlDeviceGetClockInfo NVML_CLOCK_SM]
    mem_clock_mhz      int    memory clock, MHz                      [nvmlDeviceGetClockInfo NVML_CLOCK_MEM]
    temperature_c      int    GPU die temperature, degrees C         [nvmlDeviceGetTemperature]
    sm_active_pct      num    GPM: share of SMs busy, %              [nvmlGpmMetricsGet NVML_GPM_METRIC_SM_UTIL]
    sm_occupancy_pct   num    GPM: resident warps vs max, %          [..._SM_OCCUPANCY]
    tensor_active_pct  num    GPM: SM time on any tensor op, %       [..._ANY_TENSOR_UTIL]
    gpm_supported      bool   device answered nvmlGpmQueryDeviceSupport with yes; false when it
                              said no or raised; null before it was asked
    mig_enabled        bool   current MIG mode                       [nvmlDeviceGetMigMode]
    mig_instances      list   [{index, uuid, gpu_instance_id, compute_instance_id,
                               mem_used_bytes, mem_total_bytes}] when MIG is enabled, else []
    processes          list   [{pid, used_memory_bytes, kind, mig_uuid, in_run, rank}] or null when
                              the process list could not be read; ``rank`` is the run's rank of
                              that pid from the supervisor's procs.json (null: not a rank)
                              [nvmlDeviceGetComputeRunningProcesses / ...GraphicsRunningProcesses]
    used_by_run        bool   a process of the watched run's tree holds memory here; null when
                              unknown (no process list, no watched pid)
    run_ranks          list   the ranks (RANK) of the run's processes holding memory here, sorted;
                              null when unknown (as used_by_run)
    error              str    the device as a whole gave no reading this tick ("GPU is lost ...",
                              "NVML not answering since ..."); null when it answered
    not_answering_since str   ISO time of the call that missed its deadline, else null
    unsupported        dict   {field: reason} for every null field above that has a reason
"""

from __future__ import annotations

import math
from typing import Any

RECORD_VERSION = 1

#: Numeric fields of a device; each is a number or None (with a reason in ``unsupported``).
METRIC_KEYS = (
    "util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "energy_mj",
)

DEVICE_KEYS = (
    "index",
    "name",
    "uuid",
    *METRIC_KEYS,
    "power_source",
    "gpm_supported",
    "mig_enabled",
    "mig_instances",
    "processes",
    "used_by_run",
    "run_ranks",
    "error",
    "not_answering_since",
    "unsupported",
)

RECORD_KEYS = ("v", "t", "devices", "gpu_error", "backend")

#: Processes listed per device at most (the record stays small on a crowded shared GPU).
MAX_PROCESSES = 64


def empty_device(index: int | None) -> dict[str, Any]:
    """A device with every key present and nothing known."""
    d: dict[str, Any] = {k: None for k in DEVICE_KEYS}
    d["index"] = index
    d["mig_instances"] = []
    d["unsupported"] = {}
    return d


def normalise_device(d: dict[str, Any]) -> dict[str, Any]:
    """Return ``d`` with every device key present (missing keys become None / [] / {})."""
    out = empty_device(d.get("index"))
    for k in DEVICE_KEYS:
        if k in d:
            out[k] = d[k]
    if not isinstance(out["unsupported"], dict):
        out["unsupported"] = {}
    if not isinstance(out["mig_instances"], list):
        out["mig_instances"] = []
    for k in METRIC_KEYS:
        out[k] = finite_or_none(out[k])
    return out


def make_record(t: float, devices: list[dict[str, Any]], gpu_error: str | None, backend: str) -> dict[str, Any]:
    """One ``gpu.jsonl`` record with every key present."""
    return {
        "v": RECORD_VERSION,
        "t": t,
        "devices": [normalise_device(d) for d in devices],
        "gpu_error": gpu_error,
        "backend": backend,
    }


def finite_or_none(x: Any) -> Any:
    """NaN/inf (which JSON cannot carry) become None; other values pass unchanged."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def device_key(d: dict[str, Any]) -> str:
    """Stable identity of a device across records: its UUID, else ``index:<n>``."""
    uuid = d.get("uuid")
    return uuid if uuid else f"index:{d.get('index')}"
