"""Energy per optimizer step from NVML's energy counter (a figure beside MFU that
needs no FLOP-counting convention).

Each gpu.jsonl record holds, per device, ``energy_mj``: ``nvmlDeviceGetTotalEnergyConsumption``, the
board's energy since the driver loaded, in mJ. :class:`EnergyMeter` keeps the samples of each device
the run uses and interpolates the counter linearly at each step's end (the sampler ticks about once a
second; a step is usually shorter or longer): joules of a step = Σ over devices of E(end) - E(begin).
A counter that goes backwards (a driver reload) starts a new segment; the attempt's energy is the sum of
the segments. A device without the counter (vGPU, pre-Volta) makes the figures ``unsupported`` with
NVML's reason, never 0. Standard library only.
"""

from __future__ import annotations

import bisect
import math
from typing import Any
from collections.abc import Iterable

#: samples kept per device (an hour at the sampler's 1 Hz): step ends older than that get no energy
SAMPLES_KEPT = 3600
#: steps whose energy is reported (the most recent that have samples on both sides)
RECENT_STEPS = 200


class EnergyMeter:
    """Energy counters of the run's devices, sample by sample; :meth:`part` is the snapshot's ``energy``."""

    def __init__(self) -> None:
        self.samples: dict[int, list[tuple[float, float]]] = {}  # device index -> (unix s, mJ), time order
        self.times: dict[int, list[float]] = {}  # the samples' times, for bisect
        self.joules_before: dict[int, float] = {}  # energy of the device's earlier segments (counter resets)
        self.first_mj: dict[int, float] = {}  # the first sample of the device's current segment
        self.unsupported: dict[int, str] = {}

    def add_record(self, rec: dict[str, Any]) -> None:
        t = rec.get("t")
        if type(t) not in (int, float) or not math.isfinite(t):
            return
        for d in rec.get("devices") or []:
            if not isinstance(d, dict) or type(d.get("index")) is not int or d.get("used_by_run") is False:
                continue
            i, e = d["index"], d.get("energy_mj")
            if type(e) not in (int, float) or not 0 <= e < 1e18:
                why = (d.get("unsupported") or {}).get("energy_mj") if isinstance(d.get("unsupported"), dict) else None
                if isinstance(why, str) and i not in self.samples:
                    self.unsupported[i] = why[:300]
                continue
            q, ts = self.samples.setdefault(i, []), self.times.setdefault(i, [])
            if q and t <= q[-1][0]:
                continue
            if q and e < q[-1][1]:  # the counter went back: a new segment
                self.joules_before[i] = self.joules_before.get(i, 0.0) + (q[-1][1] - self.first_mj[i]) / 1000.0
                q.clear()
                ts.clear()
            if not q:
                self.first_mj[i] = float(e)
            q.append((float(t), float(e)))
            ts.append(float(t))
            if len(q) > 2 * SAMPLES_KEPT:  # trimmed in halves: appends stay O(1) on average
                del q[:SAMPLES_KEPT], ts[:SAMPLES_KEPT]
            self.unsupported.pop(i, None)

    def _at(self, i: int, t: float) -> float | None:
        """Device ``i``'s counter at unix time ``t`` (mJ, linear between samples); None outside them."""
        q, ts = self.samples.get(i), self.times.get(i)
        if not q or not ts or not ts[0] <= t <= ts[-1]:
            return None
        k = bisect.bisect_left(ts, t)
        if ts[k] == t:
            return q[k][1]
        (t0, e0), (t1, e1) = q[k - 1], q[k]
        return e0 + (e1 - e0) * (t - t0) / (t1 - t0)

    def joules_between(self, t0: float, t1: float) -> float | None:
        """Joules every device of the run used from ``t0`` to ``t1``; None unless each has samples
        around both times (and in one segment)."""
        if not self.samples:
            return None
        total = 0.0
        for i in self.samples:
            a, b = self._at(i, t0), self._at(i, t1)
            if a is None or b is None:
                return None
            total += (b - a) / 1000.0
        return total

    def part(self, steps: Iterable[Any]) -> dict[str, Any]:
        """``{joules, joules_per_step, tokens_per_joule, steps, devices, source, unsupported}``:
        ``steps`` are StepRecords (``t`` the step's end, ``dt_s``, ``tokens``); joules per step is the
        median over the last RECENT_STEPS steps inside the samples; tokens per joule over those with
        real token counts."""
        out: dict[str, Any] = {"joules": None, "joules_per_step": None, "tokens_per_joule": None, "steps": 0,
                               "devices": sorted(self.samples), "source": "nvmlDeviceGetTotalEnergyConsumption (mJ)",
                               "unsupported": None}
        if self.unsupported and not self.samples:
            out["unsupported"] = "; ".join(f"GPU{i}: {why}" for i, why in sorted(self.unsupported.items()))
            return out
        if not self.samples:
            out["unsupported"] = "no GPU energy samples (no NVML, or no device of the run)"
            return out
        out["joules"] = round(sum(self.joules_before.get(i, 0.0) + (q[-1][1] - self.first_mj[i]) / 1000.0
                                  for i, q in self.samples.items()), 3)
        per_step, tok, tok_j = [], 0, 0.0
        for r in list(steps)[-RECENT_STEPS:]:
            t, dt = getattr(r, "t", None), getattr(r, "dt_s", None)
            if type(t) is not float or type(dt) is not float or not getattr(r, "counted", True):
                continue
            j = self.joules_between(t - dt, t)
            if j is None:
                continue
            per_step.append(j)
            if getattr(r, "tokens", None):
                tok += r.tokens
                tok_j += j
        if per_step:
            per_step.sort()
            out["joules_per_step"] = round(per_step[len(per_step) // 2], 6)
            out["steps"] = len(per_step)
        if tok_j > 0:
            out["tokens_per_joule"] = round(tok / tok_j, 4)
        return out
