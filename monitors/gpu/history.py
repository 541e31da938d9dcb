"""GPU history for the screen: the last hour at full rate, the whole run at one point a minute.

Fed record by record from ``gpu.jsonl`` (``schema.py``) with :meth:`GpuHistory.add_record`, by the
status snapshot's observer, which reads the file. Standard library only; never opens NVML.

Memory is bounded whatever the run's length: per device at most ``fine_max_points`` fine points
(default 4000, covering the last ``fine_span_s`` = 3600 s at 1 Hz) and at most ``coarse_max_points``
coarse buckets (default 2000); when a run outgrows that, adjacent buckets are merged and the coarse
step doubles (60 s -> 120 s -> ...), so a seven-hour run keeps its 420 one-minute points and a
three-week run still fits.

Units as in the records: util_pct %, power_w W, power_share 0..1, tensor/sm %, mem bytes, C.
Each coarse bucket carries mean, min and max of kernel-active % (a max-only summary hides a second
mode), and mean/max power.
"""

from __future__ import annotations

from itertools import islice
from collections import deque
from dataclasses import dataclass
from typing import Any

from stepwatch.monitors.gpu.reading import power_share
from stepwatch.monitors.gpu.schema import device_key, finite_or_none

FINE_SPAN_S = 3600.0
FINE_MAX_POINTS = 4000
COARSE_STEP_S = 60.0
COARSE_MAX_POINTS = 2000


@dataclass(slots=True)
class Point:
    """One sample of one device. None where the record had no value."""

    t: float
    util_pct: float | None
    power_w: float | None
    power_share: float | None
    tensor_active_pct: float | None
    sm_active_pct: float | None
    mem_used_bytes: int | None
    temperature_c: float | None
    error: str | None


_AGG_FIELDS = ("util_pct", "power_w", "power_share", "tensor_active_pct", "sm_active_pct", "mem_used_bytes",
               "temperature_c")


class Bucket:
    """Aggregate of the samples in ``[t_start, t_start + step_s)``: count, sum, min, max per field."""

    __slots__ = ("t_start", "step_s", "n", "errors", "_n", "_sum", "_min", "_max")

    def __init__(self, t_start: float, step_s: float) -> None:
        self.t_start = t_start
        self.step_s = step_s
        self.n = 0  #: samples in the bucket
        self.errors = 0  #: samples where the device gave no reading
        self._n: dict[str, int] = dict.fromkeys(_AGG_FIELDS, 0)
        self._sum: dict[str, float] = dict.fromkeys(_AGG_FIELDS, 0.0)
        self._min: dict[str, float | None] = dict.fromkeys(_AGG_FIELDS)
        self._max: dict[str, float | None] = dict.fromkeys(_AGG_FIELDS)

    def add(self, p: Point) -> None:
        self.n += 1
        if p.error:
            self.errors += 1
        for f in _AGG_FIELDS:
            v = getattr(p, f)
            if v is None:
                continue
            self._n[f] += 1
            self._sum[f] += v
            lo, hi = self._min[f], self._max[f]
            self._min[f] = v if lo is None or v < lo else lo
            self._max[f] = v if hi is None or v > hi else hi

    def merge(self, other: Bucket) -> None:
        self.n += other.n
        self.errors += other.errors
        for f in _AGG_FIELDS:
            if not other._n[f]:
                continue
            self._n[f] += other._n[f]
            self._sum[f] += other._sum[f]
            for mine, theirs, pick in ((self._min, other._min, min), (self._max, other._max, max)):
                mine[f] = theirs[f] if mine[f] is None else pick(mine[f], theirs[f])

    def mean(self, f: str) -> float | None:
        return self._sum[f] / self._n[f] if self._n[f] else None

    def min(self, f: str) -> float | None:
        return self._min[f]

    def max(self, f: str) -> float | None:
        return self._max[f]

    def as_dict(self) -> dict[str, Any]:
        """``{t_start, step_s, n, errors, util_mean, util_min, util_max, power_w_mean, power_w_max,
        power_share_mean, tensor_active_mean, sm_active_mean, mem_used_max, temperature_max}``."""
        return {
            "t_start": self.t_start, "step_s": self.step_s, "n": self.n, "errors": self.errors,
            "util_mean": self.mean("util_pct"), "util_min": self.min("util_pct"), "util_max": self.max("util_pct"),
            "power_w_mean": self.mean("power_w"), "power_w_max": self.max("power_w"),
            "power_share_mean": self.mean("power_share"),
            "tensor_active_mean": self.mean("tensor_active_pct"), "sm_active_mean": self.mean("sm_active_pct"),
            "mem_used_max": self.max("mem_used_bytes"), "temperature_max": self.max("temperature_c"),
        }


class _DeviceHistory:
    def __init__(self, fine_max: int) -> None:
        self.fine: deque[Point] = deque(maxlen=fine_max)
        self.coarse: list[Bucket] = []
        self.info: dict[str, Any] = {}


