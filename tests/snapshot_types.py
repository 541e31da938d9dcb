"""The walker that holds a real status snapshot against its declared types
(:mod:`stepwatch.monitors.snapshot.types`): every key present is declared, every required key is
there, and each value has a JSON type its declaration allows.

Used by the unit tier (tests/test_snapshot_types.py, snapshots built in-process) and by the system
tests that produce a real ``status --json`` (a demo run, a torchrun run, a Slurm run).
"""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

from stepwatch.monitors.snapshot.model import json_safe
from stepwatch.monitors.snapshot.types import Snapshot


def as_printed(snap: Any) -> Any:
    """The snapshot as ``status --json`` prints it (json_safe, then JSON and back)."""
    return json.loads(json.dumps(json_safe(snap), default=str, allow_nan=False))


def _is_json(v: Any) -> bool:
    if v is None or type(v) in (str, int, float, bool):
        return True
    if type(v) is list:
        return all(_is_json(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _is_json(x) for k, x in v.items())
    return False


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def problems(value: Any, tp: Any = Snapshot, path: str = "snapshot") -> list[str]:
    """Where ``value`` (a JSON value, as printed) departs from the declared type ``tp``: an
    undeclared key, a missing required key, a value of a JSON type the declaration does not allow.
    Empty when it all holds."""
    if tp is Any:
        return [] if _is_json(value) else [f"{path}: not a JSON value: {value!r:.80}"]
    if tp is None or tp is type(None):
        return [] if value is None else [f"{path}: {value!r:.80} where null is declared"]
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        found = [problems(value, t, path) for t in get_args(tp)]
        if any(not p for p in found):
            return []
        # report against the member of the value's own kind (an object against the TypedDict)
        kinds = [p for t, p in zip(get_args(tp), found, strict=True) if _same_kind(value, t)]
        return (kinds or found)[0]
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{path}: {value!r:.80} is none of {get_args(tp)}"]
    if is_typeddict(tp):
        if type(value) is not dict:
            return [f"{path}: {type(value).__name__} where an object ({_name(tp)}) is declared"]
        hints = get_type_hints(tp)
        out = [f"{path}.{k}: key not declared in {_name(tp)}" for k in value if k not in hints]
        out += [f"{path}.{k}: required key of {_name(tp)} missing" for k in tp.__required_keys__ if k not in value]
        for k, v in value.items():
            if k in hints:
                out += problems(v, hints[k], f"{path}.{k}")
        return out
    if origin is list:
        if type(value) is not list:
            return [f"{path}: {type(value).__name__} where a list is declared"]
        (item,) = get_args(tp)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{path}[{i}]")]
    if origin is dict:
        if type(value) is not dict:
            return [f"{path}: {type(value).__name__} where an object is declared"]
        _, item = get_args(tp)
        return [p for k, v in value.items() for p in problems(v, item, f"{path}[{k!r}]")]
    if tp is bool:
        return [] if type(value) is bool else [f"{path}: {value!r:.80} where a bool is declared"]
    if tp is int:
        return [] if type(value) is int else [f"{path}: {value!r:.80} where an int is declared"]
    if tp is float:  # JSON has one number type: an int where a float is declared is fine
        return [] if type(value) in (int, float) else [f"{path}: {value!r:.80} where a number is declared"]
    if tp is str:
        return [] if type(value) is str else [f"{path}: {value!r:.80} where a string is declared"]
    return [f"{path}: the walker does not know the declared type {tp!r}"]


def _same_kind(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if is_typeddict(tp) or origin is dict:
        return type(value) is dict
    if origin is list:
        return type(value) is list
    return False


def assert_declared(snap: Any) -> None:
    """Fail, naming each place, unless every key of ``snap`` (a snapshot dict, or the parsed output
    of ``status --json``) is declared in :class:`Snapshot` and each value fits its declaration."""
    found = problems(as_printed(snap))
    assert not found, "the snapshot departs from its declared types:\n" + "\n".join(found[:40])


__all__ = ["as_printed", "assert_declared", "problems"]
