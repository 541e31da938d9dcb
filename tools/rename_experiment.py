#!/usr/bin/env python3
"""The renaming experiment: how many of the views' snapshot reads does pyright check?

A read pyright checks is one it flags when the key it names stops existing. So this script copies the
checkout to a temporary directory twice, appends a suffix to every field of the snapshot's types
(``monitors/snapshot/types.py``, ``resourcetypes.py``, ``runmodeltypes.py``, and ``liveness.frozen``'s in
``monitors/detectors/frozen.py``) in one copy, runs pyright
over the views (``tui/``, ``monitors/export/``) in both, and counts the view reads of a declared key
(``x["key"]`` or ``x.get("key")``) on whose line the renamed copy has a new finding naming that key.
A read through ``.get`` or through a value typed ``Any`` is never flagged: that is what it measures.

    python tools/rename_experiment.py            # the figure, and the reads pyright does not check
    python tools/rename_experiment.py --min 90   # exit 1 below 90 % (issue 45's bar)

Standard library only, plus the pyright CLI of the dev extra. About a minute (two pyright runs).
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPES = ["monitors/snapshot/types.py", "monitors/snapshot/resourcetypes.py", "monitors/snapshot/runmodeltypes.py",
         "monitors/detectors/frozen.py"]  # liveness.frozen's types live with their detector
VIEWS = ["tui", "monitors/export"]
SUFFIX = "_renamed"
#: a view's read of a dict that is not the snapshot's, whose key happens to be a snapshot key's name
#: (tests/test_typed_reads.py): not a snapshot read, counted apart
MARK = "# not a snapshot read:"
#: the installed package's folders (pyproject.toml's package-dir): the copy is importable as stepwatch.* through links
PACKAGE = {"tui": "tui", "launcher": "launcher", "monitors": "monitors", "assets": "assets",
           "telemetry": "monitors/telemetry"}

Read = tuple[str, int, str]  # (file, line, key)


def typeddict_fields(source: str) -> list[tuple[int, int, str]]:
    """(line, column, name) of every field of every TypedDict class in ``source`` (a class whose bases
    include ``TypedDict`` or another such class of the same file)."""
    tree = ast.parse(source)
    typed: set[str] = set()
    out: list[tuple[int, int, str]] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
        if "TypedDict" not in bases and not bases & typed:
            continue
        typed.add(node.name)
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out.append((stmt.target.lineno, stmt.target.col_offset, stmt.target.id))
    return out


def renamed(source: str) -> str:
    """``source`` with :data:`SUFFIX` after every TypedDict field's name."""
    lines = source.splitlines(keepends=True)
    for line, col, name in typeddict_fields(source):
        text = lines[line - 1]
        lines[line - 1] = text[:col + len(name)] + SUFFIX + text[col + len(name):]
    return "".join(lines)


def declared_keys(root: Path) -> set[str]:
    return {name for rel in TYPES for _, _, name in typeddict_fields((root / rel).read_text())}


def view_reads(root: Path, keys: set[str]) -> tuple[list[Read], int]:
    """Every ``x["key"]`` and ``x.get("key", ...)`` in the views whose key is a declared field, and the
    number of such reads on lines marked :data:`MARK`, left out."""
    reads: list[Read] = []
    marked = 0
    for folder in VIEWS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = str(path.relative_to(root))
            text = path.read_text()
            lines = text.splitlines()
            for node in ast.walk(ast.parse(text)):
                key: ast.expr | None = None
                if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                    key = node.slice
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                      and node.args):
                    key = node.args[0]
                else:
                    continue
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value in keys:
                    if MARK in lines[node.lineno - 1]:
                        marked += 1
                    else:
                        reads.append((rel, node.lineno, key.value))
    return reads, marked


def copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    pkg = dest / "_pkg" / "stepwatch"
    pkg.mkdir(parents=True)
    for name, folder in PACKAGE.items():
        (pkg / name).symlink_to(dest / folder)
    (pkg / "__init__.py").write_text("")
    config = {"include": VIEWS, "exclude": ["**/__pycache__"], "pythonVersion": "3.11",
              "typeCheckingMode": "standard", "extraPaths": [str(dest / "_pkg")],
              "venvPath": str(Path(sys.prefix).parent), "venv": Path(sys.prefix).name}
    (dest / "pyrightconfig.json").write_text(json.dumps(config))


def findings(root: Path) -> list[tuple[str, int, str]]:
    """(file, line, message) of pyright's errors over the views of the copy at ``root``."""
    pyright = shutil.which("pyright") or str(Path(sys.executable).parent / "pyright")
    r = subprocess.run([pyright, "--outputjson", "-p", str(root / "pyrightconfig.json")], cwd=root,
                       capture_output=True, text=True)
    try:
        diags = json.loads(r.stdout)["generalDiagnostics"]
    except (ValueError, KeyError):
        sys.exit(f"pyright did not run: {r.stderr[-2000:] or r.stdout[-2000:]}")
    return [(str(Path(d["file"]).resolve().relative_to(root.resolve())), d["range"]["start"]["line"] + 1,
             d["message"]) for d in diags if d.get("severity") == "error"]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--min", type=float, default=None, help="exit 1 when fewer than this percent are checked")
    ap.add_argument("--show", type=int, default=40, help="list at most this many unchecked reads")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rename-experiment-") as tmp:
        before, after = Path(tmp) / "before", Path(tmp) / "after"
        for d in (before, after):
            copy_checkout(d)
        for rel in TYPES:
            (after / rel).write_text(renamed((after / rel).read_text()))
        keys = declared_keys(before)
        reads, marked = view_reads(before, keys)
        old = Counter(findings(before))
        new = Counter(findings(after)) - old
    new_by_line: dict[tuple[str, int], list[str]] = {}
    for (f, line, msg) in new:
        new_by_line.setdefault((f, line), []).append(msg)
    checked = [r for r in reads if any(f'"{r[2]}"' in m for m in new_by_line.get((r[0], r[1]), []))]
    unchecked = [r for r in reads if r not in checked]
    share = 100.0 * len(checked) / len(reads) if reads else 100.0
    print(f"renaming experiment: pyright flags {len(checked)} of {len(reads)} view reads of a snapshot key "
          f"({share:.1f} %) in {', '.join(VIEWS)}; {marked} reads of other dicts, marked, left out")
    for f, line, key in unchecked[:args.show]:
        print(f"  unchecked: {f}:{line} {key!r}")
    if len(unchecked) > args.show:
        print(f"  ... and {len(unchecked) - args.show} more")
    if args.min is not None and share < args.min:
        print(f"below {args.min:g} %")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
