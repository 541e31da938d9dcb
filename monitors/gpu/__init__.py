"""GPU monitoring: NVML sampler, recorded backend, readings, history (ARCHITECTURE.md, "Folders": monitors/gpu/).

No UI here. Modules:

* ``sampler``  -- :func:`~stepwatch.monitors.gpu.sampler.run_sampler` / :func:`~stepwatch.monitors.gpu.sampler.start_sampler_thread`
  / ``python -m stepwatch.monitors.gpu.sampler RUN_DIR --pid PID``: one record per tick to ``gpu.jsonl``.
* ``backend``  -- :class:`~stepwatch.monitors.gpu.backend.NvmlBackend`, the real NVML reader (deadlines, back-off).
* ``recorded`` -- :class:`~stepwatch.monitors.gpu.recorded.RecordedBackend`, replays a JSONL behind the same interface.
* ``reading``  -- power share, the "SM-busy, tensor-idle" verdict, rows for ``status --json``
  (:func:`~stepwatch.monitors.gpu.reading.gpu_status_from_records`, :func:`~stepwatch.monitors.gpu.reading.gpu_status_for_run_dir`).
* ``history``  -- :class:`~stepwatch.monitors.gpu.history.GpuHistory`: last hour at 1 Hz, whole run per minute.
* ``schema``   -- the record and device keys.

Importing this package loads only the standard-library modules (reading, history, schema); pynvml is
imported by ``backend`` alone.
"""

from stepwatch.monitors.gpu.history import GpuHistory
from stepwatch.monitors.gpu.reading import (
    STATUS_KEYS,
    assess_device,
    gpu_source,
    gpu_status_for_run_dir,
    gpu_status_from_records,
    power_share,
)

__all__ = [
    "GpuHistory",
    "STATUS_KEYS",
    "assess_device",
    "gpu_source",
    "gpu_status_for_run_dir",
    "gpu_status_from_records",
    "power_share",
]
