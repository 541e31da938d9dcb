"""The real GPU backend: NVML through ``nvidia-ml-py`` (module ``pynvml``).

One object, :class:`NvmlBackend`, with the interface every backend has (see ``recorded.py``)::

    backend.label              "nvml"
    backend.sample() -> dict   {"devices": [<device>, ...], "gpu_error": None | str}
    backend.close()

``sample()`` never raises and never blocks for long. The device dicts follow ``schema.py``.

How it stays honest and alive (nvitop's lesson, XuehaiPan/nvitop ``api/libnvml.py``: one funnel for every call):

* **One function per NVML call site** -- :meth:`NvmlBackend._nv` -- turns NVML's answers into values
  or reasons. ``NVMLError_NotSupported``, ``NVMLError_NoPermission``, ``NVMLError_FunctionNotFound``
  and ``NVMLError_ArgumentVersionMismatch`` disable that one call for that one device, once: the
  field reads ``None`` with the reason in ``unsupported`` and the call is never made again. Other
  NVML errors leave that field ``None`` for this tick only (with the reason). ``NVMLError_GpuIsLost``
  (and ResetRequired, GpuNotFound) marks the device lost; it is retried with back-off
  (2 s, 4 s, ... 60 s). ``NVMLError_LibRmVersionMismatch``, ``Uninitialized``, ``DriverNotLoaded``
  mid-run end the session: ``gpu_error`` says "NVML unavailable: ..." and a re-init is tried every
  60 s (mismatch) or with back-off (5 s ... 300 s).
* **Deadlines off the caller's thread.** Every NVML call runs on a worker thread: one per device,
  one for session calls (``nvmlInit``, ``nvmlDeviceGetCount``, ``nvmlShutdown``). The caller waits
  at most ``call_timeout_s`` for any single call. A call that misses its deadline marks its device
  "NVML not answering since <time of the call> (<call>)"; the other devices keep updating. A worker
  whose call is stuck gets no new work until that call returns, so stuck calls never pile up
  threads: at most one thread per device plus one.
* **Slow fields are cached**: power limit 10 s, temperature 5 s, MIG mode and instance list 30 s;
  name and UUID once.
* **Power**: mean W over exactly the interval between two ticks from the delta of
  ``nvmlDeviceGetTotalEnergyConsumption`` (mJ); where that counter is unsupported, on the first
  tick, after a counter reset or a gap over 30 s, ``nvmlDeviceGetPowerUsage`` (mW, a ~1 s moving
  average). ``power_source`` says which.
* **GPM** (Hopper and later): ``nvmlGpmQueryDeviceSupport`` once per device (an exception there,
  e.g. an argument-version mismatch, is "GPM unavailable" too); two ``nvmlGpmSampleAlloc`` buffers
  alternated each tick by ``nvmlGpmSampleGet``; ``nvmlGpmMetricsGet`` between the previous and the
  current buffer, each metric's own ``nvmlReturn`` checked. The first sample only seeds.
* **MIG**: with MIG enabled, whole-GPU utilisation and GPM are unsupported (with that reason); the
  instances and their memory are listed (``nvmlDeviceGetMigDeviceHandleByIndex``).

All pynvml functions are looked up on the module at call time (``getattr(pynvml, name)``), so tests
patch the real module and exercise this very code.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.gpu.schema import MAX_PROCESSES, empty_device
from stepwatch.monitors.runfiles import utc_iso

try:  # nvidia-ml-py is a base dependency, but a broken install must not take the sampler down
    import pynvml as _pynvml

    _IMPORT_ERROR: str | None = None
except Exception as _e:  # pragma: no cover - depends on the environment
    _pynvml = None
    _IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

LABEL = "nvml"

CALL_TIMEOUT_S = 2.0  #: deadline for one NVML call on a device, seconds
INIT_TIMEOUT_S = 10.0  #: deadline for nvmlInit (can take seconds without persistence mode)
INIT_RETRY_MIN_S = 5.0  #: first re-init delay after NVML was unavailable
INIT_RETRY_MAX_S = 300.0
MISMATCH_RETRY_S = 60.0  #: fixed re-init period after a driver/library version mismatch
LOST_RETRY_MIN_S = 2.0  #: first retry delay for a lost device; doubles up to LOST_RETRY_MAX_S
LOST_RETRY_MAX_S = 60.0
POWER_LIMIT_TTL_S = 10.0
TEMPERATURE_TTL_S = 5.0
MIG_TTL_S = 30.0
ENERGY_MAX_GAP_S = 30.0  #: an energy delta over a longer gap (a stuck or lost spell) is not used

_GPM_FIELDS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
)


class _DeviceLost(Exception):
    """Raised inside a device job: the device as a whole gave no reading (lost, no handle)."""


class _SessionLost(Exception):
    """Raised inside a job: the NVML session itself is gone (version mismatch, driver unloaded)."""

    def __init__(self, text: str, mismatch: bool) -> None:
        super().__init__(text)
        self.mismatch = mismatch


def _exc_classes(*names: str) -> tuple[type[BaseException], ...]:
    if _pynvml is None:
        return ()
    return tuple(c for c in (getattr(_pynvml, n, None) for n in names) if isinstance(c, type))


_UNSUPPORTED = _exc_classes(
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
    "NVMLError_ArgumentVersionMismatch",
    "NVMLLibraryMismatchError",
)
_DEVICE_GONE = _exc_classes("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_GpuNotFound")
_MISMATCH = _exc_classes("NVMLError_LibRmVersionMismatch")
_SESSION_GONE = _MISMATCH + _exc_classes(
    "NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibraryNotFound"
)
_NVML_ERROR = _exc_classes("NVMLError")
_NOT_FOUND = _exc_classes("NVMLError_NotFound")


def err_text(e: BaseException) -> str:
    """A short text for an exception: NVML's own wording and pynvml's class name.

    Never calls into NVML for codes pynvml knows (``NVMLError.__str__`` may call nvmlErrorString).
    """
    if _NVML_ERROR and isinstance(e, _NVML_ERROR):
        value = getattr(e, "value", None)
        text = _pynvml.NVMLError._errcode_to_string.get(value)  # type: ignore[union-attr]
        if text is None:
            try:
                text = str(e)
            except Exception:
                text = f"NVML error {value}"
        return f"{text} ({type(e).__name__})"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# --------------------------------------------------------------------------------------------
# worker threads with per-call deadlines


class _Job:
    """One unit of work for a worker; tracks which NVML call it is in and since when."""

    __slots__ = ("fn", "done", "result", "exc", "call_name", "call_started", "call_started_wall", "abandoned")

    def __init__(self, fn: Callable[[_Job], Any], label: str, wall: float) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.exc: BaseException | None = None
        self.call_name = label
        self.call_started = time.monotonic()  # deadlines always use the real monotonic clock
        self.call_started_wall = wall
        self.abandoned = False


class _Worker:
    """A daemon thread running jobs one at a time. Refuses a new job while one is running."""

    def __init__(self, name: str, cond: threading.Condition) -> None:
        self.name = name
        self._cond = cond
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.job: _Job | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None and not self.job.done.is_set()

    def submit(self, job: _Job) -> None:
        if self.busy:
            raise RuntimeError(f"worker {self.name} is busy")
        self.job = job
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        self._q.put(job)

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread = None

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                job.result = job.fn(job)
            except BaseException as e:  # noqa: BLE001 - everything goes back to the waiter
                job.exc = e
            finally:
                with self._cond:
                    job.done.set()
                    self._cond.notify_all()


# --------------------------------------------------------------------------------------------
# per-device state


class _Dev:
    def __init__(self, index: int, worker: _Worker) -> None:
        self.index = index
        self.worker = worker  # kept across re-inits: a stuck worker is never duplicated
        self.handle: Any = None
        self.name: str | None = None
        self.uuid: str | None = None
        # call key -> (reason, value to return instead); a disabled call is never made again
        self.disabled: dict[str, tuple[str, Any]] = {}
        self.cache: dict[str, tuple[Any, float]] = {}
        self.energy_prev: tuple[int, float] | None = None  # (mJ, monotonic s)
        self.gpm_state = "unknown"  # "unknown" | "supported" | "unavailable"
        self.gpm_reason: str | None = None
        self.gpm_bufs: list[Any] = []
        self.gpm_cur = 0
        self.gpm_seeded = False
        self.lost_reason: str | None = None
        self.lost_since: float | None = None  # wall
        self.lost_failures = 0
        self.retry_at: float | None = None  # backend mono clock
        self.stuck_since: float | None = None  # wall
        self.stuck_call: str | None = None

    def placeholder(self, error: str) -> dict[str, Any]:
        d = empty_device(self.index)
        d["name"] = self.name
        d["uuid"] = self.uuid
        d["error"] = error
        if self.stuck_since is not None:
            d["not_answering_since"] = utc_iso(self.stuck_since)
        return d


def _str(x: Any) -> Any:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else x


# --------------------------------------------------------------------------------------------


class NvmlBackend:
    """Reads every GPU through NVML; see the module docstring for the rules.

    ``call_timeout_s`` bounds the wait for one NVML call; ``init_timeout_s`` the wait for nvmlInit.
    ``mono`` and ``wall`` are the clocks used for retry schedules and "since" times (tests pass fake
    ones); waiting on deadlines always uses the real ``time.monotonic``.
    """

    label = LABEL
    _serial = 0

    def __init__(
        self,
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        init_timeout_s: float = INIT_TIMEOUT_S,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        nvml_module: Any = None,
    ) -> None:
        # pynvml, or a stand-in with its names (tests); None when nvidia-ml-py is absent (checked before any call)
        self._nvml: Any = nvml_module if nvml_module is not None else _pynvml
        self.call_timeout_s = call_timeout_s
        self.init_timeout_s = init_timeout_s
        self._mono = mono
        self._wall = wall
        self._cond = threading.Condition()
        NvmlBackend._serial += 1
        self._thread_prefix = f"stepwatch-nvml{NvmlBackend._serial}-"
        self._sys = _Worker(f"{self._thread_prefix}session", self._cond)
        self._workers: dict[int, _Worker] = {}
        self._sys_stuck: _Job | None = None
        self._ready = False
        self._devs: list[_Dev] = []
        self._error: str | None = None
        self._next_init = float("-inf")
        self._init_failures = 0
        self._closed = False
        self.init_attempts = 0  #: how many times nvmlInit was tried (for tests and the probe)

    # ---- the one place every NVML call goes through ------------------------------------------

    def _call(self, job: _Job, fn_name: str, *args: Any) -> Any:
        """Make one NVML call on this (worker) thread, recording which call and since when."""
        fn = getattr(self._nvml, fn_name)
        job.call_name = fn_name
        job.call_started_wall = self._wall()
        job.call_started = time.monotonic()
        return fn(*args)

    def _nv(
        self,
        dev: _Dev,
        job: _Job,
        reasons: dict[str, list[str]],
        field: str,
        key: str,
        fn_name: str,
        *args: Any,
        unsupported_value: Any = None,
        keep_reason: bool = True,
    ) -> Any:
        """Call ``fn_name(*args)`` for ``dev``; return its value, or ``unsupported_value``/None.

        NotSupported/NoPermission/FunctionNotFound/ArgumentVersionMismatch: ``key`` is disabled
        for this device for good, the reason kept under ``field``. GpuIsLost & co: raises
        _DeviceLost. Session-level errors: raises _SessionLost. Any other error: None for this
        tick, reason under ``field``.
        """
        if key in dev.disabled:
            reason, value = dev.disabled[key]
            if keep_reason:
                reasons.setdefault(field, []).append(reason)
            return value
        try:
            return self._call(job, fn_name, *args)
        except _UNSUPPORTED as e:
            reason = f"{fn_name}: {err_text(e)}"
            dev.disabled[key] = (reason, unsupported_value)
            if keep_reason:
                reasons.setdefault(field, []).append(reason)
            return unsupported_value
        except _DEVICE_GONE as e:
            raise _DeviceLost(f"{fn_name}: {err_text(e)}") from None
        except _SESSION_GONE as e:
            raise _SessionLost(f"{fn_name}: {err_text(e)}", isinstance(e, _MISMATCH)) from None
        except Exception as e:  # noqa: BLE001 - NVMLError and anything ctypes throws
            reasons.setdefault(field, []).append(f"{fn_name}: {err_text(e)}")
            return None

    def _cached(self, dev: _Dev, job: _Job, reasons: dict[str, list[str]], field: str, key: str,
                ttl: float, fn_name: str, *args: Any, **kw: Any) -> Any:
        hit = dev.cache.get(key)
        now = self._mono()
        if hit is not None and now < hit[1]:
            return hit[0]
        value = self._nv(dev, job, reasons, field, key, fn_name, *args, **kw)
        if value is not None and key not in dev.disabled:
            dev.cache[key] = (value, now + ttl)
        return value

    # ---- session ------------------------------------------------------------------------------

    def _init_job(self, job: _Job) -> int:
        self._call(job, "nvmlInit")
        try:
            return int(self._call(job, "nvmlDeviceGetCount"))
        except BaseException:
            try:
                self._call(job, "nvmlShutdown")
            except Exception:  # noqa: BLE001
                pass
            raise

    def _await(self, jobs: list[_Job], timeout_s: float) -> None:
        """Wait until each job is done or its current call is ``timeout_s`` old (then abandoned)."""
        with self._cond:
            while True:
                now = time.monotonic()
                nxt: float | None = None
                for j in jobs:
                    if j.done.is_set() or j.abandoned:
                        continue
                    deadline = j.call_started + timeout_s
                    if now >= deadline:
                        j.abandoned = True
                    else:
                        nxt = deadline if nxt is None else min(nxt, deadline)
                if nxt is None:
                    return
                self._cond.wait(nxt - now)

    def _unavailable(self, e: BaseException) -> None:
        """NVML could not be initialised (or was lost): remember why and when to try again."""
        self._ready = False
        self._devs_stop()
        mismatch = isinstance(e, _MISMATCH) or (isinstance(e, _SessionLost) and e.mismatch) or (
            type(e).__name__ == "NVMLLibraryMismatchError"
        )
        text = str(e) if isinstance(e, _SessionLost) else err_text(e)
        if mismatch:
            delay = MISMATCH_RETRY_S
            self._error = (f"NVML unavailable: driver/library version mismatch: {text}; "
                           f"re-init every {delay:.0f} s")
        else:
            self._init_failures += 1
            delay = min(INIT_RETRY_MIN_S * 2 ** (self._init_failures - 1), INIT_RETRY_MAX_S)
            self._error = f"NVML unavailable: {text}"
        self._next_init = self._mono() + delay

    def _devs_stop(self) -> None:
        self._devs = []  # the workers stay (self._workers): one per device index, for good

    def _worker_for(self, index: int) -> _Worker:
        w = self._workers.get(index)
        if w is None:
            w = self._workers[index] = _Worker(f"{self._thread_prefix}gpu{index}", self._cond)
        return w

    def _not_answering(self, job: _Job) -> str:
        return f"NVML not answering since {utc_iso(job.call_started_wall)} ({job.call_name})"

    def _ensure_session(self) -> str | None:
        """Initialise NVML when due. Returns a gpu_error, or None when devices can be read."""
        if self._nvml is None:
            return f"NVML unavailable: pynvml cannot be imported ({_IMPORT_ERROR})"
        if self._sys_stuck is not None:
            job = self._sys_stuck
            if not job.done.is_set():
                return self._not_answering(job)
            self._sys_stuck = None  # the late answer of an abandoned init: use it
            self._finish_init(job)
        if self._ready:
            return None
        if self._mono() < self._next_init:
            return self._error
        self.init_attempts += 1
        job = _Job(self._init_job, "nvmlInit", self._wall())
        self._sys.submit(job)
        self._await([job], self.init_timeout_s)
        if not job.done.is_set():
            self._sys_stuck = job
            return self._not_answering(job)
        self._finish_init(job)
        return None if self._ready else self._error

    def _finish_init(self, job: _Job) -> None:
        if job.exc is not None:
            self._unavailable(job.exc)
            return
        count = int(job.result or 0)
        self._devs_stop()
        self._devs = [_Dev(i, self._worker_for(i)) for i in range(count)]
        self._ready = True
        self._error = None
        self._init_failures = 0

    # ---- one device ---------------------------------------------------------------------------

    def _read_device(self, dev: _Dev, job: _Job) -> dict[str, Any]:
        """Everything one device says this tick. Runs on the device's worker thread."""
        nv = self._nvml
        reasons: dict[str, list[str]] = {}
        d = empty_device(dev.index)

        if dev.handle is None:
            try:
                dev.handle = self._call(job, "nvmlDeviceGetHandleByIndex", dev.index)
            except _SESSION_GONE as e:
                raise _SessionLost(f"nvmlDeviceGetHandleByIndex: {err_text(e)}", isinstance(e, _MISMATCH)) from None
            except Exception as e:  # noqa: BLE001
                raise _DeviceLost(f"nvmlDeviceGetHandleByIndex: {err_text(e)}") from None
        h = dev.handle

        if dev.name is None:
            dev.name = _str(self._nv(dev, job, reasons, "name", "name", "nvmlDeviceGetName", h))
        if dev.uuid is None:
            dev.uuid = _str(self._nv(dev, job, reasons, "uuid", "uuid", "nvmlDeviceGetUUID", h))
        d["name"], d["uuid"] = dev.name, dev.uuid

        # MIG: NotSupported means the device has no MIG at all -- a fact (False), not a gap.
        mode = self._cached(dev, job, reasons, "mig_enabled", "mig", MIG_TTL_S, "nvmlDeviceGetMigMode", h,
                            unsupported_value=[0, 0], keep_reason=False)
        mig = None if mode is None else bool(mode[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))
        d["mig_enabled"] = mig

        # kernel-active % (classic utilisation)
        if mig:
            reasons.setdefault("util_pct", []).append("MIG enabled: whole-GPU utilisation is not supported")
        else:
            u = self._nv(dev, job, reasons, "util_pct", "util", "nvmlDeviceGetUtilizationRates", h)
            d["util_pct"] = None if u is None else int(u.gpu)

        m = self._nv(dev, job, reasons, "mem_used_bytes", "mem", "nvmlDeviceGetMemoryInfo", h)
        if m is None:
            reasons["mem_total_bytes"] = list(reasons.get("mem_used_bytes", []))
        else:
            d["mem_used_bytes"], d["mem_total_bytes"] = int(m.used), int(m.total)

        self._read_power(dev, job, reasons, d, h)

        limit_mw = self._cached(dev, job, reasons, "power_limit_w", "power_limit", POWER_LIMIT_TTL_S,
                                "nvmlDeviceGetEnforcedPowerLimit", h)
        d["power_limit_w"] = None if limit_mw is None else limit_mw / 1000.0

        d["sm_clock_mhz"] = self._nv(dev, job, reasons, "sm_clock_mhz", "sm_clock", "nvmlDeviceGetClockInfo",
                                     h, nv.NVML_CLOCK_SM)
        d["mem_clock_mhz"] = self._nv(dev, job, reasons, "mem_clock_mhz", "mem_clock", "nvmlDeviceGetClockInfo",
                                      h, nv.NVML_CLOCK_MEM)
        d["temperature_c"] = self._cached(dev, job, reasons, "temperature_c", "temperature", TEMPERATURE_TTL_S,
                                          "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)

        self._read_gpm(dev, job, reasons, d, h, mig)

        instances: list[tuple[Any, dict[str, Any]]] = []
        if mig:
            instances = self._read_mig(dev, job, reasons, d, h)
        self._read_processes(dev, job, reasons, d, h, instances)

        for field, rs in reasons.items():
            if field in d and d[field] is None and rs:
                d["unsupported"][field] = "; ".join(dict.fromkeys(rs))
        return d

    def _read_power(self, dev: _Dev, job: _Job, reasons: dict[str, list[str]], d: dict[str, Any], h: Any) -> None:
        energy_mj = self._nv(dev, job, reasons, "energy_mj", "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        t = time.monotonic()
        if energy_mj is None:  # the power's reason too, should the power usage fail as well
            reasons.setdefault("power_w", []).extend(reasons.get("energy_mj", []))
        else:
            d["energy_mj"] = int(energy_mj)
            prev = dev.energy_prev
            dev.energy_prev = (int(energy_mj), t)
            if prev is not None and energy_mj >= prev[0] and 0 < t - prev[1] <= ENERGY_MAX_GAP_S:
                d["power_w"] = round((energy_mj - prev[0]) / 1000.0 / (t - prev[1]), 3)
                d["power_source"] = "energy_counter"
                return
        mw = self._nv(dev, job, reasons, "power_w", "power_usage", "nvmlDeviceGetPowerUsage", h)
        if mw is not None:
            d["power_w"] = mw / 1000.0
            d["power_source"] = "power_usage_avg"

    def _read_gpm(self, dev: _Dev, job: _Job, reasons: dict[str, list[str]], d: dict[str, Any], h: Any,
                  mig: bool | None) -> None:
        nv = self._nvml

        def why(text: str) -> None:
            for field, _ in _GPM_FIELDS:
                reasons.setdefault(field, []).append(text)

        if dev.gpm_state == "unknown":
            try:
                support = self._call(job, "nvmlGpmQueryDeviceSupport", h)
                if getattr(support, "isSupportedDevice", 0):
                    dev.gpm_bufs = [self._call(job, "nvmlGpmSampleAlloc"), self._call(job, "nvmlGpmSampleAlloc")]
                    dev.gpm_state = "supported"
                else:
                    dev.gpm_state = "unavailable"
                    dev.gpm_reason = "GPM unavailable: nvmlGpmQueryDeviceSupport says this device does not support GPM"
            except _DEVICE_GONE as e:
                raise _DeviceLost(f"{job.call_name}: {err_text(e)}") from None
            except _SESSION_GONE as e:
                raise _SessionLost(f"{job.call_name}: {err_text(e)}", isinstance(e, _MISMATCH)) from None
            except Exception as e:  # noqa: BLE001 - the query may raise instead of answering no
                dev.gpm_state = "unavailable"
                dev.gpm_reason = f"GPM unavailable: {job.call_name}: {err_text(e)}"
        d["gpm_supported"] = dev.gpm_state == "supported"
        if dev.gpm_state != "supported":
            why(dev.gpm_reason or "GPM unavailable")
            return
        if mig:
            why("MIG enabled: whole-GPU GPM metrics are not sampled")
            dev.gpm_seeded = False
            return
        cur = dev.gpm_bufs[dev.gpm_cur]
        prev = dev.gpm_bufs[1 - dev.gpm_cur]
        got = self._nv(dev, job, reasons, "sm_active_pct", "gpm_sample", "nvmlGpmSampleGet", h, cur)
        if got is None:
            dev.gpm_seeded = False
            why(reasons.get("sm_active_pct", ["nvmlGpmSampleGet failed"])[-1])
            return
        seeded, dev.gpm_seeded = dev.gpm_seeded, True
        dev.gpm_cur = 1 - dev.gpm_cur  # this tick's buffer becomes next tick's "previous"
        if not seeded:
            why("GPM: first sample only seeds the interval")
            return
        wanted = [(f, getattr(nv, c)) for f, c in _GPM_FIELDS if f"gpm:{f}" not in dev.disabled]
        for f, _ in _GPM_FIELDS:
            if f"gpm:{f}" in dev.disabled:
                reasons.setdefault(f, []).append(dev.disabled[f"gpm:{f}"][0])
        if not wanted:
            return
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(wanted)
        mg.sample1 = prev
        mg.sample2 = cur
        for i, (_, metric_id) in enumerate(wanted):
            mg.metrics[i].metricId = metric_id
        res = self._nv(dev, job, reasons, "sm_active_pct", "gpm_get", "nvmlGpmMetricsGet", mg)
        if res is None:
            why(reasons.get("sm_active_pct", ["nvmlGpmMetricsGet failed"])[-1])
            return
        for i, (field, _) in enumerate(wanted):
            ret = int(mg.metrics[i].nvmlReturn)
            if ret == nv.NVML_SUCCESS:
                d[field] = round(float(mg.metrics[i].value), 2)
                continue
            try:
                exc: BaseException = nv.NVMLError(ret)
            except Exception:  # noqa: BLE001
                exc = RuntimeError(f"nvmlReturn {ret}")
            reason = f"nvmlGpmMetricsGet {field}: {err_text(exc)}"
            if _UNSUPPORTED and isinstance(exc, _UNSUPPORTED):
                dev.disabled[f"gpm:{field}"] = (reason, None)
            reasons.setdefault(field, []).append(reason)

    def _read_mig(self, dev: _Dev, job: _Job, reasons: dict[str, list[str]], d: dict[str, Any],
                  h: Any) -> list[tuple[Any, dict[str, Any]]]:
        hit = dev.cache.get("mig_list")
        if hit is not None and self._mono() < hit[1]:
            layout = hit[0]
        else:
            layout = []
            count = self._nv(dev, job, reasons, "mig_instances", "mig_count", "nvmlDeviceGetMaxMigDeviceCount", h)
            for i in range(int(count or 0)):
                try:
                    mh = self._call(job, "nvmlDeviceGetMigDeviceHandleByIndex", h, i)
                except _NOT_FOUND:
                    continue  # an empty slot
                except _DEVICE_GONE as e:
                    raise _DeviceLost(f"nvmlDeviceGetMigDeviceHandleByIndex: {err_text(e)}") from None
                except Exception as e:  # noqa: BLE001
                    reasons.setdefault("mig_instances", []).append(f"nvmlDeviceGetMigDeviceHandleByIndex: {err_text(e)}")
                    continue
                info = {"index": i, "uuid": None, "gpu_instance_id": None, "compute_instance_id": None}
                info["uuid"] = _str(self._nv(dev, job, reasons, "mig_instances", "mig_uuid", "nvmlDeviceGetUUID", mh))
                info["gpu_instance_id"] = self._nv(dev, job, reasons, "mig_instances", "mig_gi",
                                                   "nvmlDeviceGetGpuInstanceId", mh)
                info["compute_instance_id"] = self._nv(dev, job, reasons, "mig_instances", "mig_ci",
                                                       "nvmlDeviceGetComputeInstanceId", mh)
                layout.append((mh, info))
            dev.cache["mig_list"] = (layout, self._mono() + MIG_TTL_S)
        out = []
        for mh, info in layout:
            inst: dict[str, Any] = dict(info, mem_used_bytes=None, mem_total_bytes=None)
            m = self._nv(dev, job, reasons, "mig_instances", "mig_mem", "nvmlDeviceGetMemoryInfo", mh)
            if m is not None:
                inst["mem_used_bytes"], inst["mem_total_bytes"] = int(m.used), int(m.total)
            out.append((mh, inst))
        d["mig_instances"] = [inst for _, inst in out]
        if reasons.get("mig_instances"):
            d["unsupported"]["mig_instances"] = "; ".join(dict.fromkeys(reasons["mig_instances"]))
        return out

    def _read_processes(self, dev: _Dev, job: _Job, reasons: dict[str, list[str]], d: dict[str, Any], h: Any,
                        instances: list[tuple[Any, dict[str, Any]]]) -> None:
        targets = [(mh, inst["uuid"]) for mh, inst in instances] if instances else [(h, None)]
        procs: dict[tuple[int, Any], dict[str, Any]] = {}
        answered = False
        for handle, mig_uuid in targets:
            for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                             ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
                key = f"procs_{kind}" if mig_uuid is None else f"procs_{kind}_mig"
                got = self._nv(dev, job, reasons, "processes", key, fn, handle)
                if got is None:
                    continue
                answered = True
                for p in got:
                    pid = int(getattr(p, "pid", -1))
                    mem = getattr(p, "usedGpuMemory", None)
                    entry = procs.get((pid, mig_uuid))
                    if entry is None:
                        procs[(pid, mig_uuid)] = {"pid": pid, "used_memory_bytes": None if mem is None else int(mem),
                                                  "kind": kind, "mig_uuid": mig_uuid, "in_run": None}
                    else:
                        entry["kind"] = "compute+graphics"
        d["processes"] = list(procs.values())[:MAX_PROCESSES] if answered else None

    # ---- the interface --------------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        """One reading of every device: ``{"devices": [...], "gpu_error": None | str}``. Never raises."""
        try:
            return self._sample()
        except Exception as e:  # noqa: BLE001 - a bug here must not stop the sampler
            return {"devices": [], "gpu_error": f"GPU sampler error: {type(e).__name__}: {e}"}

    def _sample(self) -> dict[str, Any]:
        if self._closed:
            return {"devices": [], "gpu_error": "NVML backend closed"}
        err = self._ensure_session()
        if err is not None or not self._ready:
            return {"devices": [], "gpu_error": err}
        now = self._mono()
        jobs: dict[int, _Job] = {}
        for dev in self._devs:
            if dev.worker.busy or (dev.retry_at is not None and now < dev.retry_at):
                continue
            job = _Job(functools.partial(self._read_device, dev), "device read", self._wall())
            dev.worker.submit(job)
            jobs[dev.index] = job
        self._await(list(jobs.values()), self.call_timeout_s)

        out: list[dict[str, Any]] = []
        session_lost: _SessionLost | None = None
        for dev in self._devs:
            job = jobs.get(dev.index)
            if job is None:
                out.append(self._placeholder(dev))
            elif not job.done.is_set():  # abandoned: missed its deadline
                dev.stuck_since, dev.stuck_call = job.call_started_wall, job.call_name
                out.append(self._placeholder(dev))
            elif isinstance(job.exc, _SessionLost):
                session_lost = job.exc
            elif job.exc is not None:
                self._mark_lost(dev, job.exc)
                out.append(self._placeholder(dev))
            else:
                dev.stuck_since = dev.stuck_call = None
                dev.lost_reason = dev.lost_since = dev.retry_at = None
                dev.lost_failures = 0
                out.append(job.result)
        if session_lost is not None:
            self._unavailable(session_lost)
            return {"devices": [], "gpu_error": self._error}
        return {"devices": out, "gpu_error": None}

    def _placeholder(self, dev: _Dev) -> dict[str, Any]:
        if dev.worker.busy:
            job = dev.worker.job
            if dev.stuck_since is None and job is not None:  # stuck since before a re-init
                dev.stuck_since, dev.stuck_call = job.call_started_wall, job.call_name
            return dev.placeholder(f"NVML not answering since {utc_iso(dev.stuck_since)} ({dev.stuck_call})")
        if dev.lost_reason is not None:
            left = max(0.0, (dev.retry_at or 0.0) - self._mono())
            return dev.placeholder(f"{dev.lost_reason} since {utc_iso(dev.lost_since)}; next retry in {left:.0f} s")
        return dev.placeholder("no reading")

    def _mark_lost(self, dev: _Dev, exc: BaseException) -> None:
        if isinstance(exc, _DeviceLost):
            text = f"GPU is lost: {exc}" if "GpuIsLost" in str(exc) else f"GPU not readable: {exc}"
        else:
            text = f"GPU sampler error: {type(exc).__name__}: {exc}"
        if dev.lost_since is None:
            dev.lost_since = self._wall()
        dev.lost_reason = text
        dev.lost_failures += 1
        dev.retry_at = self._mono() + min(LOST_RETRY_MIN_S * 2 ** (dev.lost_failures - 1), LOST_RETRY_MAX_S)
        dev.handle = None  # fetch a fresh handle on retry
        dev.energy_prev = None
        dev.gpm_seeded = False
        dev.stuck_since = dev.stuck_call = None

    def close(self) -> None:
        """Free GPM buffers and shut NVML down, each with a deadline; never raises, never hangs."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._ready and not self._sys.busy:
                bufs = [b for d in self._devs if not d.worker.busy for b in d.gpm_bufs]

                def shutdown(job: _Job) -> None:
                    for b in bufs:
                        try:
                            self._call(job, "nvmlGpmSampleFree", b)
                        except Exception:  # noqa: BLE001
                            pass
                    self._call(job, "nvmlShutdown")

                job = _Job(shutdown, "nvmlShutdown", self._wall())
                self._sys.submit(job)
                self._await([job], self.call_timeout_s)
        except Exception:  # noqa: BLE001
            pass
        self._ready = False
        self._devs_stop()
        for w in self._workers.values():
            w.stop()
        self._sys.stop()

    # ---- for the probe tool and tests -------------------------------------------------------------

    def worker_threads(self) -> list[str]:
        """Names of this backend's live worker threads (at most one per device plus one)."""
        return [t.name for t in threading.enumerate() if t.name.startswith(self._thread_prefix) and t.is_alive()]

    def gpm_status(self) -> dict[int, str]:
        """Per device index: "supported", "unknown" (not asked yet) or "GPM unavailable: <reason>"."""
        return {d.index: ("supported" if d.gpm_state == "supported" else d.gpm_reason or d.gpm_state) for d in self._devs}
