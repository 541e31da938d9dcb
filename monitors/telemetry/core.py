"""StepTelemetry: writes ``events.jsonl`` from inside the training process (keys: :mod:`stepwatch.monitors.protocol`).

Standard library only. torch and transformers are never imported here; their versions are read
from ``sys.modules`` (the module the process runs) or else from the installed distribution metadata.

Where the numbers come from:

* ``dt`` (seconds): ``time.perf_counter()`` at this step's end minus the previous step's end in this
  process; for the first step of the process, minus :meth:`StepTelemetry.step_begin` (or, when that
  was never called, minus the moment the run started). Rounded to 1 µs, and that rounded value is
  both written and used in ``run_end.step_seconds``, so every summary value is a written ``dt``.
* ``step_begin`` / ``step_end`` / ``t``: ``time.time()`` (unix seconds). ``step_begin`` is the start
  of the interval ``dt`` measures: the previous step's ``step_end``, so consecutive steps tile.
* ``run_end.step_seconds``: nearest-rank summary (:mod:`stepwatch.telemetry.stats`) of the ``dt`` of
  every step since ``run_start`` except the first and those whose interval held an evaluation or a save
  (flags ``eval``, ``save``: ARCHITECTURE.md R18).
* ``dynamo``: :mod:`stepwatch.telemetry.dynamo`, compared at most once per ``check_interval_s``.

Cost per step (measured by ``bench/emitter_cost.py``): two clock reads, the step line built from a
fixed template (the same bytes as the JSON encoder, which is used for unusual value types and for the
other events), appended to a buffer written by time, not by step: one ``os.write`` to an ``O_APPEND``
descriptor once FLUSH_EVERY_S (50 ms) passed since the last one (a step after a longer gap is written at
once; a small daemon thread writes what a step left behind within FLUSH_EVERY_S, so a hang right after
a step still shows that step), and always before ``run_start`` / ``phase`` / ``dynamo`` / ``log`` /
``run_end``, at ``close()`` and at interpreter exit. A SIGKILL loses at most the last FLUSH_EVERY_S of
steps. No fsync, no CUDA synchronisation. Once per ``check_interval_s`` (1 s): one
``stat`` and ``fstat`` of the events file (was it removed or replaced?) and the dynamo check.

Failure: nothing raises into the training loop. An ``OSError`` on open or write (ENOSPC, the run dir
removed, a read-only file system, a path whose parent is a file) disables writing; every event from
then on is counted in ``dropped_events`` and one line goes to stderr, once. ``run_end`` tries one
more write so it can carry the count when the disk has come back. A removed file is noticed at the
next check (at most ``check_interval_s`` later); events written into the unlinked file before that
are lost without being counted.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from array import array
from typing import Any
from collections.abc import Iterable, Mapping

from stepwatch.monitors.runfiles import ENV_ALL_RANKS, ENV_ATTEMPT, ENV_RUN_DIR, EVENTS_JSONL, rank_events_name
from stepwatch.telemetry.dynamo import OBSERVER, DynamoObserver, counters_snapshot
from stepwatch.monitors.protocol import (
    FLAG_EVAL, FLAG_FIRST, FLAG_RECOMPILE, FLAG_SAVE, FLAGS, KIND_DYNAMO, KIND_LOG, KIND_PHASE, KIND_RUN_END,
    KIND_RUN_START, KIND_STEP, PHASE_NAMES, SCHEMA_VERSION,
)
from stepwatch.telemetry.stats import step_summary
from stepwatch.telemetry.writer import EventFileWriter, warn



#: Set once the "STEPWATCH_RUN_DIR is not set" warning was printed (once per process).
_warned_unset = False




def _env_int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def rank_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` from torchrun's variables: ``RANK`` (else ``LOCAL_RANK``, else 0) and
    ``WORLD_SIZE`` (else 1); in a task of an ``srun`` step (``SLURM_STEP_ID`` set: never the batch
    script itself) without them, Slurm's ``SLURM_PROCID`` and ``SLURM_STEP_NUM_TASKS``."""
    env = os.environ if env is None else env
    rank = _env_int(env, "RANK")
    if rank is None:
        rank = _env_int(env, "LOCAL_RANK")
    world = _env_int(env, "WORLD_SIZE")
    if rank is None and env.get("SLURM_STEP_ID") is not None:
        rank, world = _env_int(env, "SLURM_PROCID"), world or _env_int(env, "SLURM_STEP_NUM_TASKS")
    return (rank if rank is not None else 0), (world if world is not None and world > 0 else 1)


