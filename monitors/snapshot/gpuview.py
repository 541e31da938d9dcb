"""The snapshot's GPU part from gpu.jsonl (written by the sampler beside the supervisor, never NVML
here): read incrementally, the records of the verdicts' window kept, and the panel's history."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any, cast

from stepwatch.monitors.gpu.energy import EnergyMeter
from stepwatch.monitors.gpu.history import GpuHistory
from stepwatch.monitors.gpu.reading import WINDOW_S as GPU_WINDOW_S, gpu_source, gpu_status_from_records
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.runfiles import GPU_JSONL
from stepwatch.monitors.snapshot.types import DeviceHistory, GpuDevice, Snapshot

#: Samples per device in the snapshot's gpu_history (the GPU panel's sparklines).
GPU_HISTORY_SHOWN = 120


class GpuView:
    """One attempt's gpu.jsonl: :meth:`read` what is new, :meth:`part` fills the snapshot's
    ``gpu``, ``gpu_error``, ``gpu_source`` and ``gpu_history``."""

    def __init__(self, run_dir: Path):
        self.reader = EventReader(Path(run_dir) / GPU_JSONL)
        self.window: deque[dict[str, Any]] = deque()  # the records of the verdicts' window
        self.history = GpuHistory()
        self.energy = EnergyMeter()

    def close(self) -> None:
        self.reader.close()

    def read(self) -> None:
        for rec in self.reader.read_new():
            t = rec.get("t") if isinstance(rec, dict) else None
            if type(t) not in (int, float) or not math.isfinite(cast(float, t)) or (self.window and t < self.window[-1]["t"]):
                continue  # a record without a usable time (or from the past) would pin the window
            self.window.append(rec)
            self.history.add_record(rec)
            self.energy.add_record(rec)
        while self.window and self.window[-1]["t"] - self.window[0]["t"] > GPU_WINDOW_S + 5:
            self.window.popleft()

    def part(self, snap: Snapshot) -> None:
        recs = list(self.window)
        if not recs and not self.reader.exists:
            snap["gpu"], snap["gpu_error"] = None, "no GPU samples recorded (gpu.jsonl missing): NVML state unknown"
            return
        gpu, snap["gpu_error"] = gpu_status_from_records(recs)
        snap["gpu"] = cast("list[GpuDevice] | None", gpu)  # status_row: every key of GpuDevice
        snap["gpu_source"] = gpu_source(recs)
        snap["gpu_history"] = cast("dict[str, DeviceHistory]", self.history.recent(GPU_HISTORY_SHOWN))


def replayed(snap: Snapshot) -> str | None:
    """The recording the snapshot's GPU figures (devices, energy) replay (the demo on a machine without a GPU), or
    None when NVML measured them: every view labels a replayed figure where it shows it."""
    src = str(snap.get("gpu_source") or "")
    return (src.split(":", 1)[-1] or "a recording") if src.startswith("recorded") else None
