"""The supervisor's saved :class:`~monitors.eventfold.EventsFold`: attach without replaying the run.

A 7-hour run writes ~10^5 step events; folding them all again (parse, statistics, fallback
detector) is most of an attach. The supervisor lives as long as the run: it folds events.jsonl as
it grows, with the very code a view uses, and every ``SAVE_EVERY_S`` and once the run has ended
writes ``events.state.json`` beside it: the fold's state, and where in events.jsonl it stands. A view
then loads that state and reads only the lines after it (``RunObserver.refresh``).

The state is trusted only when everything it stands on still holds, else it is refused (the view
then folds from byte 0, as without a state, and ``status --json`` says why in
``events.resume.refused``):

* ``code``: a SHA-256 of the source of the modules whose objects it holds (eventfold, eventtail,
  detectors, stepstats, this one): stepwatch upgraded meanwhile means refused;
* ``attempt``: run.json's (attempt, launched_at_unix);
* ``events``: the SHA-256 of the first ``offset`` bytes of events.jsonl as the supervisor read
  them, checked against the file by hashing those bytes again (:meth:`EventReader.resume`);
* the objects themselves: JSON, never a pickle (a run dir may belong to another user). Only the
  classes in ``_CLASSES`` are made, each with exactly the attributes a fresh one has.

The format: every value is JSON; a float is a JSON number (``NaN``/``Infinity`` as Python's json
writes them, which round-trips every float exactly, -0.0 included); anything else is an object
with one tag: ``{"L": [...]}`` list, ``{"T": [...]}`` tuple, ``{"Q": [...], "m": maxlen}`` deque,
``{"D": [[k, v], ...]}`` dict (keys may be numbers), ``{"S": [...]}`` set, ``{"SL": [...]}``
SortedList, ``{"O": class, "f": fields}`` object, and ``{"R": n}`` for an object met before (``"#":
n`` marks its first place): objects shared between containers (the detector's slow-step records)
stay shared.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from sortedcontainers import SortedList

from monitors.detectors import FallbackDetector, _Baseline, _Slow
from monitors.eventfold import EventsFold
from monitors.eventtail import EventReader
from monitors.runfiles import EVENTS_JSONL, EVENTS_STATE, RUN_JSON, read_json, write_json_atomic
from monitors.stepstats import StepRecord, StepStats

FORMAT = 1
#: How often the supervisor saves (seconds); an attach reads at most this much of the run's end.
SAVE_EVERY_S = 30.0
#: The supervisor waits at least this many times the cost of its last save before the next one
#: (a 100,000-step state costs ~0.2 s to save: 30 s apart, under 1 % of a core).
SAVE_COST_SHARE = 100.0
#: A saved state bigger than this is refused unread (100,000 steps make ~1.6 MB).
MAX_STATE_BYTES = 256 * 1024 * 1024
#: A half-written last line longer than this (bytes) is not saved; the next save will have it whole.
MAX_CARRY_BYTES = 1024 * 1024

# class name -> (class, a fresh instance's attribute names or None for slots classes)
_CLASSES: dict[str, tuple[type, Callable[[], Any] | None]] = {
    "EventsFold": (EventsFold, EventsFold),
    "StepStats": (StepStats, StepStats),
    "StepRecord": (StepRecord, None),
    "FallbackDetector": (FallbackDetector, FallbackDetector),
    "_Baseline": (_Baseline, lambda: _Baseline(1)),
    "_Slow": (_Slow, None),
}
_MODULES = ("monitors.eventfold", "monitors.eventtail", "monitors.detectors", "monitors.stepstats", __name__)
_code_digest: str | None = None
_fields_cache: dict[str, tuple[str, ...]] = {}


class StateError(ValueError):
    """A saved state that cannot be read back: malformed, an unknown class, attributes that are
    not the class's own."""


def code_digest() -> str:
    """SHA-256 (hex) of the source files of the modules whose objects a saved state holds."""
    global _code_digest
    if _code_digest is None:
        import importlib  # noqa: PLC0415

        h = hashlib.sha256()
        for name in _MODULES:
            h.update(Path(importlib.import_module(name).__file__ or name).read_bytes())
        _code_digest = h.hexdigest()
    return _code_digest


def _fields(name: str) -> tuple[str, ...]:
    """The attribute names an instance of ``_CLASSES[name]`` has, in a fixed order."""
    f = _fields_cache.get(name)
    if f is None:
        cls, fresh = _CLASSES[name]
        if fresh is None:
            f = tuple(s for c in reversed(cls.__mro__) for s in getattr(c, "__slots__", ()))
        else:
            f = tuple(vars(fresh()))
        _fields_cache[name] = f
    return f


# ----------------------------------------------------------------------------------------------------
# encoding

_PLAIN = (type(None), bool, int, float, str)


def encode(obj: Any) -> Any:
    """``obj`` as a JSON-ready value (see the module docstring). Raises StateError for a value of a
    type the format does not carry."""
    memo: dict[int, int] = {}
    return _enc(obj, memo)


