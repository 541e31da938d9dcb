"""Views read the snapshot so that pyright checks every read (ARCHITECTURE.md, "The snapshot").

The snapshot's types (``monitors/snapshot/types.py`` and its two siblings) declare every key, and every key
of a part is always there unless ``NotRequired``. A view that reads a declared key with ``.get("key")``
hedges against an absence the types rule out, and pyright cannot check the read: rename the field and the
view goes on reading ``None`` in silence. So in the views (``tui/``, ``monitors/export/``) a declared,
always-present key is read with ``["key"]``; ``.get`` is left for ``NotRequired`` keys, maps keyed by data
and dicts that are not the snapshot's. A ``.get`` of such a dict whose key happens to be a snapshot key's
name says so on its line: ``# not a snapshot read: <what it reads>``.

``python tools/rename_experiment.py`` measures the result: the share of view reads pyright flags when every
field is renamed.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from stepwatch.monitors.detectors import frozen
from stepwatch.monitors.snapshot import resourcetypes, runmodeltypes, types

REPO_ROOT = Path(__file__).resolve().parents[1]
VIEWS = ["tui", "monitors/export"]
MARK = "# not a snapshot read:"


def always_present_keys() -> set[str]:
    """The keys some snapshot type declares always present and none declares ``NotRequired``."""
    required: set[str] = set()
    optional: set[str] = set()
    for module in (types, resourcetypes, runmodeltypes, frozen):  # liveness.frozen's types live with their detector
        for value in vars(module).values():
            if isinstance(value, type) and typing.is_typeddict(value):
                required |= value.__required_keys__
                optional |= value.__optional_keys__
    return required - optional


def hedged_reads(source: str, keys: set[str]) -> list[tuple[int, str]]:
    """(line, key) of every ``x.get("key", ...)`` in ``source`` whose key is in ``keys``, less the lines
    that carry :data:`MARK`."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(key := node.args[0], ast.Constant) and key.value in keys
                and MARK not in lines[node.lineno - 1]):
            out.append((node.lineno, key.value))
    return sorted(out)


def view_files() -> list[Path]:
    return sorted(p for folder in VIEWS for p in (REPO_ROOT / folder).rglob("*.py"))


def test_the_types_declare_the_keys_the_check_looks_for():
    keys = always_present_keys()
    assert {"step", "stall", "threshold_s", "global_step", "state"} <= keys
    assert "stack" not in keys and "recompiles" not in keys  # NotRequired somewhere: .get is right for them


def test_no_view_reads_an_always_present_snapshot_key_with_get():
    keys = always_present_keys()
    found = [f"{path.relative_to(REPO_ROOT)}:{line} .get({key!r})"
             for path in view_files() for line, key in hedged_reads(path.read_text(), keys)]
    assert not found, ("read these with [...] so that pyright checks them (or, for a dict that is not the "
                       f"snapshot's, say so with {MARK!r} on the line):\n  " + "\n  ".join(found))


def test_the_check_catches_a_planted_hedge():
    keys = always_present_keys()
    planted = 'def f(snap):\n    st = snap["stall"]\n    return st.get("threshold_s") or 0\n'
    assert hedged_reads(planted, keys) == [(3, "threshold_s")]
    marked = 'def f(run):\n    return run.get("state")  # not a snapshot read: run.json\n'
    assert hedged_reads(marked, keys) == []
    optional = 'def f(alert):\n    return alert.get("stack")\n'
    assert hedged_reads(optional, keys) == []


def test_the_renaming_experiment_renames_every_typeddict_field_and_nothing_else():
    """tools/rename_experiment.py's edit, on a planted source: fields of TypedDicts (and of their subclasses)
    get the suffix; a dataclass's fields, a constant and a string do not."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rename_experiment", REPO_ROOT / "tools" / "rename_experiment.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    source = ('from typing import TypedDict\nclass Step(TypedDict):\n    global_step: int | None\n'
              'class Ranked(Step):\n    rank: int\n@dataclass\nclass D:\n    global_step: int\nX: int = 1\n'
              'KEY = "global_step"\n')
    out = tool.renamed(source)
    assert "    global_step_renamed: int | None\n" in out and "    rank_renamed: int\n" in out
    assert "class D:\n    global_step: int\n" in out and "X: int = 1" in out and 'KEY = "global_step"' in out
