"""The GPU sampler: about once a second, one record per tick appended to ``<run_dir>/gpu.jsonl``.

It lives as long as the run, not as long as a screen (ARCHITECTURE.md, "Files are the state,
a view is disposable"). The supervisor starts it as a thread::

    handle = start_sampler_thread(run_dir, child_pid)      # returns at once
    ...
    handle.stop()                                           # after the child was reaped

By hand (or in a test) it runs as ``python -m stepwatch.monitors.gpu.sampler RUN_DIR --pid PID
[--create-time T] [--interval 1.0]``: it writes a last record and exits 0 once PID has ended (a
zombie counts as ended; liveness is the watchdog's, :func:`stepwatch.monitors.watchdog.is_alive`).

Both end up in :func:`run_sampler`, which never raises: a failing backend becomes ``gpu_error`` in the
record, a failing write (ENOSPC, a vanished directory) is counted and said once on stderr.

Each record (``schema.py``): ``{"v":1, "t": unix s, "devices": [...], "gpu_error": ..., "backend": ...}``.
Devices where a process of the watched run's tree holds memory get ``used_by_run = true`` and the
ranks holding them in ``run_ranks`` (the tree is the supervisor's procs.json, else the watched pid
and its psutil children, recursive).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors import fdreserve
from stepwatch.monitors.gpu.schema import make_record
from stepwatch.monitors.watchdog import ProcessRef, is_alive
from stepwatch.monitors.runfiles import GPU_JSONL, PROCS_JSON, append_jsonl

DEFAULT_INTERVAL_S = 1.0
TREE_REFRESH_S = 5.0  #: the run's process tree is re-read at most this often (and at least every 30 s)
TREE_MAX_AGE_S = 30.0


class RunTree:
    """The pids of a watched run, each with its rank where known: the supervisor's record of the
    run's process tree (``procs.json``: every recorded process not yet ended, its ``RANK``) when
    ``procs_file`` is given and holds one, else the watched process and its psutil descendants.

    Re-read when a GPU process is not in the cached set (at most every TREE_REFRESH_S) and every
    TREE_MAX_AGE_S. ``create_time`` (unix s), when given, guards against a reused pid.
    """

    def __init__(self, pid: int, create_time: float | None = None, mono: Callable[[], float] = time.monotonic,
                 procs_file: Path | None = None) -> None:
        self.pid = pid
        self.create_time = create_time
        self.procs_file = procs_file
        self._mono = mono
        self._ranks: dict[int, int | None] = {}  # pid -> rank
        self._read_at = float("-inf")

    def _refresh(self) -> None:
        self._read_at = self._mono()
        if self.procs_file is not None:
            from stepwatch.monitors.proctree import recorded_processes  # noqa: PLC0415 - psutil

            recorded = recorded_processes(self.procs_file, os.geteuid())
            if recorded:
                self._ranks = {p.ref.pid: p.rank for p in recorded if not p.ended}
                return
        try:
            import psutil

            if not is_alive(ProcessRef(self.pid, self.create_time)):  # gone, or the pid reused
                self._ranks = {}
                return
            p = psutil.Process(self.pid)
            self._ranks = {q: None for q in {self.pid} | {c.pid for c in p.children(recursive=True)}}
        except Exception:  # noqa: BLE001 - gone, no permission, no psutil: nothing is ours
            self._ranks = {}

    def ranks_of(self, pids: list[int]) -> dict[int, int | None]:
        """Which of ``pids`` belong to the run, each with its rank (None: not a rank's process)."""
        age = self._mono() - self._read_at
        if age >= TREE_MAX_AGE_S or (age >= TREE_REFRESH_S and any(p not in self._ranks for p in pids)):
            self._refresh()
        return {p: self._ranks[p] for p in pids if p in self._ranks}


def mark_run_devices(devices: list[dict[str, Any]], tree: RunTree | None) -> None:
    """Set ``used_by_run``, ``run_ranks`` and each process's ``in_run`` and ``rank`` where the
    backend left them None."""
    for d in devices:
        procs = d.get("processes")
        if tree is None or procs is None or d.get("used_by_run") is not None:
            continue
        pids = [p["pid"] for p in procs if isinstance(p, dict) and isinstance(p.get("pid"), int)]
        mine = tree.ranks_of(pids) if pids else {}
        for p in procs:
            if isinstance(p, dict) and p.get("in_run") is None:
                p["in_run"] = p.get("pid") in mine
                p["rank"] = mine.get(p.get("pid"))
        d["used_by_run"] = bool(mine)
        d["run_ranks"] = sorted({r for r in mine.values() if r is not None})


ENV_GPU_RECORDING = "STEPWATCH_GPU_RECORDING"


def default_backend() -> Any:
    """``RecordedBackend($STEPWATCH_GPU_RECORDING)`` when that is set (a path, or the file name of a
    bundled recording), else the real :class:`~stepwatch.monitors.gpu.backend.NvmlBackend`. Every record then
    carries ``backend = "recorded:<file>"`` or ``"nvml"``, so replayed data is never taken for live."""
    spec = os.environ.get(ENV_GPU_RECORDING)
    if spec:
        from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording

        path = Path(spec)
        if not path.exists() and bundled_recording(spec).exists():
            path = bundled_recording(spec)
        return RecordedBackend(path)
    from stepwatch.monitors.gpu.backend import NvmlBackend

    return NvmlBackend()


class GpuSampler:
    """One sampler: ``tick()`` writes one record; ``run(stop_event)`` ticks until told to stop.

    ``backend``: anything with ``label``, ``sample()``, ``close()``; default :func:`default_backend`.
    ``clock``: wall clock for the record's ``t``.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        watched_pid: int | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        backend: Any = None,
        watched_create_time: float | None = None,
        clock: Callable[[], float] = time.time,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = Path(path) if path is not None else self.run_dir / GPU_JSONL
        self.watched_pid = watched_pid
        self.watched_create_time = watched_create_time
        self.interval_s = max(0.01, float(interval_s))
        self.clock = clock
        self._backend = backend
        self.tree = RunTree(watched_pid, watched_create_time, procs_file=self.run_dir / PROCS_JSON) if watched_pid else None
        self.ticks = 0
        self.dropped = 0  #: records that could not be written
        self._warned = False

    @property
    def backend(self) -> Any:
        """The backend given, else a RecordedBackend when ``$STEPWATCH_GPU_RECORDING`` names a
        recording (``stepwatch demo`` on a machine without a GPU), else the real NvmlBackend."""
        if self._backend is None:
            self._backend = default_backend()
        return self._backend

    def tick(self) -> dict[str, Any]:
        """Sample once and append the record. Never raises; returns the record."""
        t = self.clock()
        try:
            backend = self.backend
            label = str(getattr(backend, "label", "unknown"))
            snap = backend.sample()
            devices = list(snap.get("devices") or [])
            gpu_error = snap.get("gpu_error")
            mark_run_devices(devices, self.tree)
            record = make_record(t, devices, gpu_error, label)
        except Exception as e:  # noqa: BLE001
            record = make_record(t, [], f"GPU sampler error: {type(e).__name__}: {e}", "unknown")
        try:
            with fdreserve.room(2):  # with every other descriptor of the supervisor taken too
                append_jsonl(self.path, record)
        except Exception as e:  # noqa: BLE001 - ENOSPC, EACCES, ENOENT, unserialisable value
            self.dropped += 1
            if not self._warned:
                self._warned = True
                print(f"stepwatch gpu sampler: cannot write {self.path}: {e}; dropping records", file=sys.stderr)
        self.ticks += 1
        return record

    def run(self, stop_event: threading.Event, *, exit_with_pid: bool = False, max_ticks: int | None = None) -> None:
        """Tick at a fixed rate until ``stop_event`` is set (or the watched pid ended, when asked).

        A tick that overran its slot is not made up for: the next tick starts at the next slot.
        Never raises; closes the backend at the end.
        """
        try:
            next_at = time.monotonic()
            while not stop_event.is_set():
                self.tick()
                if max_ticks is not None and self.ticks >= max_ticks:
                    break
                if exit_with_pid and self.watched_pid and not is_alive(ProcessRef(self.watched_pid, self.watched_create_time)):
                    break
                next_at += self.interval_s
                now = time.monotonic()
                if next_at < now:
                    next_at = now + self.interval_s - ((now - next_at) % self.interval_s)
                stop_event.wait(next_at - now)
        except BaseException as e:  # noqa: BLE001 - never into the supervisor
            try:
                print(f"stepwatch gpu sampler stopped: {type(e).__name__}: {e}", file=sys.stderr)
            except Exception:  # noqa: BLE001
                pass
        finally:
            try:
                if self._backend is not None:
                    self._backend.close()
            except Exception:  # noqa: BLE001
                pass


def run_sampler(
    run_dir: str | os.PathLike[str],
    watched_pid: int | None,
    stop_event: threading.Event,
    interval_s: float = DEFAULT_INTERVAL_S,
    backend: Any = None,
    *,
    watched_create_time: float | None = None,
    exit_with_pid: bool = False,
    max_ticks: int | None = None,
) -> None:
    """Append one GPU record per ``interval_s`` to ``<run_dir>/gpu.jsonl`` until ``stop_event`` is set.

    ``watched_pid`` is the training process (the supervisor's child): devices where its process tree
    holds memory are marked ``used_by_run``. ``backend`` defaults to the real NVML backend; pass a
    :class:`stepwatch.monitors.gpu.recorded.RecordedBackend` to replay a recording. Blocks; never raises.
    """
    GpuSampler(run_dir, watched_pid, interval_s=interval_s, backend=backend,
               watched_create_time=watched_create_time).run(stop_event, exit_with_pid=exit_with_pid,
                                                            max_ticks=max_ticks)


class SamplerHandle:
    """A sampler running on a daemon thread; ``stop()`` ends it and waits up to ``timeout_s``."""

    def __init__(self, sampler: GpuSampler, thread: threading.Thread, stop_event: threading.Event) -> None:
        self.sampler = sampler
        self.thread = thread
        self.stop_event = stop_event

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Ask the sampler to stop; True when its thread ended within ``timeout_s``. Never raises."""
        self.stop_event.set()
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


def start_sampler_thread(
    run_dir: str | os.PathLike[str],
    watched_pid: int | None,
    interval_s: float = DEFAULT_INTERVAL_S,
    backend: Any = None,
    *,
    watched_create_time: float | None = None,
) -> SamplerHandle:
    """Start :func:`run_sampler` on a daemon thread and return at once. Never raises."""
    stop_event = threading.Event()
    sampler = GpuSampler(run_dir, watched_pid, interval_s=interval_s, backend=backend,
                         watched_create_time=watched_create_time)
    thread = threading.Thread(target=sampler.run, args=(stop_event,), name="stepwatch-gpu-sampler", daemon=True)
    try:
        thread.start()
    except Exception as e:  # noqa: BLE001 - e.g. RuntimeError: can't start new thread
        print(f"stepwatch gpu sampler not started: {e}", file=sys.stderr)
    return SamplerHandle(sampler, thread, stop_event)


def main(argv: list[str] | None = None) -> int:
    """``python -m stepwatch.monitors.gpu.sampler RUN_DIR --pid PID``: sample until PID ends (or SIGTERM/SIGINT)."""
    ap = argparse.ArgumentParser(prog="python -m stepwatch.monitors.gpu.sampler",
                                 description="Append GPU samples to RUN_DIR/gpu.jsonl until PID ends.")
    ap.add_argument("run_dir")
    ap.add_argument("--pid", type=int, required=True, help="the watched (training) process")
    ap.add_argument("--create-time", type=float, default=None, help="PID's create_time (unix s), guards pid reuse")
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between samples")
    ap.add_argument("--recording", default=None, help="replay this recording instead of reading NVML")
    args = ap.parse_args(argv)

    stop_event = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop_event.set()

    try:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a lost terminal never ends the sampling
    except (ValueError, OSError):
        pass
    backend = None
    if args.recording:
        from stepwatch.monitors.gpu.recorded import RecordedBackend

        backend = RecordedBackend(args.recording)
    run_sampler(args.run_dir, args.pid, stop_event, args.interval, backend,
                watched_create_time=args.create_time, exit_with_pid=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