class GpuHistory:
    """Per device: ``fine(key)`` (last hour, every sample) and ``coarse(key)`` (whole run, per minute).

    Device keys are UUIDs (``index:<n>`` when a record has none); :meth:`devices` lists them with the
    latest name/index/used_by_run/error.
    """

    def __init__(self, *, fine_span_s: float = FINE_SPAN_S, fine_max_points: int = FINE_MAX_POINTS,
                 coarse_step_s: float = COARSE_STEP_S, coarse_max_points: int = COARSE_MAX_POINTS) -> None:
        self.fine_span_s = fine_span_s
        self.coarse_step_s = coarse_step_s
        self.coarse_max_points = max(2, coarse_max_points)
        self._fine_max = fine_max_points
        self._devs: dict[str, _DeviceHistory] = {}
        self.last_t: float | None = None
        self.gpu_error: str | None = None
        self.backend: str | None = None
        self.records = 0

    # ---- feeding -----------------------------------------------------------------------------

    def add_record(self, rec: dict[str, Any]) -> None:
        """Add one ``gpu.jsonl`` record (ignored when it has no numeric ``t`` or no devices list)."""
        t = rec.get("t") if isinstance(rec, dict) else None
        if not isinstance(t, (int, float)) or not isinstance(rec.get("devices"), list):
            return
        self.records += 1
        self.last_t = t
        self.gpu_error = rec.get("gpu_error")
        self.backend = rec.get("backend")
        for d in rec["devices"]:
            if not isinstance(d, dict):
                continue
            key = device_key(d)
            h = self._devs.get(key)
            if h is None:
                h = self._devs[key] = _DeviceHistory(self._fine_max)
            h.info = {"key": key, "index": d.get("index"), "name": d.get("name"), "uuid": d.get("uuid"),
                      "used_by_run": d.get("used_by_run"), "error": d.get("error")}
            pw, lim = finite_or_none(d.get("power_w")), finite_or_none(d.get("power_limit_w"))
            p = Point(t, finite_or_none(d.get("util_pct")), pw, power_share(pw, lim),
                      finite_or_none(d.get("tensor_active_pct")), finite_or_none(d.get("sm_active_pct")),
                      finite_or_none(d.get("mem_used_bytes")), finite_or_none(d.get("temperature_c")), d.get("error"))
            h.fine.append(p)
            while h.fine and h.fine[0].t < t - self.fine_span_s:
                h.fine.popleft()
            self._add_coarse(h, p)

    def _add_coarse(self, h: _DeviceHistory, p: Point) -> None:
        step = self.coarse_step_s
        start = p.t - (p.t % step)
        if h.coarse and h.coarse[-1].t_start <= p.t < h.coarse[-1].t_start + h.coarse[-1].step_s:
            h.coarse[-1].add(p)
            return
        if h.coarse and p.t < h.coarse[-1].t_start:  # out of order (clock step): keep it in the last bucket
            h.coarse[-1].add(p)
            return
        b = Bucket(start, step)
        b.add(p)
        h.coarse.append(b)
        if len(h.coarse) > self.coarse_max_points:
            self._halve()

    def _halve(self) -> None:
        """Double the coarse step for every device, merging adjacent buckets (memory stays bounded)."""
        self.coarse_step_s *= 2
        step = self.coarse_step_s
        for h in self._devs.values():
            merged: list[Bucket] = []
            for b in h.coarse:
                start = b.t_start - (b.t_start % step)
                if merged and merged[-1].t_start == start:
                    merged[-1].merge(b)
                else:
                    nb = Bucket(start, step)
                    nb.merge(b)
                    merged.append(nb)
            h.coarse = merged

    # ---- reading -------------------------------------------------------------------------------

    def devices(self) -> list[dict[str, Any]]:
        """``[{key, index, name, uuid, used_by_run, error}]`` ordered by index."""
        infos = [h.info for h in self._devs.values()]
        return sorted(infos, key=lambda i: (i.get("index") is None, i.get("index") or 0, i["key"]))

    def fine(self, key: str) -> list[Point]:
        """The last hour (``fine_span_s``) of samples of one device, oldest first."""
        h = self._devs.get(key)
        return list(h.fine) if h else []

    def coarse(self, key: str) -> list[Bucket]:
        """The whole run, one bucket per ``coarse_step_s`` (60 s unless the run outgrew the bound)."""
        h = self._devs.get(key)
        return list(h.coarse) if h else []

    def recent(self, n: int) -> dict[str, dict[str, list[float | None]]]:
        """The snapshot's ``gpu_history``: per device index (a string), the last ``n`` samples'
        ``util_pct`` (kernel-active %, NVML utilization.gpu) and ``power_share`` (power_w /
        power_limit_w, 0..1), oldest first."""
        out = {}
        for h in self._devs.values():
            pts = list(islice(reversed(h.fine), n))[::-1]
            out[str(h.info.get("index"))] = {"util_pct": [p.util_pct for p in pts],
                                              "power_share": [p.power_share for p in pts]}
        return out
