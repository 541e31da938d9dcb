"""What the GPU numbers mean: power share, the "SM-busy, tensor-idle" verdict, the status rows.

Pure functions over ``gpu.jsonl`` records (``schema.py``); standard library only. Views (``status``,
the TUI) call these on the records the sampler wrote; they never open NVML themselves.

The reading (ARCHITECTURE.md, "Reference runs"): "100% SM utilisation at 279-292 W ... on a card that does 304 TFLOPS on
a dense GEMM at the same power" -- the chip is busy doing work that is not matrix multiplication.
A device reads **SM-busy, tensor-idle** when, over the last ``WINDOW_S`` seconds (at least
``MIN_SAMPLES`` samples spanning at least ``MIN_SPAN_S``):

* kernel-active % (NVML ``utilization.gpu``) was >= ``UTIL_BUSY_PCT`` in at least ``BUSY_SHARE`` of
  the samples, and
* with GPM: tensor-core activity (``NVML_GPM_METRIC_ANY_TENSOR_UTIL``) has median
  < ``TENSOR_IDLE_PCT`` while GPM's SM activity says the SMs really are busy
  (median >= ``SM_ACTIVE_BUSY_PCT``); GPM decides whenever it has enough samples;
* without GPM: power / enforced limit has median < ``POWER_SHARE_LOW`` (an inference from power;
  the verdict says so).

It is never claimed from fewer samples, never for an idle GPU (median kernel-active <
``UTIL_IDLE_PCT`` reads "idle"), and never without the numbers: the verdict text carries them.

Verdict codes (the text starts with the code): ``"SM-busy, tensor-idle"``, ``"busy"``,
``"kernel-busy, SMs underused"`` (GPM says few SMs active), ``"active"`` (in between), ``"idle"``,
``"no reading"`` (the device gave none: lost, not answering). ``None``: too few samples to say.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from stepwatch.monitors.gpu.schema import device_key, finite_or_none
from stepwatch.monitors.runfiles import GPU_JSONL

WINDOW_S = 30.0  #: seconds of samples a verdict looks at
MIN_SAMPLES = 10  #: samples with a kernel-active reading needed before any verdict
MIN_SPAN_S = 9.0  #: ... and the time they must span (10 samples at 1 Hz span 9 s)
UTIL_BUSY_PCT = 90.0  #: kernel-active % at or above which a sample counts as busy
BUSY_SHARE = 0.9  #: share of busy samples for "busy for a while"
UTIL_IDLE_PCT = 10.0  #: median kernel-active % below which the GPU is idle
POWER_SHARE_LOW = 0.5  #: median power / enforced limit below which power sits "far below the limit"
TENSOR_IDLE_PCT = 10.0  #: median GPM tensor-core activity % below which tensor cores are idle
SM_ACTIVE_BUSY_PCT = 50.0  #: median GPM SM activity % at or above which the SMs are busy

SM_BUSY_TENSOR_IDLE = "SM-busy, tensor-idle"
BUSY = "busy"
KERNEL_BUSY_SM_UNDERUSED = "kernel-busy, SMs underused"
ACTIVE = "active"
IDLE = "idle"
NO_READING = "no reading"

#: Ranks of one device read from a record at most (a device holds one rank, rarely a few).
MAX_RANKS_SHOWN = 64

#: Keys of one row of ``gpu`` in ``stepwatch status --json``, in order.
STATUS_KEYS = (
    "index",
    "name",
    "uuid",
    "util_pct",
    "power_w",
    "power_limit_w",
    "power_share",
    "mem_used_bytes",
    "mem_total_bytes",
    "sm_clock_mhz",
    "temperature_c",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "used_by_run",
    "run_ranks",
    "verdict",
    "unsupported",
)
#: The numeric metrics of a status row (each null with a reason in ``unsupported`` when unreadable).
_STATUS_METRICS = tuple(k for k in STATUS_KEYS if k not in ("index", "name", "uuid", "used_by_run", "run_ranks",
                                                              "verdict", "unsupported"))


def power_share(power_w: float | None, power_limit_w: float | None) -> float | None:
    """power (W) / enforced power limit (W), 0..~1; None when either is unknown or the limit is 0."""
    power_w, power_limit_w = finite_or_none(power_w), finite_or_none(power_limit_w)
    if power_w is None or power_limit_w is None or power_limit_w <= 0:
        return None
    return power_w / power_limit_w


@dataclass
class Assessment:
    """A verdict: ``code`` (one of the constants above), ``text`` (code + the numbers), ``evidence``."""

    code: str
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _vals(samples: list[tuple[float, dict[str, Any]]], key: str) -> list[float]:
    out = []
    for _, d in samples:
        v = finite_or_none(d.get(key))
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    return out


def assess_device(samples: list[tuple[float, dict[str, Any]]]) -> Assessment | None:
    """Verdict for one device from its recent samples ``[(t, device_dict), ...]``, oldest first.

    ``samples`` should be one window (``WINDOW_S``); the latest decides "no reading". Returns None when
    there are too few samples with a kernel-active reading to say anything.
    """
    if not samples:
        return None
    latest = samples[-1][1]
    if latest.get("error"):
        return Assessment(NO_READING, f"{NO_READING}: {latest['error']}", {"error": latest["error"]})
    good = [(t, d) for t, d in samples if not d.get("error")]
    timed = [(t, d) for t, d in good if d.get("util_pct") is not None]
    utils = _vals(timed, "util_pct")
    if len(utils) < MIN_SAMPLES:
        return None
    span = timed[-1][0] - timed[0][0] if all(isinstance(t, (int, float)) for t, _ in timed) else 0.0
    if span < MIN_SPAN_S:
        return None
    n = len(utils)
    med_util = statistics.median(utils)
    busy_n = sum(1 for u in utils if u >= UTIL_BUSY_PCT)
    ev: dict[str, Any] = {"samples": n, "span_s": round(span, 1), "util_median_pct": med_util,
                          "util_busy_samples": busy_n}
    util_text = f"kernel-active >={UTIL_BUSY_PCT:.0f}% in {busy_n}/{n} samples over {span:.0f} s (median {med_util:.0f}%)"

    if med_util < UTIL_IDLE_PCT:
        return Assessment(IDLE, f"{IDLE}: kernel-active median {med_util:.0f}% over {span:.0f} s ({n} samples)", ev)
    if busy_n < BUSY_SHARE * n:
        return Assessment(ACTIVE, f"{ACTIVE}: kernel-active median {med_util:.0f}%, >={UTIL_BUSY_PCT:.0f}% in "
                                  f"{busy_n}/{n} samples over {span:.0f} s", ev)

    # busy for a while: what kind of busy?
    shares = [s for s in (power_share(d.get("power_w"), d.get("power_limit_w")) for _, d in good) if s is not None]
    watts = _vals(good, "power_w")
    limits = _vals(good, "power_limit_w")
    tensor = _vals(good, "tensor_active_pct")
    sm = _vals(good, "sm_active_pct")
    power_text = None
    if len(shares) >= MIN_SAMPLES // 2 and watts and limits:
        ev.update(power_median_w=_median(watts), power_limit_w=_median(limits), power_share_median=_median(shares))
        power_text = (f"power median {_median(watts):.0f} W = {_median(shares):.0%} of {_median(limits):.0f} W limit")
    enough_gpm = len(tensor) >= MIN_SAMPLES // 2
    if enough_gpm:
        t_med = statistics.median(tensor)
        ev["tensor_active_median_pct"] = t_med
        gpm_text = f"tensor-core active median {t_med:.1f}%"
        if sm:
            ev["sm_active_median_pct"] = _median(sm)
            gpm_text += f", SM active median {_median(sm):.0f}%"
        gpm_text += " (GPM)"
        parts = "; ".join(p for p in (util_text, power_text, gpm_text) if p)
        if sm and statistics.median(sm) < SM_ACTIVE_BUSY_PCT:
            return Assessment(KERNEL_BUSY_SM_UNDERUSED, f"{KERNEL_BUSY_SM_UNDERUSED}: {parts}", ev)
        if t_med < TENSOR_IDLE_PCT:
            return Assessment(SM_BUSY_TENSOR_IDLE, f"{SM_BUSY_TENSOR_IDLE}: {parts}", ev)
        return Assessment(BUSY, f"{BUSY}: {parts}", ev)
    if power_text is not None:
        parts = f"{util_text}; {power_text}"
        if ev["power_share_median"] < POWER_SHARE_LOW:
            return Assessment(SM_BUSY_TENSOR_IDLE,
                              f"{SM_BUSY_TENSOR_IDLE}: {parts}; inferred from power (no GPM tensor reading)", ev)
        return Assessment(BUSY, f"{BUSY}: {parts}", ev)
    return Assessment(BUSY, f"{BUSY}: {util_text}; tensor activity unknown (no GPM, no power reading)", ev)


def _window(records: list[dict[str, Any]], window_s: float) -> list[dict[str, Any]]:
    """The records of the last ``window_s`` seconds before the last record (by their ``t``)."""
    if not records:
        return []
    t_last = records[-1].get("t")
    if not isinstance(t_last, (int, float)):
        return records[-int(window_s):]
    out = []
    for r in reversed(records):
        t = r.get("t")
        if not isinstance(t, (int, float)) or t < t_last - window_s:
            break
        out.append(r)
    out.reverse()
    return out


def device_windows(records: list[dict[str, Any]], window_s: float = WINDOW_S) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    """``{device_key: [(t, device), ...]}`` over the last ``window_s`` seconds of ``records``."""
    out: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for r in _window(records, window_s):
        t = r.get("t")
        for d in r.get("devices") or []:
            if isinstance(d, dict):
                out.setdefault(device_key(d), []).append((t, d))
    return out


def status_row(device: dict[str, Any], samples: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """One row of ``gpu`` for ``status --json`` (keys STATUS_KEYS, every key present).

    Values are the latest sample's; ``verdict`` is :func:`assess_device`'s text (None: too few samples);
    ``unsupported`` maps every null metric of the row to the reason it is null.
    """
    d = device
    row: dict[str, Any] = {k: None for k in STATUS_KEYS}
    for k in ("index", "name", "uuid", "util_pct", "power_w", "power_limit_w", "mem_used_bytes", "mem_total_bytes",
              "sm_clock_mhz", "temperature_c", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "used_by_run"):
        row[k] = finite_or_none(d.get(k))
    ranks = d.get("run_ranks")
    if isinstance(ranks, list):  # a file is hostile: ranks are small ints, a short list
        row["run_ranks"] = sorted({r for r in ranks[:MAX_RANKS_SHOWN] if type(r) is int and 0 <= r < 10**6})
    row["power_share"] = power_share(row["power_w"], row["power_limit_w"])
    if row["power_share"] is not None:
        row["power_share"] = round(row["power_share"], 4)
    a = assess_device(samples)
    row["verdict"] = a.text if a else None
    reasons = d.get("unsupported")
    if not isinstance(reasons, dict):
        reasons = {}
    unsupported: dict[str, str] = {}
    for k in _STATUS_METRICS:
        if row[k] is not None:
            continue
        if d.get("error"):
            unsupported[k] = str(d["error"])
        elif k == "power_share":
            why = [f"{x} is null" for x in ("power_w", "power_limit_w") if row[x] is None]
            unsupported[k] = "; ".join(why) if why else "power_limit_w is 0"
        else:
            unsupported[k] = str(reasons.get(k) or "not reported")
    row["unsupported"] = unsupported
    return row


def gpu_status_from_records(records: Iterable[dict[str, Any]], window_s: float = WINDOW_S) -> tuple[list[dict[str, Any]] | None, str | None]:
    """``(gpu, gpu_error)`` for ``stepwatch status --json`` from ``gpu.jsonl`` records, oldest first.

    ``gpu`` is a list of :func:`status_row` dicts, one per device in the latest record; ``[]`` when NVML
    answered and there is no GPU; None when there is no NVML session (``gpu_error`` then says why,
    e.g. "NVML unavailable: NVML Shared Library Not Found (NVMLError_LibraryNotFound)") or no record.
    """
    recs = [r for r in records if isinstance(r, dict) and isinstance(r.get("devices"), list)]
    if not recs:
        return None, "no GPU samples recorded (gpu.jsonl missing or empty): NVML state unknown"
    last = recs[-1]
    err = last.get("gpu_error")
    devices = [d for d in last["devices"] if isinstance(d, dict)]
    if not devices:
        return (None, err) if err else ([], None)
    windows = device_windows(recs, window_s)
    return [status_row(d, windows.get(device_key(d), [])) for d in devices], err


def read_gpu_tail(path: str | os.PathLike[str], max_bytes: int = 4 << 20) -> list[dict[str, Any]]:
    """The complete records in the last ``max_bytes`` of a ``gpu.jsonl`` (a partial line is skipped).

    Raises FileNotFoundError / PermissionError like ``open``.
    """
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read()
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line is cut
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line caught mid-write, or nested deeper than json reads
        if isinstance(obj, dict):
            out.append(obj)
    return out


def gpu_status_for_run_dir(run_dir: str | os.PathLike[str], window_s: float = WINDOW_S) -> tuple[list[dict[str, Any]] | None, str | None]:
    """:func:`gpu_status_from_records` over the tail of ``<run_dir>/gpu.jsonl``. Never raises for
    a missing or unreadable file (it says so in ``gpu_error``). Reads only; never opens NVML."""
    path = Path(run_dir) / GPU_JSONL
    try:
        records = read_gpu_tail(path)
    except FileNotFoundError:
        return None, "no GPU samples recorded (gpu.jsonl missing): NVML state unknown"
    except OSError as e:
        return None, f"cannot read {GPU_JSONL}: {e.strerror or e}"
    return gpu_status_from_records(records, window_s)


def gpu_source(records: list[dict[str, Any]]) -> str | None:
    """The latest record's ``backend``: "nvml" or "recorded:<file>" (show "recorded" on screen)."""
    for r in reversed(records):
        if isinstance(r, dict) and "backend" in r:
            return r.get("backend")
    return None
