"""The supervisor's saved :class:`~stepwatch.monitors.fold.events.EventsFold`: attach without replaying the run.

A 7-hour run writes ~10^5 step events; folding them all again (parse, statistics, fallback
detector) is most of an attach. The supervisor lives as long as the run: it folds events.jsonl as
it grows, with the very code a view uses, and every ``SAVE_EVERY_S`` and once the run has ended
writes ``events.state.json`` beside it: the fold's state, and where in events.jsonl it stands. A view
then loads that state and reads only the lines after it (``RunObserver.refresh``).

The state is trusted only when everything it stands on still holds, else it is refused (the view
then folds from byte 0, as without a state, and ``status --json`` says why in
``events.resume.refused``):

* ``code``: a SHA-256 of the source of the modules whose objects it holds or whose rules made them
  (fold.events, .stepcolumns and .records, readers.jsonl, detectors.fallback, .fallbackstate, .baseline and .steadyspan,
  stats.stepstats, .stepstate, .stepbacklog and .nearest_rank, protocol, this one...): stepwatch upgraded meanwhile
  means refused (and ``FORMAT`` says when the layout itself changed);
* ``attempt``: run.json's (attempt, launched_at_unix);
* ``events``: the SHA-256 of the first ``offset`` bytes of events.jsonl as the supervisor read
  them, checked against the file by hashing those bytes again (:meth:`EventReader.resume`);
* the file: a regular file of the viewer's own user that no one else may write (the supervisor
  saves it 0644). The state is trusted, not re-derived, so another user's is never used: their
  runs are folded line by line, which is always right (a crafted state could make a view slow);
* the objects themselves: JSON, never a pickle. Only the classes in ``_CLASSES`` are made, each
  with exactly the attributes a fresh one has, each of its type, windows of their length. The fallback
  detector, its baselines and the step statistics are saved as their explicit state (``to_state()``, a
  dataclass of named fields) and made again with ``from_state()``: their private attributes are no format.

The format: every value is JSON; a float is a JSON number (``NaN``/``Infinity`` as Python's json
writes them, which round-trips every float exactly, -0.0 included); anything else is an object
with one tag: ``{"L": [...]}`` list, ``{"T": [...]}`` tuple, ``{"Q": [...], "m": maxlen}`` deque,
``{"D": [[k, v], ...]}`` dict (keys may be numbers), ``{"S": [...]}`` set, ``{"O": class, "f": fields}``
object, ``{"J": value}`` a record read from events.jsonl kept as it was. The slotted records (a slow
step, a StepRecord) sit in several windows at once: each is written once with ``"#": n`` and then
referred to as ``{"R": n}``, so they stay shared.
Nothing else may be shared, so a state read back is a tree the size of its file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import stat
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.detectors.baseline import Baseline, BaselineState
from stepwatch.monitors.detectors.fallback import FallbackDetector
from stepwatch.monitors.detectors.fallbackstate import FallbackState, SlowStep
from stepwatch.monitors.detectors.losshealth import LossHealth
from stepwatch.monitors.detectors.scaling import ScalingFit
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.fold.statecheck import RESTORED_CHECKS, StateError
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.runfiles import EVENTS_JSONL, EVENTS_STATE, RUN_JSON, open_regular, read_json, write_json_atomic
from stepwatch.monitors.stats.minmax import Bin, MinMaxSeries
from stepwatch.monitors.stats.stepstate import StepStatsState
from stepwatch.monitors.stats.stepstats import StepRecord, StepStats

FORMAT = 4  # 2: a slow step says whether its interval was busy but silent (issue 32); 3: explicit states (issue 45);
# 4: the loss's health (issue 47)
#: How often the supervisor saves (seconds); an attach reads at most this much of the run's end.
SAVE_EVERY_S = 30.0
#: The supervisor waits at least this many times the cost of its last save before the next one
#: (a 100,000-step state costs ~0.2 s to save: 30 s apart, under 1 % of a core).
SAVE_COST_SHARE = 100.0
#: A saved state bigger than this is refused unread (100,000 steps make ~1.6 MB; reading one back
#: takes 14-50x its size in memory, measured: most for a file of tiny objects).
MAX_STATE_BYTES = 64 * 1024 * 1024
#: A half-written last line longer than this (bytes) is not saved; the next save will have it whole.
MAX_CARRY_BYTES = 1024 * 1024

# class name -> (class, a factory of a fresh instance, or None for the slotted records)
_CLASSES: dict[str, tuple[type, Callable[[], Any] | None]] = {
    "EventsFold": (EventsFold, EventsFold),
    "StepStats": (StepStats, StepStats),
    "FallbackDetector": (FallbackDetector, FallbackDetector),
    "BaselineState": (BaselineState, lambda: Baseline(1)),
    "StepRecord": (StepRecord, None), "SlowStep": (SlowStep, None),
    "MinMaxSeries": (MinMaxSeries, MinMaxSeries),
    "ScalingFit": (ScalingFit, ScalingFit), "LossHealth": (LossHealth, LossHealth),
    "Bin": (Bin, None),
}
#: classes saved as their explicit state: name -> the state's dataclass, and the class's from_state
_STATEFUL: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "StepStats": (StepStatsState, StepStats.from_state), "FallbackDetector": (FallbackState, FallbackDetector.from_state),
    "BaselineState": (BaselineState, lambda st: st)}
_NUM = (int, float)
_MAX_INT = 2**53  # an int a state holds (a step, a token count) is one a float holds exactly
_OPT_INT = (int, type(None))
_OPT_NUM = (int, float, type(None))
#: The slotted records, the only objects a state may hold twice (the detector's slow-step records
#: sit in several windows at once; StepStats' records in its recent and window deques), and the
#: types of their fields, in slot order (bool is never taken for an int).
_RECORD_FIELDS: dict[str, tuple[tuple[type, ...], ...]] = {
    "SlowStep": (_OPT_INT, _NUM, _NUM, _NUM, (bool,)),
    "StepRecord": (_OPT_INT, _NUM, (tuple,), _OPT_INT, _OPT_INT, _OPT_NUM, (bool,)),
    "Bin": (_OPT_INT, _OPT_INT, _OPT_NUM, _OPT_NUM, _NUM, (int,), (int,)),
}
#: Attributes holding a value read from events.jsonl as it was (a JSON tree): saved as JSON, unwalked.
_RAW_FIELDS = {"EventsFold": frozenset({"run_start", "run_end", "dynamo_ev", "last_step", "open_phase", "last_logs"})}
_MODULES = ("stepwatch.monitors.fold.events", "stepwatch.monitors.readers.jsonl", "stepwatch.monitors.detectors.fallback", "stepwatch.monitors.detectors.baseline", "stepwatch.monitors.detectors.scaling", "stepwatch.monitors.detectors.losshealth",
            "stepwatch.monitors.stats.stepstats", "stepwatch.monitors.stats.nearest_rank", "stepwatch.monitors.stats.minmax", "stepwatch.monitors.protocol", "stepwatch.monitors.fold.statecheck",
            # the backlog's ways to the same state (ARCHITECTURE.md, "Attach: one optimisation")
            "stepwatch.monitors.fold.stepcolumns", "stepwatch.monitors.fold.records", "stepwatch.monitors.detectors.steadyspan",
            "stepwatch.monitors.stats.stepbacklog", "stepwatch.monitors.detectors.fallbackstate",
            "stepwatch.monitors.stats.stepstate", __name__)
_fields_cache: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}


@functools.cache
def code_digest() -> str:
    """SHA-256 (hex) of the source files of the modules whose objects a saved state holds, read
    when this module is first asked (the supervisor asks as it starts following)."""
    h = hashlib.sha256()
    for name in _MODULES:
        mod = sys.modules.get(name) or importlib.import_module(name)
        h.update(Path(mod.__file__ or name).read_bytes())
    return h.hexdigest()


def _values(name: str, o: Any) -> dict[str, Any]:
    """What is saved of ``o``, a ``_CLASSES[name]``: its explicit state's fields, else its attributes."""
    if name not in _STATEFUL:
        return vars(o)
    st = o if type(o) is BaselineState else o.to_state()
    return {k: getattr(st, k) for k in st.__dataclass_fields__}


