"""Shared helpers of the benchmarks: the common ``--json`` shape, interleaved A/B ratios, machine
info, child processes that are always killed (process groups), and a steady fake run.

Every benchmark script writes, with ``--json FILE``, one object of this shape::

    {"bench": "emitter_cost", "quick": true, "date_utc": "...", "machine": {...},
     "figures":   {"emitter_us_per_step": 8.1, "emitter_overhead_ratio": 1.004},   # null when not taken
     "baselines": {"emitter_us_per_step": {"what": "an empty function call", "value": 0.05, "unit": "us"}},
     "spreads":   {"emitter_overhead_ratio": {"n": 40, "min": .., "p10": .., "p90": .., "max": ..}},
     "notes":     {"emitter_overhead_ratio": "why a figure is null, or what to know about it"},
     "details":   {...everything else the script measured...}}

``bench/run.py`` runs each script in its own session (``--json`` to a temp file) and merges the
``figures``. Nothing here asserts: benchmarks print, tests check behaviour.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --- numbers ----------------------------------------------------------------------------------
def nearest_rank(sorted_vals: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list (every value returned is an observation)."""
    if not sorted_vals:
        raise ValueError("no values")
    import math

    k = max(1, math.ceil(pct / 100.0 * len(sorted_vals)))
    return sorted_vals[min(k, len(sorted_vals)) - 1]


def spread(values: Iterable[float]) -> dict[str, Any]:
    """``{"n", "median", "min", "p10", "p90", "max"}`` of ``values`` (nearest-rank percentiles)."""
    v = sorted(values)
    if not v:
        return {"n": 0, "median": None, "min": None, "p10": None, "p90": None, "max": None}
    return {"n": len(v), "median": statistics.median(v), "min": v[0], "p10": nearest_rank(v, 10),
            "p90": nearest_rank(v, 90), "max": v[-1]}


def interleaved_pairs(run_a: Callable[[], float], run_b: Callable[[], float], pairs: int,
                      warmup: int = 1) -> list[tuple[float, float]]:
    """``pairs`` (a, b) timings taken A B, B A, A B, ... so drift hits both sides alike.

    ``run_a`` / ``run_b`` return a time (or any cost) each. ``warmup`` pairs are run first and dropped.
    """
    for _ in range(warmup):
        run_a()
        run_b()
    out = []
    for i in range(pairs):
        if i % 2 == 0:
            a = run_a()
            b = run_b()
        else:
            b = run_b()
            a = run_a()
        out.append((a, b))
    return out


def ratio_of_pairs(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """The median of the per-pair ratios b/a, with their spread (``spread()`` keys)."""
    return spread(b / a for a, b in pairs if a > 0)


# --- the result shape ---------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loadavg_1_5_15": [round(x, 2) for x in load] if load else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_result(bench: str, quick: bool) -> dict[str, Any]:
    return {"bench": bench, "quick": quick, "date_utc": utc_now(), "machine": machine_info(),
            "figures": {}, "baselines": {}, "spreads": {}, "notes": {}, "details": {}}


def write_json(path: str | os.PathLike[str] | None, obj: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(obj, indent=1, default=str) + "\n")


# --- child processes ----------------------------------------------------------------------------
def kill_group(proc: subprocess.Popen | None, sig: int = signal.SIGKILL, wait_s: float = 5.0) -> None:
    """SIGKILL the process group led by ``proc`` (started with ``start_new_session=True``) and reap it."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        try:
            proc.kill()
            proc.wait(timeout=wait_s)
        except Exception:
            pass


def run_child_json(argv: list[str], timeout_s: float, json_path: Path, env: dict[str, str] | None = None,
                   cwd: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any] | None, str, str | None]:
    """Run ``argv`` in its own session (stdout+stderr captured), killing the whole group after
    ``timeout_s``. Returns (the JSON it wrote at ``json_path`` or None, its output, an error note)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env, cwd=cwd or str(ROOT))
    note = None
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        try:  # a grandchild in another session could still hold the pipe: do not wait for it forever
            out, _ = proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            out = b""
        note = f"timed out after {timeout_s:.0f} s (process group killed)"
    finally:
        # whatever the child started in its session and left behind goes too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    text = (out or b"").decode("utf-8", "replace")
    res = None
    try:
        res = json.loads(json_path.read_text())
    except (OSError, ValueError) as e:
        if note is None:
            tail = text.strip().splitlines()[-1:] or [""]
            note = f"no result (exit {proc.returncode}, {type(e).__name__}): {tail[0][:300]}"
    return res, text, note


# --- a temporary git repo (as tests/conftest.py make_repo) ---------------------------------------
def make_repo(path: Path, files: dict[str, str]) -> Path:
    """A real git repo with one commit holding ``files`` (launches need a clean tree)."""
    path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@example.com",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@example.com")

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, env=env)

    git("init", "-q", "-b", "main")
    (path / ".gitignore").write_text("runs/\n")
    for name, text in files.items():
        p = path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git("add", "-A")
    git("commit", "-q", "-m", "bench harness")
    return path


def fmt_num(v: Any, unit: str = "") -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        a = abs(v)
        s = f"{v:.4g}" if a < 1e5 else f"{v:.0f}"
    else:
        s = str(v)
    return s + unit