def events_filename(rank: int, all_ranks: bool) -> str:
    """``events.jsonl`` for rank 0; ``events.rank<N>.jsonl`` for rank N > 0 when every rank writes."""
    return rank_events_name(rank) if all_ranks else EVENTS_JSONL


def library_version(name: str) -> str | None:
    """The version of ``name`` as this process sees it: ``sys.modules[name].__version__`` when the
    module is loaded, else the installed distribution's metadata, else None. Never imports it."""
    mod = sys.modules.get(name)
    v = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(v, str):
        return v
    if v is not None:
        return str(v)
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return None


def attn_implementation_of(model: Any) -> str | None:
    """``model.config._attn_implementation`` (what transformers resolved), or None."""
    try:
        v = getattr(getattr(model, "config", None), "_attn_implementation", None)
    except Exception:
        return None
    return v if v is None or isinstance(v, str) else str(v)


def _json_default(o: Any) -> Any:
    """Make scalars JSON-able without a device sync: a tensor not on the CPU is never read."""
    dev = getattr(o, "device", None)
    if dev is not None and getattr(dev, "type", "cpu") != "cpu":
        return f"<{type(o).__name__} on {dev}>"
    item = getattr(o, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if dev is not None:
        return f"<{type(o).__name__}>"
    return str(o)


#: One encoder for every event (``json.dumps`` with non-default arguments builds a new one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_json_default)

# The step event, the one written at every step, is built from a template instead (about a third of
# the encoder's cost). It gives the very bytes _ENCODER gives for the same values, as the C encoder
# writes them: a float (finite) as float.__repr__, an int as int.__repr__, None as null, a str through
# encode_basestring_ascii (the function the encoder itself uses with ensure_ascii), the keys in order,
# no spaces. Any other type or a non-finite float goes to the encoder (tests/test_telemetry.py
# compares the two over random values).
_encode_str = json.encoder.encode_basestring_ascii
_STEP_HEAD = '{"v":' + _ENCODER.encode(SCHEMA_VERSION) + ',"kind":' + _ENCODER.encode(KIND_STEP) + ',"t":'
_FLAG_JSON = {f: _encode_str(f) for f in FLAGS}
_INF = float("inf")
#: (t, repr(t)) of the last step line: a step's step_begin is the previous step's t, the same float
#: object, so its repr (the dearest part of the line) is taken from here. One tuple: read and
#: replaced whole.
_last_t_repr: tuple[Any, str] = (None, "")


def _step_line(
    t: Any,
    step: Any,
    rank: Any,
    dt: Any,
    step_begin: Any,
    tokens: Any,
    padded_tokens: Any,
    flags: list[Any],
    batch_size: Any = None,
    width: Any = None,
) -> str | None:
    """``_ENCODER.encode`` of the step event (``step_end`` = ``t``), or None when a value is not of
    the plain types the template writes (a float that is finite, an int, None, a str)."""
    global _last_t_repr
    if not (
        type(t) is float
        and type(dt) is float
        and type(step_begin) is float
        and -_INF < t < _INF
        and -_INF < dt < _INF
        and -_INF < step_begin < _INF
        and type(step) is int
        and type(rank) is int
    ):
        return None
    if tokens is None:
        tok = "null"
    elif type(tokens) is int:
        tok = repr(tokens)
    else:
        return None
    if padded_tokens is None:
        pad = "null"
    elif type(padded_tokens) is int:
        pad = repr(padded_tokens)
    else:
        return None
    if batch_size is None and width is None:
        shape = '"batch_size":null,"width":null'
    elif type(batch_size) in (int, type(None)) and type(width) in (int, float, type(None)) and \
            (width is None or -_INF < width < _INF):
        shape = f'"batch_size":{"null" if batch_size is None else repr(batch_size)},' \
                f'"width":{"null" if width is None else repr(width)}'
    else:
        return None
    if flags:
        parts = []
        for f in flags:
            if type(f) is not str:
                return None
            parts.append(_FLAG_JSON.get(f) or _encode_str(f))
        fl = ",".join(parts)
    else:
        fl = ""
    last_t, last_repr = _last_t_repr
    br = last_repr if step_begin is last_t else repr(step_begin)
    tr = repr(t)
    _last_t_repr = (t, tr)
    return (
        f'{_STEP_HEAD}{tr},"step":{step!r},"rank":{rank!r},"dt":{dt!r},"step_begin":{br},'
        f'"step_end":{tr},"tokens":{tok},"padded_tokens":{pad},"flags":[{fl}],{shape}}}'
    )


class StepTelemetry(EventFileWriter):
    """Telemetry for a plain training loop; :class:`StepwatchCallback` wraps one for the HF Trainer.

    ``StepTelemetry()`` reads ``STEPWATCH_RUN_DIR`` / ``STEPWATCH_ATTEMPT`` (set by the launcher) and
    writes ``run_start`` at once. Without a run dir it is a no-op that warns once per process on
    stderr. Only rank 0 writes unless ``all_ranks`` or ``STEPWATCH_ALL_RANKS=1`` (then rank N writes
    ``events.rank<N>.jsonl``).

    Arguments (all keyword, all optional):
        run_dir: overrides ``STEPWATCH_RUN_DIR``.
        max_steps: planned optimizer steps, for ``run_start.max_steps``.
        model: a transformers model; its ``config._attn_implementation`` is the resolved backend.
        attn_implementation_requested: what the harness asked for (a constant in its source).
        attn_implementation_resolved: overrides the value read from ``model``.
        rank, world_size: override ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE``.
        all_ranks: let every rank write its own file.
        start: write ``run_start`` now (False: the caller calls :meth:`run_start` later).
        check_interval_s: the period (seconds) of the events-file and dynamo checks.

    The file is opened in append mode (``O_APPEND``): the launcher rotates files between attempts;
    within an attempt a restarted process appends. Not thread-safe for concurrent callers beyond a
    lock around the write; call it from the training loop's thread.
    """

    def __init__(
        self,
        *,
        run_dir: str | os.PathLike[str] | None = None,
        max_steps: int | None = None,
        model: Any = None,
        attn_implementation_requested: str | None = None,
        attn_implementation_resolved: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        all_ranks: bool = False,
        start: bool = True,
        check_interval_s: float = 1.0,
    ) -> None:
        global _warned_unset
        env_rank, env_world = rank_from_env()
        self.rank: int = env_rank if rank is None else int(rank)
        self.world_size: int = env_world if world_size is None else int(world_size)
        # every rank writes its own file when asked here or by the launch's env (STEPWATCH_ALL_RANKS=1)
        self.all_ranks = bool(all_ranks) or os.environ.get(ENV_ALL_RANKS, "").strip().lower() in ("1", "true", "yes")
        self.attempt: str | None = os.environ.get(ENV_ATTEMPT)
        rd = os.fspath(run_dir) if run_dir is not None else os.environ.get(ENV_RUN_DIR) or None
        self.run_dir: str | None = rd
        self.path: str | None = None
        #: Events that could not be written (after an OSError, or not serialisable).
        self.check_interval_s = float(check_interval_s)
        self.max_steps = max_steps
        self.attn_implementation_requested = attn_implementation_requested
        self._attn_resolved = attn_implementation_resolved
        self._model = model
        self._observer: DynamoObserver = OBSERVER
        self._init_writer()
        self._warned_serialise = False
        self._warned_internal = False
        self._run_open = False
        self._reset_run_state()
        if rd is None:
            if not _warned_unset:
                _warned_unset = True
                warn(f"{ENV_RUN_DIR} is not set; no events will be written (launch with stepwatch to record them)")
        self._update_path()
        self._observer.try_install()
        if start:
            self.run_start()

    # --- state ---------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """True when this process writes events (a run dir is set and it is rank 0 or all_ranks)."""
        return self.path is not None

    @property
    def disabled(self) -> bool:
        """True while an OSError stopped writing (a full disk's pause ends when a write is tried again and succeeds)."""
        return self._disabled

    def _update_path(self) -> None:
        if self.run_dir is None or (self.rank != 0 and not self.all_ranks):
            self.path = None
        else:
            self.path = os.path.join(self.run_dir, events_filename(self.rank, self.all_ranks))

    def _reset_run_state(self) -> None:
        now = time.perf_counter()
        self._run_t0_perf = now
        self._run_t0_wall = time.time()
        self._begin_perf: float | None = None
        self._begin_wall: float | None = None
        self._prev_end_perf: float | None = None
        self._prev_end_wall: float | None = None
        self._dts = array("d")
        self._step_counter = 0
        self._last_step: int | None = None
        self._pending: set[str] = set()
        self._recompile_mark = self._observer.recompile_signal()
        self._next_check = now + self.check_interval_s
        self._dyn_last: tuple[Any, Any, Any] = ({}, None, None)
        self._open_phases: set[str] = set()

    # --- the API ------------------------------------------------------------------------------
    def run_start(
        self,
        *,
        max_steps: int | None = None,
        model: Any = None,
        attn_implementation_resolved: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """Write ``run_start`` and start a new step series (the next step is flagged ``first``)."""
        try:
            if rank is not None:
                self.rank = int(rank)
            if world_size is not None:
                self.world_size = int(world_size)
            self._update_path()
            if max_steps is not None:
                self.max_steps = max_steps
            if model is not None:
                self._model = model
            if attn_implementation_resolved is not None:
                self._attn_resolved = attn_implementation_resolved
            self._observer.try_install()
            self._reset_run_state()
            self._run_open = True
            if not self.active:
                return
            resolved = self._attn_resolved if self._attn_resolved is not None else attn_implementation_of(self._model)
            self._emit({
                "v": SCHEMA_VERSION, "kind": KIND_RUN_START, "t": time.time(), "step": None, "rank": self.rank,
                "world_size": self.world_size, "pid": os.getpid(),
                "max_steps": self.max_steps if self.max_steps is None else int(self.max_steps),
                "versions": {
                    "python": platform.python_version(),
                    "torch": library_version("torch"),
                    "transformers": library_version("transformers"),
                },
                "attn_implementation": {"requested": self.attn_implementation_requested, "resolved": resolved},
            })
            self._check(time.perf_counter())
        except Exception as e:  # never raise into training
            self._internal_error(e)

    def step_begin(self) -> None:
        """Mark the start of the first step of the process (optional; later calls are ignored:
        every later step is measured from the previous step's end)."""
        if self._prev_end_perf is None:
            self._begin_perf = time.perf_counter()
            self._begin_wall = time.time()

    def step_end(
        self,
        tokens: int | None = None,
        padded_tokens: int | None = None,
        flags: Iterable[str] | None = None,
        *,
        step: int | None = None,
        batch_size: int | None = None,
        width: float | None = None,
    ) -> None:
        """Close one optimizer step and write its ``step`` event.

        ``tokens``: real (non-padding) tokens in the step; ``padded_tokens``: tokens computed
        including padding; None when unknown. ``flags``: extra flags, written after the emitter's own.
        ``step``: the optimizer step number (default: one more than the previous step).
        ``batch_size``: sequences in the step (summed over its micro-batches); ``width``: their padded
        width (tokens per sequence; with micro-batches of several widths, the token-weighted width
        Σb·w² / Σb·w). With both, ``padded_tokens`` defaults to batch_size × width. The monitor fits
        the step time on them (the scaling curve, monitors/detectors/scaling.py).
        """
        now = time.perf_counter()
        wall = time.time()
        if not self.active:
            return
        try:
            first = self._prev_end_perf is None
            if first:
                if self._begin_perf is not None:
                    b_perf, b_wall = self._begin_perf, self._begin_wall
                else:
                    b_perf, b_wall = self._run_t0_perf, self._run_t0_wall
            else:
                b_perf, b_wall = self._prev_end_perf, self._prev_end_wall
            dt = round(now - b_perf, 6)
            if step is None:
                self._step_counter += 1
                step = self._step_counter
            else:
                step = int(step)
                self._step_counter = step
            out_flags: list[str] = []
            if first:
                out_flags.append(FLAG_FIRST)
            pending = self._pending
            if pending:
                for name in (FLAG_EVAL, FLAG_SAVE):
                    if name in pending:
                        out_flags.append(name)
                pending.clear()
            obs = self._observer
            if not obs.installed:
                obs.try_install()
            mark = obs.recompile_signal()
            if mark > self._recompile_mark:
                out_flags.append(FLAG_RECOMPILE)
            self._recompile_mark = mark
            if flags:
                for f in flags:
                    f = str(f)
                    if f not in out_flags:
                        out_flags.append(f)
            if not first and FLAG_EVAL not in out_flags and FLAG_SAVE not in out_flags:
                self._dts.append(dt)  # a step that held an evaluation or a save is no step time (R18)
            self._prev_end_perf = now
            self._prev_end_wall = wall
            self._last_step = step
            due = now >= self._next_check
            if due:  # before the write: a removed file must not swallow this event uncounted
                self._check_file()
            if padded_tokens is None and type(batch_size) is int and type(width) is int:
                padded_tokens = batch_size * width
            line = _step_line(wall, step, self.rank, dt, b_wall, tokens, padded_tokens, out_flags, batch_size, width)
            if line is not None:
                self._emit_line(line)
            else:
                self._emit({
                    "v": SCHEMA_VERSION, "kind": KIND_STEP, "t": wall, "step": step, "rank": self.rank, "dt": dt,
                    "step_begin": b_wall, "step_end": wall, "tokens": tokens, "padded_tokens": padded_tokens,
                    "flags": out_flags, "batch_size": batch_size, "width": width,
                })
            if due:
                self._next_check = now + self.check_interval_s
                self._check_dynamo()
        except Exception as e:
            self._internal_error(e)

    def phase(self, name: str, state: str, *, step: int | None = None) -> None:
        """Write a ``phase`` event: ``name`` "save" or "eval", ``state`` "begin" or "end".

        The next step is flagged with ``name`` (its ``dt`` holds the save / evaluation)."""
        if not self.active:
            return
        try:
            if name in PHASE_NAMES:
                self._pending.add(name)
                if state == "begin":
                    self._open_phases.add(name)
                elif state == "end":
                    self._open_phases.discard(name)
            self._emit({
                "v": SCHEMA_VERSION, "kind": KIND_PHASE, "t": time.time(),
                "step": self._last_step if step is None else int(step), "rank": self.rank,
                "name": name, "state": state,
            })
        except Exception as e:
            self._internal_error(e)

    def phase_open(self, name: str) -> bool:
        """True while a ``begin`` of ``name`` has had no ``end``."""
        return name in self._open_phases

    def log(self, logs: Mapping[str, Any], *, step: int | None = None) -> None:
        """Write a ``log`` event holding ``logs`` as given (HF ``on_log`` hands floats).

        A NaN or infinite value is written as Python's ``json`` writes it (``NaN``, ``Infinity``):
        a NaN loss is evidence, and ``json.loads`` reads it back."""
        if not self.active:
            return
        try:
            self._emit({
                "v": SCHEMA_VERSION, "kind": KIND_LOG, "t": time.time(),
                "step": self._last_step if step is None else int(step), "rank": self.rank,
                "logs": dict(logs) if logs is not None else {},
            })
        except Exception as e:
            self._internal_error(e)

    def run_end(self, *, step: int | None = None) -> dict[str, Any] | None:
        """Write ``run_end`` (step-time summary, dynamo counts, dropped events) and return it.

        Returns None when this process writes nothing. Tries one more write when writing was
        disabled, so the drop count reaches the file if the disk has come back."""
        if not self.active:
            self._run_open = False
            return None
        try:
            now = time.perf_counter()
            self._check(now)
            obs = self._observer
            ev = {
                "v": SCHEMA_VERSION, "kind": KIND_RUN_END, "t": time.time(),
                "step": self._last_step if step is None else int(step), "rank": self.rank,
                "step_seconds": step_summary(self._dts),
                "dynamo": {"recompiles": obs.recompiles(), "recompile_limit_hits": obs.recompile_limit_hits()},
                "dropped_events": self.dropped_events,
            }
            self._run_open = False
            self._emit(ev, retry=True)
            self._reset_run_state()
            return ev
        except Exception as e:
            self._internal_error(e)
            return None

    def close(self) -> None:
        """Write ``run_end`` if a run is open, then close the file (a later event reopens it)."""
        if self._run_open:
            self.run_end()
        self.flush()
        self._close_fd()

    def __enter__(self) -> StepTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------
    def _check(self, now: float) -> None:
        """The periodic part: is the events file still ours, and did dynamo change?"""
        self._next_check = now + self.check_interval_s
        self._check_file()
        self._check_dynamo()

    def _check_file(self) -> None:
        """Stop writing when the open file was renamed away or removed.

        A relaunch rotates ``events.jsonl`` to ``events.<stamp>.jsonl``; a process of the old attempt
        that outlived it (a DataLoader worker, an orphaned rank) must not reopen the path and write
        into the NEW attempt's file. Writing stops, later events are counted as dropped, and it is said
        once on stderr.
        """
        if self._fd is not None and not self._disabled:
            try:
                st = os.stat(self.path)  # type: ignore[arg-type]
                fst = os.fstat(self._fd)
                replaced = (st.st_ino, st.st_dev) != (fst.st_ino, fst.st_dev)
            except OSError:
                replaced = True
            if replaced:
                with self._lock:
                    self._flush_locked()  # the steps before it belong to the file they were made for
                self._close_fd()
                self._disable(OSError(f"{self.path} was rotated or removed (a relaunch owns it now); "
                                      "this process stops writing events"))

    def _check_dynamo(self) -> None:
        """Emit a ``dynamo`` event when the counters or the observed counts changed."""
        obs = self._observer
        if not obs.try_install():
            return
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        if counters is None:
            return
        obs.check(counters)
        snap = counters_snapshot(counters)
        if snap is None:
            return
        state = (snap, obs.recompiles(), obs.recompile_limit_hits())
        if state != self._dyn_last:
            self._dyn_last = state
            if not (snap or state[1] or state[2]):
                return  # dynamo loaded but nothing compiled yet: nothing to say
            self._emit({
                "v": SCHEMA_VERSION, "kind": KIND_DYNAMO, "t": time.time(), "step": self._last_step,
                "rank": self.rank, "counters": snap, "recompiles": state[1], "recompile_limit_hits": state[2],
            })

    def _emit(self, ev: dict[str, Any], retry: bool = False) -> bool:
        """Serialise ``ev`` and append it as one line with one write. Never raises."""
        with self._lock:
            if not self._writable_locked() and not retry:
                self.dropped_events += 1
                return False
            try:
                data = (_ENCODER.encode(ev) + "\n").encode("utf-8")
            except (TypeError, ValueError, RecursionError) as e:
                self.dropped_events += 1
                if not self._warned_serialise:
                    self._warned_serialise = True
                    warn(f"dropped a {ev.get('kind')} event that is not JSON-serialisable ({e}); training continues")
                return False
            return self._write_after_buffer(data)

    def _internal_error(self, e: BaseException) -> None:
        if not self._warned_internal:
            self._warned_internal = True
            warn(f"internal error ({type(e).__name__}: {e}); training continues")
