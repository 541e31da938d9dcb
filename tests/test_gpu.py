"""GPU monitoring: the real NVML backend's error paths, the sampler, the reading, history.

The real backend is exercised by patching the real ``pynvml`` module's functions (``monkeypatch``) to
answer like a GPU would or to raise pynvml's own exception classes; the code under test is
``stepwatch.monitors.gpu.backend.NvmlBackend`` itself. No GPU is needed.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from stepwatch.monitors.gpu import backend as backend_mod
from stepwatch.monitors.gpu import reading
from stepwatch.monitors.gpu.backend import NvmlBackend
from stepwatch.monitors.gpu.history import GpuHistory
from stepwatch.monitors.gpu.reading import (
    IDLE,
    SM_BUSY_TENSOR_IDLE,
    STATUS_KEYS,
    assess_device,
    gpu_status_for_run_dir,
    gpu_status_from_records,
)
from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording, bundled_recordings, load_recording
from stepwatch.monitors.gpu.sampler import GpuSampler, run_sampler, start_sampler_thread
from stepwatch.monitors.gpu.schema import DEVICE_KEYS, RECORD_KEYS
from stepwatch.monitors.gpu import synthetic

from conftest import wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def wait_for(cond, timeout_s: float = 10.0, what: str = "condition"):
    return wait_until(cond, timeout_s, interval_s=0.01, what=what)


# ------------------------------------------------------------------------------------------------
# a fake GPU behind the real pynvml module's functions


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


class FakeMig:
    def __init__(self, parent: FakeGpu, i: int) -> None:
        self.parent, self.i = parent, i

    def call(self, name: str, *args: Any) -> Any:
        self.parent.calls[f"mig:{name}"] += 1
        if name == "nvmlDeviceGetUUID":
            return f"MIG-fake-{self.parent.index}-{self.i}"
        if name == "nvmlDeviceGetMemoryInfo":
            return SimpleNamespace(total=10 << 30, used=(1 + self.i) << 30, free=0)
        if name == "nvmlDeviceGetGpuInstanceId":
            return 10 + self.i
        if name == "nvmlDeviceGetComputeInstanceId":
            return 0
        if name == "nvmlDeviceGetComputeRunningProcesses":
            return [SimpleNamespace(pid=7000 + self.i, usedGpuMemory=1 << 30)]
        if name == "nvmlDeviceGetGraphicsRunningProcesses":
            return []
        raise pynvml.NVMLError_NotSupported()


class FakeGpu:
    """One GPU: counts calls, raises or blocks on request, otherwise answers plausible values."""

    def __init__(self, index: int, *, gpm: bool = True, energy: bool = True, mig: bool = False,
                 watts: float = 300.0) -> None:
        self.index = index
        self.calls: Counter[str] = Counter()
        self.raise_on: dict[str, BaseException] = {}
        self.block_on: dict[str, threading.Event] = {}
        self.gpm = gpm
        self.energy = energy
        self.mig = mig
        self.watts = watts
        self.util = 100
        self.pids: list[int] = [4242]
        self.gpm_gets: list[int] = []  # addresses of the sample buffers passed to nvmlGpmSampleGet
        self.metric_ret: dict[int, int] = {}
        self.t0 = time.monotonic()

    def call(self, name: str, *args: Any) -> Any:
        self.calls[name] += 1
        ev = self.block_on.get(name)
        if ev is not None:
            ev.wait(30)
        exc = self.raise_on.get(name)
        if exc is not None:
            raise exc
        if name == "nvmlDeviceGetName":
            return b"NVIDIA H100 80GB HBM3"
        if name == "nvmlDeviceGetUUID":
            return f"GPU-fake-{self.index}"
        if name == "nvmlDeviceGetMigMode":
            if not self.mig:
                raise pynvml.NVMLError_NotSupported()
            return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]
        if name == "nvmlDeviceGetUtilizationRates":
            return SimpleNamespace(gpu=self.util, memory=40)
        if name == "nvmlDeviceGetMemoryInfo":
            return SimpleNamespace(total=80 << 30, used=60 << 30, free=20 << 30)
        if name == "nvmlDeviceGetTotalEnergyConsumption":
            if not self.energy:
                raise pynvml.NVMLError_NotSupported()
            return int(5_000_000 + self.watts * (time.monotonic() - self.t0) * 1000)
        if name == "nvmlDeviceGetPowerUsage":
            return 285_000
        if name == "nvmlDeviceGetEnforcedPowerLimit":
            return 700_000
        if name == "nvmlDeviceGetClockInfo":
            return 1980 if args[0] == pynvml.NVML_CLOCK_SM else 2619
        if name == "nvmlDeviceGetTemperature":
            return 61
        if name == "nvmlDeviceGetComputeRunningProcesses":
            return [SimpleNamespace(pid=p, usedGpuMemory=50 << 30) for p in self.pids]
        if name == "nvmlDeviceGetGraphicsRunningProcesses":
            return []
        if name == "nvmlGpmQueryDeviceSupport":
            return SimpleNamespace(version=1, isSupportedDevice=1 if self.gpm else 0)
        if name == "nvmlGpmSampleGet":
            self.gpm_gets.append(ctypes.cast(args[0], ctypes.c_void_p).value)
            return args[0]
        if name == "nvmlDeviceGetMaxMigDeviceCount":
            return 7
        if name == "nvmlDeviceGetMigDeviceHandleByIndex":
            i = args[0]
            if i >= 2:
                raise pynvml.NVMLError_NotFound()
            return FakeMig(self, i)
        raise AssertionError(f"unexpected call {name}")


GPM_VALUES = {pynvml.NVML_GPM_METRIC_SM_UTIL: 95.0, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 50.0,
              pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 3.0}


class FakeNvml:
    """Patches the real pynvml module so that it drives ``gpus``."""

    HANDLE_FNS = ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMigMode", "nvmlDeviceGetUtilizationRates",
                  "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage",
                  "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
                  "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
                  "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlDeviceGetMaxMigDeviceCount",
                  "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
                  "nvmlDeviceGetComputeInstanceId")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.init_exc: BaseException | None = None
        self.init_block: threading.Event | None = None
        self.handle_exc: dict[int, BaseException] = {}
        self._buffers: list[Any] = []
        self.addr_owner: dict[int, FakeGpu] = {}
        self.metrics_requests: list[tuple[int, int, list[int]]] = []  # (sample1 addr, sample2 addr, ids)
        mp = monkeypatch

        def top(name, fn):
            def wrapper(*a):
                self.calls[name] += 1
                return fn(*a)
            mp.setattr(pynvml, name, wrapper)

        def init():
            if self.init_block is not None:
                self.init_block.wait(30)
            if self.init_exc is not None:
                raise self.init_exc

        def handle_by_index(i):
            exc = self.handle_exc.get(i)
            if exc is not None:
                raise exc
            return self.gpus[i]

        def sample_alloc():
            buf = ctypes.c_uint64(len(self._buffers))
            self._buffers.append(buf)
            return ctypes.cast(ctypes.pointer(buf), pynvml.c_nvmlGpmSample_t)

        def metrics_get(mg):
            s1 = ctypes.cast(mg.sample1, ctypes.c_void_p).value
            s2 = ctypes.cast(mg.sample2, ctypes.c_void_p).value
            ids = [mg.metrics[i].metricId for i in range(mg.numMetrics)]
            self.metrics_requests.append((s1, s2, ids))
            gpu = self.addr_owner.get(s2)
            for i in range(mg.numMetrics):
                mid = mg.metrics[i].metricId
                ret = gpu.metric_ret.get(mid, pynvml.NVML_SUCCESS) if gpu else pynvml.NVML_SUCCESS
                mg.metrics[i].nvmlReturn = ret
                mg.metrics[i].value = GPM_VALUES[mid] if ret == pynvml.NVML_SUCCESS else 0.0
            return mg

        top("nvmlInit", init)
        top("nvmlShutdown", lambda: None)
        top("nvmlDeviceGetCount", lambda: len(self.gpus))
        top("nvmlDeviceGetHandleByIndex", handle_by_index)
        top("nvmlGpmSampleAlloc", sample_alloc)
        top("nvmlGpmSampleFree", lambda s: None)
        top("nvmlGpmMetricsGet", metrics_get)
        for name in self.HANDLE_FNS:
            def make(name=name):
                def fn(h, *a):
                    if name == "nvmlGpmSampleGet":
                        self.addr_owner[ctypes.cast(a[0], ctypes.c_void_p).value] = h
                    return h.call(name, *a)
                return fn
            mp.setattr(pynvml, name, make())


@pytest.fixture
def release_all():
    """Events that tests block fake NVML calls on; all set at teardown so no thread stays stuck."""
    events: list[threading.Event] = []
    yield events
    for e in events:
        e.set()


def dev(snap: dict[str, Any], i: int) -> dict[str, Any]:
    return next(d for d in snap["devices"] if d["index"] == i)


# ------------------------------------------------------------------------------------------------
# no NVML on this machine / NVML unavailable


def _nvml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_nvml_loads(), reason="this machine has an NVML library")
def test_real_backend_without_nvml_says_unavailable():
    b = NvmlBackend()
    try:
        snap = b.sample()
    finally:
        b.close()
    assert snap["devices"] == []
    assert snap["gpu_error"].startswith("NVML unavailable: ")
    assert "NVML Shared Library Not Found" in snap["gpu_error"]
    assert "NVMLError_LibraryNotFound" in snap["gpu_error"]


@pytest.mark.parametrize("exc_name, words", [
    ("NVMLError_LibraryNotFound", "NVML Shared Library Not Found"),
    ("NVMLError_DriverNotLoaded", "Driver Not Loaded"),
    ("NVMLError_NoPermission", "Insufficient Permissions"),
])
def test_init_failure_is_nvml_unavailable_with_reason(monkeypatch, exc_name, words):
    fake = FakeNvml(monkeypatch, [FakeGpu(0)])
    fake.init_exc = getattr(pynvml, exc_name)()
    clock = FakeClock()
    b = NvmlBackend(mono=clock)
    snap = b.sample()
    assert snap == {"devices": [], "gpu_error": f"NVML unavailable: {words} ({exc_name})"}
    # retried later with back-off, not every tick
    b.sample()
    assert fake.calls["nvmlInit"] == 1
    clock.advance(backend_mod.INIT_RETRY_MIN_S + 0.1)
    fake.init_exc = None
    snap = b.sample()
    assert fake.calls["nvmlInit"] == 2
    assert snap["gpu_error"] is None and len(snap["devices"]) == 1
    b.close()


def test_version_mismatch_reinit_is_periodic(monkeypatch):
    fake = FakeNvml(monkeypatch, [FakeGpu(0)])
    clock = FakeClock()
    b = NvmlBackend(mono=clock)
    assert b.sample()["gpu_error"] is None
    # an unattended driver upgrade mid-run: every call now says RM/NVML version mismatch
    fake.gpus[0].raise_on["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_LibRmVersionMismatch()
    snap = b.sample()
    assert snap["devices"] == []
    assert snap["gpu_error"].startswith("NVML unavailable: driver/library version mismatch")
    assert "NVMLError_LibRmVersionMismatch" in snap["gpu_error"]
    fake.init_exc = pynvml.NVMLError_LibRmVersionMismatch()
    inits = fake.calls["nvmlInit"]
    for _ in range(3):
        clock.advance(backend_mod.MISMATCH_RETRY_S / 4)
        b.sample()
    assert fake.calls["nvmlInit"] == inits  # not before the period
    clock.advance(backend_mod.MISMATCH_RETRY_S / 4 + 0.1)
    assert "version mismatch" in b.sample()["gpu_error"]
    assert fake.calls["nvmlInit"] == inits + 1
    clock.advance(backend_mod.MISMATCH_RETRY_S + 0.1)
    fake.init_exc = None
    del fake.gpus[0].raise_on["nvmlDeviceGetUtilizationRates"]
    snap = b.sample()
    assert snap["gpu_error"] is None and dev(snap, 0)["util_pct"] == 100
    b.close()


# ------------------------------------------------------------------------------------------------
# per-metric support, power, GPM, MIG


def test_healthy_fake_gpu_reads_every_field(monkeypatch):
    FakeNvml(monkeypatch, [FakeGpu(0)])
    b = NvmlBackend()
    snap = b.sample()
    d = dev(snap, 0)
    assert set(d) == set(DEVICE_KEYS)
    assert d["name"] == "NVIDIA H100 80GB HBM3" and d["uuid"] == "GPU-fake-0"
    assert d["util_pct"] == 100 and d["mem_used_bytes"] == 60 << 30 and d["mem_total_bytes"] == 80 << 30
    assert d["power_limit_w"] == 700.0 and d["sm_clock_mhz"] == 1980 and d["mem_clock_mhz"] == 2619
    assert d["temperature_c"] == 61 and d["mig_enabled"] is False and d["gpm_supported"] is True
    assert d["processes"] == [{"pid": 4242, "used_memory_bytes": 50 << 30, "kind": "compute", "mig_uuid": None,
                               "in_run": None}]
    assert d["error"] is None and d["not_answering_since"] is None
    b.close()


def test_not_supported_disables_the_metric_once(monkeypatch):
    gpu = FakeGpu(0)
    gpu.raise_on["nvmlDeviceGetTemperature"] = pynvml.NVMLError_NotSupported()
    gpu.raise_on["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVMLError_NoPermission()
    gpu.raise_on["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVMLError_NoPermission()
    FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    for _ in range(5):
        d = dev(b.sample(), 0)
        assert d["temperature_c"] is None  # never 0
        assert d["unsupported"]["temperature_c"] == "nvmlDeviceGetTemperature: Not Supported (NVMLError_NotSupported)"
        assert d["processes"] is None
        assert "Insufficient Permissions" in d["unsupported"]["processes"]
        assert d["util_pct"] == 100  # the others keep updating
    assert gpu.calls["nvmlDeviceGetTemperature"] == 1
    assert gpu.calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    assert gpu.calls["nvmlDeviceGetUtilizationRates"] == 5
    b.close()


def test_transient_error_is_null_for_one_tick_only(monkeypatch):
    gpu = FakeGpu(0)
    gpu.raise_on["nvmlDeviceGetClockInfo"] = pynvml.NVMLError_Unknown()
    FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    d = dev(b.sample(), 0)
    assert d["sm_clock_mhz"] is None and "Unknown Error" in d["unsupported"]["sm_clock_mhz"]
    del gpu.raise_on["nvmlDeviceGetClockInfo"]
    d = dev(b.sample(), 0)
    assert d["sm_clock_mhz"] == 1980 and "sm_clock_mhz" not in d["unsupported"]
    b.close()


@pytest.mark.system
def test_power_from_energy_delta_over_the_interval(monkeypatch):
    gpu = FakeGpu(0, watts=450.0)
    FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    d = dev(b.sample(), 0)
    assert (d["power_w"], d["power_source"]) == (285.0, "power_usage_avg")  # first tick: no delta yet
    first_mj = d["energy_mj"]
    assert 5_000_000 <= first_mj < 5_000_000 + 450 * 1000 * 5  # the counter as NVML gave it, mJ
    time.sleep(0.2)
    d = dev(b.sample(), 0)
    assert d["power_source"] == "energy_counter"
    assert (d["energy_mj"] - first_mj) / 1000.0 == pytest.approx(450.0 * 0.2, rel=0.3)  # ~90 J in ~0.2 s
    assert d["power_w"] == pytest.approx(450.0, rel=0.05)
    assert gpu.calls["nvmlDeviceGetPowerUsage"] == 1
    b.close()


def test_power_without_energy_counter_and_without_any_power(monkeypatch):
    g0, g1 = FakeGpu(0, energy=False), FakeGpu(1, energy=False)
    g1.raise_on["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported()
    g1.raise_on["nvmlDeviceGetEnforcedPowerLimit"] = pynvml.NVMLError_NotSupported()
    FakeNvml(monkeypatch, [g0, g1])
    b = NvmlBackend()
    for _ in range(3):
        snap = b.sample()
    d0, d1 = dev(snap, 0), dev(snap, 1)
    assert (d0["power_w"], d0["power_source"]) == (285.0, "power_usage_avg")
    assert "power_w" not in d0["unsupported"]
    assert g0.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert d1["power_w"] is None and d1["power_source"] is None and d1["power_limit_w"] is None
    assert "nvmlDeviceGetTotalEnergyConsumption: Not Supported" in d1["unsupported"]["power_w"]
    assert "nvmlDeviceGetPowerUsage: Not Supported" in d1["unsupported"]["power_w"]
    for d in (d0, d1):  # no counter: no energy, with NVML's reason (never 0)
        assert d["energy_mj"] is None and "nvmlDeviceGetTotalEnergyConsumption: Not Supported" in d["unsupported"]["energy_mj"]
    assert g1.calls["nvmlDeviceGetPowerUsage"] == 1
    gpu, _ = gpu_status_from_records([{"v": 1, "t": 0.0, "devices": [d1], "gpu_error": None, "backend": "nvml"}])
    assert gpu[0]["power_share"] is None and "power_w is null" in gpu[0]["unsupported"]["power_share"]
    b.close()


def test_gpm_seeds_then_alternates_two_buffers(monkeypatch):
    gpu = FakeGpu(0)
    fake = FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    d = dev(b.sample(), 0)
    for k in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"):
        assert d[k] is None and d["unsupported"][k] == "GPM: first sample only seeds the interval"
    assert fake.metrics_requests == []
    d = dev(b.sample(), 0)
    assert (d["sm_active_pct"], d["sm_occupancy_pct"], d["tensor_active_pct"]) == (95.0, 50.0, 3.0)
    dev(b.sample(), 0)
    dev(b.sample(), 0)
    a, c = gpu.gpm_gets[0], gpu.gpm_gets[1]
    assert a != c
    assert gpu.gpm_gets == [a, c, a, c]  # two buffers, alternated each tick
    # each reading covers the interval since the previous tick: (previous, current)
    assert [(s1, s2) for s1, s2, _ in fake.metrics_requests] == [(a, c), (c, a), (a, c)]
    assert fake.calls["nvmlGpmSampleAlloc"] == 2
    b.close()


def test_gpm_checks_each_metrics_own_return(monkeypatch):
    gpu = FakeGpu(0)
    gpu.metric_ret[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake = FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    b.sample()
    d = dev(b.sample(), 0)
    assert d["sm_active_pct"] == 95.0 and d["sm_occupancy_pct"] == 50.0
    assert d["tensor_active_pct"] is None  # never the 0.0 left in the struct
    assert "Not Supported" in d["unsupported"]["tensor_active_pct"]
    d = dev(b.sample(), 0)
    assert d["tensor_active_pct"] is None and "Not Supported" in d["unsupported"]["tensor_active_pct"]
    # disabled once: not requested again
    assert pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL in fake.metrics_requests[0][2]
    assert pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL not in fake.metrics_requests[1][2]
    b.close()


@pytest.mark.parametrize("how", ["raises", "says no"])
def test_gpm_unavailable_when_query_raises_or_says_no(monkeypatch, how):
    gpu = FakeGpu(0, gpm=(how == "raises"))
    if how == "raises":
        gpu.raise_on["nvmlGpmQueryDeviceSupport"] = pynvml.NVMLError_ArgumentVersionMismatch()
    fake = FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    for _ in range(3):
        d = dev(b.sample(), 0)
    assert d["gpm_supported"] is False
    for k in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"):
        assert d[k] is None
        assert d["unsupported"][k].startswith("GPM unavailable: nvmlGpmQueryDeviceSupport")
    assert gpu.calls["nvmlGpmQueryDeviceSupport"] == 1
    assert gpu.calls["nvmlGpmSampleGet"] == 0 and fake.calls["nvmlGpmMetricsGet"] == 0
    assert d["util_pct"] == 100
    b.close()


def test_mig_lists_instances_and_utilisation_is_unsupported(monkeypatch):
    gpu = FakeGpu(0, mig=True)
    FakeNvml(monkeypatch, [gpu])
    b = NvmlBackend()
    d = dev(b.sample(), 0)
    assert d["mig_enabled"] is True
    assert d["util_pct"] is None and d["unsupported"]["util_pct"].startswith("MIG enabled")
    assert gpu.calls["nvmlDeviceGetUtilizationRates"] == 0
    assert d["tensor_active_pct"] is None and "MIG enabled" in d["unsupported"]["tensor_active_pct"]
    assert [(i["uuid"], i["gpu_instance_id"], i["mem_used_bytes"], i["mem_total_bytes"]) for i in d["mig_instances"]] == [
        ("MIG-fake-0-0", 10, 1 << 30, 10 << 30), ("MIG-fake-0-1", 11, 2 << 30, 10 << 30)]
    assert sorted(p["pid"] for p in d["processes"]) == [7000, 7001]
    assert d["power_limit_w"] == 700.0
    b.close()


# ------------------------------------------------------------------------------------------------
# lost GPUs, hanging calls


def test_gpu_lost_is_reported_and_retried_with_backoff(monkeypatch):
    g0, g1 = FakeGpu(0), FakeGpu(1)
    g1.raise_on["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_GpuIsLost()
    FakeNvml(monkeypatch, [g0, g1])
    clock = FakeClock()
    b = NvmlBackend(mono=clock)
    snap = b.sample()
    assert snap["gpu_error"] is None
    assert dev(snap, 0)["util_pct"] == 100 and dev(snap, 0)["error"] is None
    d1 = dev(snap, 1)
    assert d1["error"].startswith("GPU is lost: nvmlDeviceGetUtilizationRates: GPU is lost (NVMLError_GpuIsLost)")
    assert d1["util_pct"] is None and d1["name"] == "NVIDIA H100 80GB HBM3"
    tries = g1.calls["nvmlDeviceGetUtilizationRates"]
    assert tries == 1
    b.sample()
    clock.advance(1.0)
    b.sample()
    assert g1.calls["nvmlDeviceGetUtilizationRates"] == 1  # inside the 2 s back-off: not touched
    assert g0.calls["nvmlDeviceGetUtilizationRates"] == 3
    clock.advance(1.1)
    b.sample()
    assert g1.calls["nvmlDeviceGetUtilizationRates"] == 2  # retried
    clock.advance(2.1)
    b.sample()
    assert g1.calls["nvmlDeviceGetUtilizationRates"] == 2  # the back-off doubled to 4 s
    clock.advance(2.0)
    del g1.raise_on["nvmlDeviceGetUtilizationRates"]
    snap = b.sample()
    assert dev(snap, 1)["error"] is None and dev(snap, 1)["util_pct"] == 100
    b.close()


def test_hanging_call_marks_only_that_device_and_threads_do_not_pile_up(monkeypatch, release_all):
    g0, g1 = FakeGpu(0), FakeGpu(1)
    hang = threading.Event()
    release_all.append(hang)
    FakeNvml(monkeypatch, [g0, g1])
    b = NvmlBackend(call_timeout_s=0.2)
    b.sample()  # both healthy
    g1.block_on["nvmlDeviceGetMemoryInfo"] = hang
    calls_before = g1.calls["nvmlDeviceGetMemoryInfo"]
    threads_before = threading.active_count()
    t = time.monotonic()
    snap = b.sample()
    assert time.monotonic() - t < 1.5
    d1 = dev(snap, 1)
    assert d1["error"].startswith("NVML not answering since ") and d1["error"].endswith("(nvmlDeviceGetMemoryInfo)")
    assert d1["not_answering_since"] is not None and d1["util_pct"] is None
    assert dev(snap, 0)["util_pct"] == 100 and dev(snap, 0)["error"] is None
    for u in (10, 20, 30, 40, 50):
        g0.util = u
        t = time.monotonic()
        snap = b.sample()
        assert time.monotonic() - t < 0.15  # the stuck device is not waited for again
        assert dev(snap, 0)["util_pct"] == u  # the other device keeps updating
        assert dev(snap, 1)["error"] == d1["error"]
    assert g1.calls["nvmlDeviceGetMemoryInfo"] == calls_before + 1  # nothing queued behind the stuck call
    assert len(b.worker_threads()) <= 3  # one per device + one for the session, stuck or not
    assert threading.active_count() <= threads_before
    hang.set()
    del g1.block_on["nvmlDeviceGetMemoryInfo"]
    snap = wait_for(lambda: (s := b.sample()) and dev(s, 1)["error"] is None and s, what="device 1 answering")
    assert dev(snap, 1)["util_pct"] == 100 and dev(snap, 1)["not_answering_since"] is None
    b.close()


def test_stuck_device_survives_session_reinit_without_a_second_thread(monkeypatch, release_all):
    g0, g1 = FakeGpu(0), FakeGpu(1)
    hang = threading.Event()
    release_all.append(hang)
    fake = FakeNvml(monkeypatch, [g0, g1])
    clock = FakeClock()
    b = NvmlBackend(call_timeout_s=0.2, mono=clock)
    b.sample()
    g1.block_on["nvmlDeviceGetUtilizationRates"] = hang
    assert dev(b.sample(), 1)["error"].startswith("NVML not answering since ")
    for _ in range(3):  # the session is lost and re-initialised while GPU 1's call is still stuck
        g0.raise_on["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_LibRmVersionMismatch()
        assert "version mismatch" in b.sample()["gpu_error"]
        del g0.raise_on["nvmlDeviceGetUtilizationRates"]
        clock.advance(backend_mod.MISMATCH_RETRY_S + 1)
        snap = b.sample()
        assert dev(snap, 0)["util_pct"] == 100
        assert dev(snap, 1)["error"].startswith("NVML not answering since ")
    assert fake.calls["nvmlInit"] == 4
    assert len(b.worker_threads()) == 3  # session + GPU 0 + the one stuck GPU 1 worker
    assert g1.calls["nvmlDeviceGetUtilizationRates"] == 2
    hang.set()
    b.close()


def test_hanging_init_is_not_answering_and_not_retried_while_stuck(monkeypatch, release_all):
    fake = FakeNvml(monkeypatch, [FakeGpu(0)])
    fake.init_block = threading.Event()
    release_all.append(fake.init_block)
    b = NvmlBackend(init_timeout_s=0.2)
    snap = b.sample()
    assert snap["devices"] == [] and snap["gpu_error"].startswith("NVML not answering since ")
    assert "(nvmlInit)" in snap["gpu_error"]
    for _ in range(3):
        assert b.sample()["gpu_error"] == snap["gpu_error"]
    assert fake.calls["nvmlInit"] == 1
    assert len(b.worker_threads()) == 1
    fake.init_block.set()
    snap = wait_for(lambda: (s := b.sample()) and s["gpu_error"] is None and s, what="init to finish")
    assert dev(snap, 0)["util_pct"] == 100
    b.close()


def test_sample_never_raises_on_a_bug(monkeypatch):
    FakeNvml(monkeypatch, [FakeGpu(0)])
    b = NvmlBackend()
    monkeypatch.setattr(b, "_sample", lambda: 1 / 0)
    snap = b.sample()
    assert snap["devices"] == [] and snap["gpu_error"].startswith("GPU sampler error: ZeroDivisionError")


# ------------------------------------------------------------------------------------------------
# the sampler


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sampler_writes_one_complete_record_per_tick(tmp_path):
    rec = bundled_recording("synthetic_h100_sm_busy_tensor_idle.jsonl")
    run_sampler(tmp_path, None, threading.Event(), 0.01, RecordedBackend(rec), max_ticks=5)
    recs = _records(tmp_path / "gpu.jsonl")
    assert len(recs) == 5
    for r in recs:
        assert list(r) == list(RECORD_KEYS)
        assert r["v"] == 1 and r["backend"] == "recorded:synthetic_h100_sm_busy_tensor_idle.jsonl"
        for d in r["devices"]:
            assert list(d) == list(DEVICE_KEYS)
    assert recs[0]["t"] < recs[-1]["t"]


def test_sampler_failures_never_raise(tmp_path, capsys):
    class Broken:
        label = "broken"

        def sample(self):
            raise RuntimeError("driver exploded")

        def close(self):
            raise RuntimeError("and again")

    s = GpuSampler(tmp_path, None, backend=Broken())
    r = s.tick()
    assert r["devices"] == [] and r["gpu_error"] == "GPU sampler error: RuntimeError: driver exploded"
    assert _records(tmp_path / "gpu.jsonl")[0]["gpu_error"] == r["gpu_error"]
    # an unwritable destination: counted, said once, never raised
    s2 = GpuSampler(tmp_path / "gone" / "deeper", None, backend=Broken(), interval_s=0.01)
    s2.run(threading.Event(), max_ticks=3)
    assert s2.dropped == 3
    assert capsys.readouterr().err.count("cannot write") == 1


def test_sampler_thread_starts_and_stops(tmp_path):
    h = start_sampler_thread(tmp_path, None, 0.02, RecordedBackend(bundled_recording("synthetic_h100_idle.jsonl")))
    wait_for(lambda: (tmp_path / "gpu.jsonl").exists() and len(_records(tmp_path / "gpu.jsonl")) >= 3,
             what="three records")
    assert h.stop(5.0)


def test_recording_chosen_by_environment_is_labelled(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWATCH_GPU_RECORDING", "synthetic_h100_idle.jsonl")
    r = GpuSampler(tmp_path, None).tick()
    assert r["backend"] == "recorded:synthetic_h100_idle.jsonl" and r["devices"][0]["name"]
    monkeypatch.delenv("STEPWATCH_GPU_RECORDING")
    s = GpuSampler(tmp_path, None)
    assert s.backend.label == "nvml"
    s.backend.close()


@pytest.mark.system
def test_used_by_run_marks_devices_holding_the_run_tree(monkeypatch, tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        g0, g1 = FakeGpu(0), FakeGpu(1)
        g0.pids = [child.pid]  # a child of the watched process (this test process)
        g1.pids = [1]  # someone else's
        FakeNvml(monkeypatch, [g0, g1])
        s = GpuSampler(tmp_path, os.getpid(), backend=NvmlBackend())
        r = s.tick()
        d0, d1 = r["devices"]
        assert d0["used_by_run"] is True and d0["processes"][0]["in_run"] is True
        assert d1["used_by_run"] is False and d1["processes"][0]["in_run"] is False
        s.backend.close()
    finally:
        child.kill()
        child.wait()


RANKS_PARENT = """
import os, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(60)
"""


MINI_SUPERVISOR = f"""
import subprocess, sys, time
from pathlib import Path
from stepwatch.monitors.proctree import TreeRecorder
from stepwatch.monitors.watchdog import ProcessRef
parent = subprocess.Popen([sys.executable, "-c", {RANKS_PARENT!r}], stdout=subprocess.PIPE, text=True)
ranks = parent.stdout.readline().split()
TreeRecorder(Path(sys.argv[1]), ProcessRef(parent.pid, None)).sample()
print(parent.pid, *ranks, flush=True)
time.sleep(60)
"""


@pytest.mark.system
def test_the_gpu_rows_name_the_rank_holding_each_device_from_the_recorded_tree(monkeypatch, tmp_path):
    from stepwatch.tui.plain import status_lines
    from stepwatch.tui.widgets.gpu import device_line

    # A supervisor of its own (a session leader, as launch starts it) records the run's tree; the
    # stranger beside rank 0 is this test's process, which is no part of that tree.
    sup = subprocess.Popen([sys.executable, "-c", MINI_SUPERVISOR, str(tmp_path)], stdout=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        parent_pid, rank0, rank1 = map(int, sup.stdout.readline().split())
        stranger = os.getpid()
        g0, g1, g2 = FakeGpu(0), FakeGpu(1), FakeGpu(2)
        g0.pids, g1.pids, g2.pids = [rank1], [rank0, stranger], [stranger]
        FakeNvml(monkeypatch, [g0, g1, g2])
        s = GpuSampler(tmp_path, parent_pid, backend=NvmlBackend())
        r = s.tick()
        s.backend.close()
    finally:
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
    d0, d1, d2 = r["devices"]
    assert (d0["used_by_run"], d0["run_ranks"], d0["processes"][0]["rank"]) == (True, [1], 1)
    assert (d1["used_by_run"], d1["run_ranks"]) == (True, [0])
    assert [(p["in_run"], p["rank"]) for p in d1["processes"]] == [(True, 0), (False, None)]
    assert (d2["used_by_run"], d2["run_ranks"]) == (False, [])  # control: only a stranger there
    gpu, _ = gpu_status_from_records([r])
    assert [g["run_ranks"] for g in gpu] == [[1], [0], []]
    assert "[run: rank 1]" in device_line(gpu[0]).plain and "[run" not in device_line(gpu[2]).plain
    lines = "\n".join(status_lines({**_snap_for_lines(), "gpu": gpu}))
    assert "GPU0 NVIDIA H100 80GB HBM3 (the run's rank 1):" in lines and "GPU2 NVIDIA H100 80GB HBM3:" in lines, lines


def _snap_for_lines() -> dict[str, Any]:
    from stepwatch.monitors.snapshot.model import null_snapshot

    return null_snapshot()


@pytest.mark.system
def test_sidecar_exits_when_the_watched_pid_ends(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    rec = bundled_recording("synthetic_h100_healthy_compute_bound.jsonl")
    p = subprocess.run([sys.executable, "-m", "stepwatch.monitors.gpu.sampler", str(tmp_path), "--pid", str(victim.pid),
                        "--interval", "0.05", "--recording", str(rec)], cwd=REPO, capture_output=True, text=True,
                       timeout=20)
    victim.wait()
    assert p.returncode == 0 and p.stderr == ""
    recs = _records(tmp_path / "gpu.jsonl")
    assert len(recs) >= 3 and all(r["backend"] == f"recorded:{rec.name}" for r in recs)


@pytest.mark.system
@pytest.mark.skipif(_nvml_loads(), reason="this machine has an NVML library")
def test_sidecar_on_this_machine_records_nvml_unavailable_without_traceback(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    p = subprocess.run([sys.executable, "-m", "stepwatch.monitors.gpu.sampler", str(tmp_path), "--pid", str(victim.pid),
                        "--interval", "0.05"], cwd=REPO, capture_output=True, text=True, timeout=20)
    victim.wait()
    assert p.returncode == 0 and "Traceback" not in p.stderr and p.stderr == ""
    recs = _records(tmp_path / "gpu.jsonl")
    assert recs and all(r["gpu_error"].startswith("NVML unavailable: ") and r["devices"] == [] for r in recs)
    gpu, err = gpu_status_for_run_dir(tmp_path)
    assert gpu is None and err.startswith("NVML unavailable: NVML Shared Library Not Found")


# ------------------------------------------------------------------------------------------------
# the reading


def _expected(path: Path) -> dict[int, str]:
    headers, _ = load_recording(path)
    return {int(k): v for k, v in headers[0]["expected_verdicts"].items()}


@pytest.mark.parametrize("path", bundled_recordings(), ids=lambda p: p.name)
def test_each_recording_yields_its_verdict(path):
    _, samples = load_recording(path)
    gpu, err = gpu_status_from_records(samples)
    assert err is None
    got = {row["index"]: row["verdict"] for row in gpu}
    for index, code in _expected(path).items():
        assert got[index] is not None and got[index].startswith(code + ":"), (index, got[index])
    for row in gpu:
        assert list(row) == list(STATUS_KEYS)
        for k in reading._STATUS_METRICS:
            assert (row[k] is None) == (k in row["unsupported"]), k


@pytest.mark.parametrize("path", bundled_recordings(), ids=lambda p: p.name)
def test_recording_replayed_through_the_sampler_reads_the_same(tmp_path, path):
    t = iter(range(10_000))
    backend = RecordedBackend(path, loop=False)
    s = GpuSampler(tmp_path, None, backend=backend, clock=lambda: 1_800_000_000.0 + next(t))
    for _ in range(len(backend)):
        s.tick()
    gpu, err = gpu_status_for_run_dir(tmp_path)
    assert err is None
    for index, code in _expected(path).items():
        assert next(r for r in gpu if r["index"] == index)["verdict"].startswith(code + ":")


def test_a_gpu_jsonl_line_nested_too_deep_is_skipped_not_a_crash(tmp_path):
    """gpu_status_for_run_dir "never raises for an unreadable file": a line nested 100,000 deep
    (json's RecursionError) is skipped like a line caught mid-write; the records around it count."""
    path = bundled_recording("synthetic_h100_healthy_compute_bound.jsonl")
    good = [ln for ln in path.read_text().splitlines() if ln.strip()]
    (tmp_path / "gpu.jsonl").write_text("\n".join([*good[:-1], "[" * 100_000 + "]" * 100_000, good[-1]]) + "\n")
    gpu, err = gpu_status_for_run_dir(tmp_path)
    assert gpu and err is None


def _verdicts_over_time(path: Path) -> list[str | None]:
    _, samples = load_recording(path)
    out = []
    for n in range(1, len(samples) + 1):
        gpu, _ = gpu_status_from_records(samples[:n])
        out.append(gpu[0]["verdict"])
    return out


def test_healthy_run_never_reads_tensor_idle():
    verdicts = _verdicts_over_time(bundled_recording("synthetic_h100_healthy_compute_bound.jsonl"))
    assert not any(v and v.startswith(SM_BUSY_TENSOR_IDLE) for v in verdicts)
    assert verdicts[-1].startswith("busy:")


def test_idle_gpu_never_reads_sm_busy():
    verdicts = _verdicts_over_time(bundled_recording("synthetic_h100_idle.jsonl"))
    assert all(v is None or v.startswith(IDLE + ":") for v in verdicts)
    assert verdicts[-1].startswith(IDLE + ":")


def test_sm_busy_never_from_few_samples():
    verdicts = _verdicts_over_time(bundled_recording("synthetic_h100_sm_busy_tensor_idle.jsonl"))
    assert verdicts[: reading.MIN_SAMPLES - 1] == [None] * (reading.MIN_SAMPLES - 1)
    assert verdicts[-1].startswith(SM_BUSY_TENSOR_IDLE + ":")
    assert "287 W = 41% of 700 W limit" in verdicts[-1] and "tensor-core active median 2.6%" in verdicts[-1]


def test_sm_busy_needs_both_enough_samples_and_enough_time():
    _, busy = load_recording(bundled_recording("synthetic_h100_sm_busy_tensor_idle.jsonl"))
    devs = [r["devices"][0] for r in busy[-30:]]
    sparse = [(1000.0 + 3 * i, d) for i, d in enumerate(devs[: reading.MIN_SAMPLES - 1])]  # 24 s, 9 samples
    assert assess_device(sparse) is None
    dense = [(1000.0 + 0.1 * i, d) for i, d in enumerate(devs)]  # 30 samples within 3 s
    assert assess_device(dense) is None
    enough = [(1000.0 + i, d) for i, d in enumerate(devs)]
    assert assess_device(enough).code == SM_BUSY_TENSOR_IDLE


def test_one_busy_sample_after_idle_is_not_sm_busy():
    _, idle = load_recording(bundled_recording("synthetic_h100_idle.jsonl"))
    _, busy = load_recording(bundled_recording("synthetic_h100_sm_busy_tensor_idle.jsonl"))
    spike = dict(busy[20], t=idle[-1]["t"] + 1)
    gpu, _ = gpu_status_from_records(idle + [spike])
    assert not gpu[0]["verdict"].startswith(SM_BUSY_TENSOR_IDLE)


def test_gpm_decides_over_power_when_it_has_samples():
    """Low power but busy tensor cores (GPM) is not tensor-idle; SMs mostly idle is not SM-busy."""
    _, samples = load_recording(bundled_recording("synthetic_h100_sm_busy_tensor_idle.jsonl"))
    window = [(r["t"], dict(r["devices"][0], tensor_active_pct=60.0)) for r in samples[-30:]]
    assert assess_device(window).code == "busy"
    window = [(r["t"], dict(r["devices"][0], sm_active_pct=20.0)) for r in samples[-30:]]
    assert assess_device(window).code == "kernel-busy, SMs underused"


def test_status_is_null_with_error_when_nvml_unavailable():
    rec = {"v": 1, "t": 1.0, "devices": [], "gpu_error": "NVML unavailable: Driver Not Loaded (NVMLError_DriverNotLoaded)",
           "backend": "nvml"}
    assert gpu_status_from_records([rec]) == (None, rec["gpu_error"])
    assert gpu_status_from_records([dict(rec, gpu_error=None)]) == ([], None)
    gpu, err = gpu_status_from_records([])
    assert gpu is None and "no GPU samples" in err


def test_status_for_missing_run_dir_file(tmp_path):
    gpu, err = gpu_status_for_run_dir(tmp_path)
    assert gpu is None and "gpu.jsonl missing" in err


# ------------------------------------------------------------------------------------------------
# history, recordings, hygiene


def _rec(t: float, util: float = 100.0) -> dict[str, Any]:
    return {"v": 1, "t": t, "gpu_error": None, "backend": "nvml",
            "devices": [{"index": 0, "uuid": "GPU-x", "name": "X", "util_pct": util, "power_w": 300.0,
                         "power_limit_w": 700.0}]}


def test_history_last_hour_fine_whole_run_per_minute_bounded():
    h = GpuHistory()
    t0 = 1_780_000_020.0
    for i in range(7 * 3600):
        h.add_record(_rec(t0 + i, util=100.0 if (i // 60) % 2 else 0.0))
    fine = h.fine("GPU-x")
    assert len(fine) == 3601 and fine[-1].t - fine[0].t == 3600
    coarse = h.coarse("GPU-x")
    assert len(coarse) == 7 * 60 and {b.step_s for b in coarse} == {60.0}
    full = [b for b in coarse if b.n == 60]
    assert full and all(b.min("util_pct") == b.max("util_pct") for b in full)
    assert fine[-1].power_share == pytest.approx(300 / 700)


def test_history_coarse_stays_bounded_for_any_length():
    h = GpuHistory(coarse_step_s=1.0, coarse_max_points=50, fine_max_points=100)
    for i in range(1000):
        h.add_record(_rec(float(i), util=float(i % 100)))
    assert len(h.coarse("GPU-x")) <= 50 and len(h.fine("GPU-x")) <= 100
    assert sum(b.n for b in h.coarse("GPU-x")) == 1000  # merged, not dropped
    assert h.coarse_step_s > 1.0


def test_history_recent_is_the_snapshots_gpu_history_last_n_oldest_first():
    """What the GPU panel's sparklines draw: per device index, the last n samples."""
    h = GpuHistory()
    for i in range(10):
        h.add_record(_rec(float(i), util=float(i)))
    recent = h.recent(3)
    assert list(recent) == ["0"]
    assert recent["0"]["util_pct"] == [7.0, 8.0, 9.0]
    assert len(recent["0"]["power_share"]) == 3
    assert h.recent(100)["0"]["util_pct"] == [float(i) for i in range(10)]


def test_bundled_recordings_are_synthetic_and_match_their_generator():
    names = {p.name for p in bundled_recordings()}
    assert names == set(synthetic.RECORDINGS)
    for name in names:
        path = bundled_recording(name)
        assert "synthetic" in name
        headers, samples = load_recording(path)
        assert headers[0]["recording"] == "synthetic" and "SYNTHETIC" in headers[0]["warning"]
        assert RecordedBackend(path).synthetic
        assert path.read_text() == synthetic.render(name), "regenerate: python -m stepwatch.monitors.gpu.synthetic"


def test_recorded_backend_labels_and_ends(tmp_path):
    b = RecordedBackend(bundled_recording("synthetic_h100_idle.jsonl"), loop=False)
    assert b.label == "recorded:synthetic_h100_idle.jsonl"
    for _ in range(len(b)):
        assert b.sample()["devices"]
    assert b.sample()["gpu_error"].startswith("recording synthetic_h100_idle.jsonl ended")
    missing = RecordedBackend(tmp_path / "nope.jsonl")
    assert missing.sample()["gpu_error"].startswith("recording unavailable: nope.jsonl")


@pytest.mark.system
def test_views_import_no_ui_and_no_nvml():
    code = ("import sys, stepwatch.monitors.gpu, stepwatch.monitors.gpu.reading, stepwatch.monitors.gpu.history, stepwatch.monitors.gpu.sampler;"
            "bad=[m for m in ('textual','launcher','tui','pynvml') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "[]", out.stderr