def _fields(name: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The attribute names of ``_CLASSES[name]`` in a fixed order, and a fresh instance's values
    ({} for the slotted records)."""
    f = _fields_cache.get(name)
    if f is None:
        cls, fresh = _CLASSES[name]
        if fresh is None:
            f = (tuple(s for c in reversed(cls.__mro__) for s in getattr(c, "__slots__", ())), {})
        else:
            v = _values(name, fresh())
            f = (tuple(v), v)
        _fields_cache[name] = f
    return f


# ----------------------------------------------------------------------------------------------------
# encoding

_PLAIN = (type(None), bool, int, float, str)


def encode(obj: Any) -> Any:
    """``obj`` as a JSON-ready value (see the module docstring). Raises StateError for a value of a
    type the format does not carry, or a container held in two places (it would come back as two)."""
    return _enc(obj, {}, set())


def _enc(o: Any, memo: dict[int, int], seen: set[int]) -> Any:
    t = type(o)
    if t in _PLAIN:
        return o
    if t is tuple:
        return {"T": _items(o, memo, seen)}
    name = t.__name__
    if name in _RECORD_FIELDS and _CLASSES[name][0] is t:
        ref = memo.get(id(o))
        if ref is not None:
            return {"R": ref}
        n = memo[id(o)] = len(memo)
        return {"O": name, "f": [_enc(getattr(o, k), memo, seen) for k in _fields(name)[0]], "#": n}
    if id(o) in seen:
        raise StateError(f"a {name} is held in two places")
    seen.add(id(o))
    if t is list:
        return {"L": _items(o, memo, seen)}
    if t is deque:
        return {"Q": _items(o, memo, seen), "m": o.maxlen}
    if t is dict:
        return {"D": [[_enc(k, memo, seen), _enc(v, memo, seen)] for k, v in o.items()]}
    if t is set:
        return {"S": _items(o, memo, seen)}
    if _CLASSES.get(name, (None,))[0] is not t:
        raise StateError(f"cannot save a {t.__module__}.{t.__qualname__}")
    d = _values(name, o)
    raw = _RAW_FIELDS.get(name, ())
    return {"O": name, "f": {k: {"J": d[k]} if k in raw else _enc(d[k], memo, seen) for k in _fields(name)[0]}}


def _items(seq: Any, memo: dict[int, int], seen: set[int]) -> list[Any]:
    out = list(seq)
    for i, x in enumerate(out):  # most lists hold only floats: copied as they are
        if type(x) not in _PLAIN:
            out[i] = _enc(x, memo, seen)
    return out


# ----------------------------------------------------------------------------------------------------
# decoding

def decode(node: Any) -> Any:
    """The value :func:`encode` made ``node`` from. Raises StateError for anything else: every
    object made is checked (its attributes are its class's own, each of the type a fresh instance
    holds), and nothing is held twice but the slotted records, so what comes back is a tree of the
    size of the file (no cycles, no shared containers)."""
    try:
        return _dec(node, {})
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, MemoryError) as e:
        raise StateError(f"malformed saved state: {type(e).__name__}: {e}") from None


def _dec(n: Any, objs: dict[int, Any]) -> Any:
    if type(n) is not dict:
        if type(n) is list:
            raise StateError("a bare list in a saved state")
        return n
    if "T" in n:
        return tuple(_dec_items(n["T"], objs))
    if "L" in n:
        return _dec_items(n["L"], objs)
    if "Q" in n:
        m = n["m"]
        if m is not None and (type(m) is not int or not 0 <= m <= 1 << 24):
            raise StateError(f"bad deque maxlen {m!r}")
        return deque(_dec_items(n["Q"], objs), maxlen=m)
    if "D" in n:
        return {_dec(k, objs): _dec(v, objs) for k, v in n["D"]}
    if "S" in n:
        return set(_dec_items(n["S"], objs))
    if "R" in n:
        o = objs.get(n["R"]) if type(n["R"]) is int else None
        if o is None:
            raise StateError(f"a reference to no record: {n['R']!r}")
        return o
    name = n["O"]
    if name not in _CLASSES:
        raise StateError(f"a saved state may not make a {name!r}")
    cls, _ = _CLASSES[name]
    fields, fresh = _fields(name)
    o = object.__new__(cls) if name not in _STATEFUL else None
    f = n["f"]
    kinds = _RECORD_FIELDS.get(name)
    if kinds is not None:
        i = n["#"]
        if type(i) is not int or i in objs:
            raise StateError(f"bad record number {i!r}")
        if type(f) is not list or len(f) != len(fields):
            raise StateError(f"a saved {name} has the wrong fields")
        for k, kind, v in zip(fields, kinds, f):
            v = _dec(v, objs)
            if (type(v) not in kind or (type(v) is int and not -_MAX_INT < v < _MAX_INT)
                    or (k == "flags" and not all(type(x) is str for x in v))):
                raise StateError(f"a saved {name}.{k} is a {type(v).__name__} ({str(v)[:40]})")
            object.__setattr__(o, k, v)  # frozen dataclasses too
        objs[i] = o
        return o
    if type(f) is not dict or set(f) != set(fields):
        raise StateError(f"a saved {name} has the wrong fields")
    raw = _RAW_FIELDS.get(name, ())
    d: dict[str, Any] = vars(o) if o is not None else {}
    for k, v in f.items():
        if k in raw:
            if type(v) is not dict or set(v) != {"J"}:
                raise StateError(f"a saved {name}.{k} is not a value read from events.jsonl")
            d[k] = v["J"]  # a JSON tree as json.loads made it
            continue
        v = d[k] = _dec(v, objs)
        want = fresh[k]
        if want is None:
            if (type(v) not in _OPT_NUM and type(v) is not SlowStep) or (type(v) is int and not -_MAX_INT < v < _MAX_INT):
                raise StateError(f"a saved {name}.{k} is a {type(v).__name__} ({str(v)[:40]})")
        elif type(v) is not type(want):
            raise StateError(f"a saved {name}.{k} is a {type(v).__name__}, not a {type(want).__name__}")
        elif type(v) is deque and v.maxlen != want.maxlen:
            raise StateError(f"a saved {name}.{k} keeps {v.maxlen} items, not {want.maxlen}")
    if o is None:  # made from its explicit state, checked first
        state_cls, from_state = _STATEFUL[name]
        st = state_cls(**d)
        RESTORED_CHECKS[name](st)
        return from_state(st)
    check = RESTORED_CHECKS.get(name)
    if check is not None:
        check(o)
    return o


def _dec_items(items: list[Any], objs: dict[int, Any]) -> list[Any]:
    if type(items) is not list:
        raise StateError("a container's items are not a list")
    out = list(items)
    for j, x in enumerate(out):
        if type(x) is dict or type(x) is list:
            out[j] = _dec(x, objs)
    return out


# ----------------------------------------------------------------------------------------------------
# the file

def _attempt_key(run_dir: Path) -> tuple[Any, Any]:
    run = read_json(run_dir / RUN_JSON) or {}
    return (run.get("attempt"), run.get("launched_at_unix"))


def save(run_dir: Path, fold: EventsFold, reader: EventReader, attempt_key: tuple[Any, Any]) -> bool:
    """Write ``<run_dir>/events.state.json`` (atomically) from ``fold`` and the ``reader`` that fed
    it (made with ``digest=True``). ``attempt_key`` is run.json's (attempt, launched_at_unix).
    Returns False, writing nothing, while a half-written line longer than MAX_CARRY_BYTES is
    pending. Raises OSError when the directory is not writable, StateError for a state this format
    cannot carry."""
    pos = reader.position()
    if len(pos["carry"]) > MAX_CARRY_BYTES:
        return False
    doc = {"v": FORMAT, "what": "stepwatch: the supervisor's fold of events.jsonl, for a quick attach",
           "code": code_digest(), "attempt": list(attempt_key), "saved_at_unix": time.time(),
           "events": pos, "state": encode(fold)}
    try:
        # readable by all (views of other users fold every line anyway), writable by the owner only:
        # a view uses only a state of its own user that no one else could have changed (see load)
        write_json_atomic(Path(run_dir) / EVENTS_STATE, doc, indent=None, mode=0o644)
    except (TypeError, ValueError, RecursionError) as e:  # a record read from the file json cannot write back
        raise StateError(f"cannot write the state as JSON: {type(e).__name__}: {e}") from None
    return True


def _read_own_file(path: Path) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most MAX_STATE_BYTES that belongs to the
    user reading it and only that user may write. A saved state is trusted, not re-derived: one
    written by someone else (a run dir is shared, a file crafted to be absurd or slow to use) is
    never used; that user's runs are folded line by line instead, which is always right. Opened
    without blocking (a FIFO in its place would hang the view). Raises FileNotFoundError, OSError,
    StateError (why it is not used)."""
    fd = open_regular(path)
    if fd is None:
        raise StateError("not a regular file")
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise StateError(f"written by uid {st.st_uid} or writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                             f"only a state of your own is used")
        if st.st_size > MAX_STATE_BYTES:
            raise StateError(f"{st.st_size} bytes, more than the {MAX_STATE_BYTES} a saved state may have")
        chunks, left = [], MAX_STATE_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 24))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        if left <= 0:
            raise StateError(f"more than the {MAX_STATE_BYTES} bytes a saved state may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def refused(why: str | None) -> dict[str, Any]:
    """The snapshot's ``events.resume`` object for a saved state not used, and ``why``."""
    return {"file": EVENTS_STATE, "from_offset": None, "from_line": None, "refused": why}


def load(run_dir: Path, attempt_key: tuple[Any, Any], reader: EventReader) -> tuple[EventsFold | None, dict[str, Any] | None]:
    """The saved fold for this attempt, with ``reader`` (fresh) moved to where the fold stands.

    Returns ``(fold, resume)``: ``resume`` is None when there is no saved state, else the snapshot's
    ``events.resume`` object ``{"file", "from_offset", "from_line", "refused"}``: from_offset /
    from_line where reading continued, or ``refused`` (why the state was not used; fold None,
    reader untouched). Raises nothing."""
    path = Path(run_dir) / EVENTS_STATE
    info = refused(None)
    try:
        raw = _read_own_file(path)
    except FileNotFoundError:
        return None, None
    except (OSError, StateError) as e:
        info["refused"] = str(e) if isinstance(e, StateError) else f"unreadable: {e.strerror or e}"
        return None, info
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        info["refused"] = f"not JSON: {e}"
        return None, info
    why = None
    if type(doc) is not dict or doc.get("v") != FORMAT:
        why = f"format {doc.get('v') if type(doc) is dict else None!r}, this stepwatch reads {FORMAT}"
    elif doc.get("code") != code_digest():
        why = "saved by another version of stepwatch"
    elif doc.get("attempt") != list(attempt_key):
        why = f"saved for attempt {doc.get('attempt')!r}, run.json is attempt {list(attempt_key)!r}"
    if why is None:
        try:
            fold = decode(doc.get("state"))
            if type(fold) is not EventsFold:
                raise StateError("the saved state is not an EventsFold")
        except (StateError, RecursionError) as e:
            why = str(e) if not isinstance(e, RecursionError) else "nested too deep"
    if why is None:
        why = reader.resume(doc.get("events") if type(doc.get("events")) is dict else {})
    if why is not None:
        info["refused"] = why
        return None, info
    info["from_offset"], info["from_line"] = reader.offset, reader.lines_read
    return fold, info


def follow(run_dir: Path, attempt_key: tuple[Any, Any], done: threading.Event,
           every_s: float = SAVE_EVERY_S, log: Callable[[str], None] | None = None) -> None:
    """The supervisor's loop: fold events.jsonl every ``every_s`` seconds (or SAVE_COST_SHARE times
    the last save's cost, if longer) and save what changed; once ``done`` is set (the child has
    ended), fold and save one last time and return. Stops saving for good when events.jsonl is
    replaced or truncated, or run.json names another attempt (a relaunch rotated the files).

    Never raises. A save that fails (a full disk, a record json cannot write back) is logged once
    per reason (``log``) and tried again at the next round; the last good save stays, and a view
    reads a longer tail after it. Any other failure is logged and ends the loop: views then fold
    from byte 0, as without a saved state.
    """
    run_dir = Path(run_dir)
    code_digest()  # of the source as it is when the supervisor starts, not 30 s later
    reader = EventReader(run_dir / EVENTS_JSONL, digest=True)
    fold = EventsFold()
    saved_at = -1
    wait_s = every_s
    failed: set[str] = set()
    try:
        while True:
            last = done.wait(wait_s)
            fold.fold(reader)
            if reader.restarted or _attempt_key(run_dir) != tuple(attempt_key):
                # events.jsonl was replaced (a relaunch rotated it) or truncated: what the path names
                # now is not this attempt's file, and events.state.json is not ours to write any more
                if log is not None:
                    log("events state: events.jsonl or run.json changed under this attempt; no more saves")
                return
            t0 = time.monotonic()
            if reader.exists and reader.offset != saved_at:
                try:
                    if save(run_dir, fold, reader, attempt_key):
                        saved_at = reader.offset
                except (OSError, StateError) as e:
                    why = f"events state not saved: {type(e).__name__}: {e}"
                    if why not in failed and log is not None:
                        log(why + " (tried again at each round; said once)")
                    failed.add(why)
                # a long run's state is MBs: never spend more than 1/SAVE_COST_SHARE of the time saving
                wait_s = max(every_s, (time.monotonic() - t0) * SAVE_COST_SHARE)
            if last:
                return
    except Exception as e:  # never take the supervisor down; views fold from byte 0 instead
        if log is not None:
            log(f"events state not saved any more: {type(e).__name__}: {e}")
    finally:
        reader.close()
