"""A recorded GPU backend: replays a JSONL of samples behind the same interface as the real one.

Interface (as :class:`stepwatch.monitors.gpu.backend.NvmlBackend`)::

    backend.label              "recorded:<file name>" -- every record the sampler writes from it
                               carries this label, so replayed data is never taken for live data
    backend.sample() -> dict   {"devices": [...], "gpu_error": None | str}
    backend.close()

File format: one JSON object per line. Lines with a ``"devices"`` key are samples in the
``gpu.jsonl`` record format (``schema.py``), so a real run's ``gpu.jsonl`` replays as is. Other
lines are headers; a synthetic recording's first line is
``{"recording": "synthetic", "description": ..., "shaped_after": ...}``. Lines that are not JSON
are skipped. A recording that cannot be read yields ``gpu_error = "recording unavailable: ..."``.

The bundled recordings live in ``assets/gpu_recordings/`` (:func:`bundled_recording`).
"""

from __future__ import annotations

import copy
from importlib import resources
import json
from pathlib import Path
from typing import Any

from stepwatch.monitors.gpu.schema import normalise_device

# The bundled recordings are package data of stepwatch.assets (a non-editable install has them too).
RECORDINGS_DIR = Path(str(resources.files("stepwatch.assets").joinpath("gpu_recordings")))


def bundled_recording(name: str) -> Path:
    """Path of a bundled recording by file name (``"synthetic_h100_healthy_compute_bound.jsonl"``)."""
    return RECORDINGS_DIR / name


def bundled_recordings() -> list[Path]:
    """Every bundled recording, sorted by name."""
    return sorted(RECORDINGS_DIR.glob("*.jsonl"))


def load_recording(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read a recording: ``(headers, samples)``. Raises OSError when the file cannot be read."""
    headers: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if isinstance(obj.get("devices"), list):
                samples.append(obj)
            else:
                headers.append(obj)
    return headers, samples


class RecordedBackend:
    """Replays the samples of a recording, one per :meth:`sample` call.

    ``loop``: start again at the end (the demo); otherwise, after the last sample every call
    returns no devices and ``gpu_error = "recording <name> ended after N samples"``.
    """

    def __init__(self, path: str | Path, *, loop: bool = True) -> None:
        self.path = Path(path)
        self.label = f"recorded:{self.path.name}"
        self.loop = loop
        self._pos = 0
        self.error: str | None = None
        self.headers: list[dict[str, Any]] = []
        self._samples: list[dict[str, Any]] = []
        try:
            self.headers, self._samples = load_recording(self.path)
        except OSError as e:
            self.error = f"recording unavailable: {self.path.name}: {e.strerror or e}"
        if self.error is None and not self._samples:
            self.error = f"recording unavailable: {self.path.name} holds no samples"
        # normalise once, so each tick is a cheap copy
        for s in self._samples:
            s["devices"] = [normalise_device(d) for d in s["devices"] if isinstance(d, dict)]

    @property
    def synthetic(self) -> bool:
        """True when a header says the recording is synthetic (no GPU was there to record from)."""
        return any(h.get("recording") == "synthetic" for h in self.headers)

    def __len__(self) -> int:
        return len(self._samples)

    def sample(self) -> dict[str, Any]:
        """The next recorded sample: ``{"devices": [...], "gpu_error": ...}``. Never raises."""
        if self.error is not None:
            return {"devices": [], "gpu_error": self.error}
        if self._pos >= len(self._samples):
            if not self.loop:
                return {"devices": [], "gpu_error": f"recording {self.path.name} ended after {len(self._samples)} samples"}
            self._pos = 0
        s = self._samples[self._pos]
        self._pos += 1
        return {"devices": copy.deepcopy(s["devices"]), "gpu_error": s.get("gpu_error")}

    def close(self) -> None:
        """Nothing to release."""