def _enc(o: Any, memo: dict[int, int]) -> Any:
    t = type(o)
    if t in _PLAIN:
        return o
    if t is tuple:
        return {"T": [_enc(x, memo) for x in o]}
    ref = memo.get(id(o))
    if ref is not None:
        return {"R": ref}
    n = memo[id(o)] = len(memo)
    if t is list:
        return {"L": _items(o, memo), "#": n}
    if t is deque:
        return {"Q": _items(o, memo), "m": o.maxlen, "#": n}
    if t is dict:
        return {"D": [[_enc(k, memo), _enc(v, memo)] for k, v in o.items()], "#": n}
    if t is set:
        return {"S": _items(o, memo), "#": n}
    if t is SortedList:
        return {"SL": _items(o, memo), "#": n}
    name = t.__name__
    if _CLASSES.get(name, (None,))[0] is not t:
        raise StateError(f"cannot save a {t.__module__}.{t.__qualname__}")
    fields = _fields(name)
    if _CLASSES[name][1] is None:
        return {"O": name, "f": [_enc(getattr(o, k), memo) for k in fields], "#": n}
    d = vars(o)
    return {"O": name, "f": {k: _enc(d[k], memo) for k in fields}, "#": n}


def _items(seq: Any, memo: dict[int, int]) -> list[Any]:
    out = list(seq)
    for i, x in enumerate(out):  # most lists hold only floats: copied as they are
        if type(x) not in _PLAIN:
            out[i] = _enc(x, memo)
    return out


# ----------------------------------------------------------------------------------------------------
# decoding

def decode(node: Any) -> Any:
    """The value :func:`encode` made ``node`` from. Raises StateError for anything else."""
    try:
        return _dec(node, {})
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise StateError(f"malformed saved state: {type(e).__name__}: {e}") from None


def _dec(n: Any, objs: dict[int, Any]) -> Any:
    if type(n) is not dict:
        if type(n) is list:
            raise StateError("a bare list in a saved state")
        return n
    if "R" in n:
        return objs[n["R"]]
    if "T" in n:
        return tuple(_dec_items(n["T"], objs))
    i = n["#"]
    if type(i) is not int or i in objs:
        raise StateError(f"bad object number {i!r}")
    if "L" in n:
        lst: list[Any] = []
        objs[i] = lst
        lst.extend(_dec_items(n["L"], objs))
        return lst
    if "Q" in n:
        m = n["m"]
        if m is not None and (type(m) is not int or m < 0):
            raise StateError(f"bad deque maxlen {m!r}")
        q: deque[Any] = deque(maxlen=m)
        objs[i] = q
        q.extend(_dec_items(n["Q"], objs))
        return q
    if "D" in n:
        d: dict[Any, Any] = {}
        objs[i] = d
        for k, v in n["D"]:
            d[_dec(k, objs)] = _dec(v, objs)
        return d
    if "S" in n:
        s: set[Any] = set()
        objs[i] = s
        s.update(_dec_items(n["S"], objs))
        return s
    if "SL" in n:
        sl = SortedList()
        objs[i] = sl
        sl.update(_dec_items(n["SL"], objs))
        return sl
    name = n["O"]
    if name not in _CLASSES:
        raise StateError(f"a saved state may not make a {name!r}")
    cls, fresh = _CLASSES[name]
    fields = _fields(name)
    o = cls.__new__(cls)
    objs[i] = o
    f = n["f"]
    if fresh is None:
        if type(f) is not list or len(f) != len(fields):
            raise StateError(f"a saved {name} has the wrong fields")
        for k, v in zip(fields, f):
            object.__setattr__(o, k, _dec(v, objs))  # frozen dataclasses too
    else:
        if type(f) is not dict or set(f) != set(fields):
            raise StateError(f"a saved {name} has the wrong fields")
        vars(o).update((k, _dec(v, objs)) for k, v in f.items())
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
    write_json_atomic(Path(run_dir) / EVENTS_STATE, doc, indent=None)
    return True


def load(run_dir: Path, attempt_key: tuple[Any, Any], reader: EventReader) -> tuple[EventsFold | None, dict[str, Any] | None]:
    """The saved fold for this attempt, with ``reader`` (fresh) moved to where the fold stands.

    Returns ``(fold, resume)``: ``resume`` is None when there is no saved state, else the snapshot's
    ``events.resume`` object ``{"file", "from_offset", "from_line", "refused"}``: from_offset /
    from_line where reading continued, or ``refused`` (why the state was not used; fold None,
    reader untouched). Raises nothing."""
    path = Path(run_dir) / EVENTS_STATE
    info: dict[str, Any] = {"file": EVENTS_STATE, "from_offset": None, "from_line": None, "refused": None}
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_STATE_BYTES:
                info["refused"] = f"{size} bytes, more than the {MAX_STATE_BYTES} a saved state may have"
                return None, info
            raw = f.read()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        info["refused"] = f"unreadable: {e.strerror or e}"
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

    Never raises: a failure is logged once (``log``) and the loop ends; a view then folds from
    byte 0 as it would without a saved state.
    """
    run_dir = Path(run_dir)
    reader = EventReader(run_dir / EVENTS_JSONL, digest=True)
    fold = EventsFold()
    saved_at = -1
    wait_s = every_s
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
            if reader.exists and reader.offset != saved_at and save(run_dir, fold, reader, attempt_key):
                saved_at = reader.offset
                # a long run's state is MBs: never spend more than 1/SAVE_COST_SHARE of the time saving
                wait_s = max(every_s, (time.monotonic() - t0) * SAVE_COST_SHARE)
            if last:
                return
    except Exception as e:  # never take the supervisor down; views fold from byte 0 instead
        if log is not None:
            log(f"events state not saved any more: {type(e).__name__}: {e}")
    finally:
        reader.close()
