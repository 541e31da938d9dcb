#!/usr/bin/env python3
"""Run pyright over the checkout and hold its findings to a ratchet: a file's count may only fall.

pyright is configured in pyproject.toml (`[tool.pyright]`: the folders, Python 3.11, the venv at
.venv). This script runs it once (`pyright --outputjson`), counts the errors per file and compares
them with tools/typecheck-baseline.json, the committed count per file:

* exit 1 when any file has more errors than its baseline (a file not in the baseline has 0), and
  print that file's findings;
* exit 1 when any import does not resolve (reportMissingImports, or an attribute pyright cannot
  find on a stepwatch.* module), whatever the baseline says: the checkout must be installed in
  strict editable mode, and reinstalled after a module is added:
      python -m pip install -e ".[train,test,dev]" --config-settings editable_mode=strict
* exit 0 otherwise; when a file's count fell, say so: `--update` then lowers the baseline.

`--update` rewrites the baseline with today's counts, only ever downward; `--update --force`
writes them even where they rose (say why in the commit). `--from-json FILE` reads a saved
`pyright --outputjson` instead of running pyright. Exit 2: pyright could not run.

Standard library only, plus the pyright CLI (`pip install -e ".[dev]"`: pinned in pyproject.toml).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tools" / "typecheck-baseline.json"
INSTALL_HINT = 'python -m pip install -e ".[train,test,dev]" --config-settings editable_mode=strict'

Finding = dict[str, Any]


def find_pyright() -> str | None:
    """The pyright beside this interpreter (the venv's), else the one on PATH."""
    here = Path(sys.executable).parent / ("pyright.exe" if os.name == "nt" else "pyright")
    return str(here) if here.exists() else shutil.which("pyright")


def run_pyright() -> dict[str, Any]:
    exe = find_pyright()
    if exe is None:
        print(f"typecheck: pyright is not installed; run: {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(2)
    argv = [exe, "--outputjson"]
    if not (ROOT / ".venv").is_dir():  # the config names .venv; elsewhere, resolve imports with this interpreter
        argv += ["--pythonpath", sys.executable]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    # pyright's exit status: 0 no errors, 1 errors found, 2 fatal, 3 bad configuration, 4 bad command line
    if p.returncode not in (0, 1):
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        print(f"typecheck: pyright failed (exit {p.returncode})", file=sys.stderr)
        raise SystemExit(2)
    try:
        return json.loads(p.stdout)
    except ValueError:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        print("typecheck: pyright's output is not JSON", file=sys.stderr)
        raise SystemExit(2) from None


def relative(file: str) -> str:
    p = Path(file)
    try:
        return p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return p.as_posix()


def errors_of(report: dict[str, Any]) -> list[Finding]:
    out = []
    for d in report.get("generalDiagnostics", []):
        if d.get("severity") == "error":
            line = d.get("range", {}).get("start", {}).get("line", -1) + 1  # pyright counts lines from 0
            out.append({"file": relative(d.get("file", "?")), "line": line, "rule": d.get("rule") or "(no rule)",
                        "message": d.get("message", "")})
    return out


def is_unresolved_import(f: Finding) -> bool:
    if f["rule"] == "reportMissingImports":
        return True
    # `from stepwatch.x import y` where y is missing, or `stepwatch.x.y` on a module pyright found
    return f["rule"] == "reportAttributeAccessIssue" and 'module "stepwatch' in f["message"]


def show(f: Finding) -> str:
    message = f["message"].replace("\n", "\n        ")
    return f"  {f['file']}:{f['line']}: [{f['rule']}] {message}"


def load_baseline() -> dict[str, int]:
    if not BASELINE.exists():
        return {}
    return {str(k): int(v) for k, v in json.loads(BASELINE.read_text())["files"].items()}


def write_baseline(counts: dict[str, int], version: str) -> None:
    doc = {"comment": "pyright errors per file, a ratchet: python tools/typecheck.py; lower it with --update",
           "pyright": version, "total": sum(counts.values()),
           "files": {k: counts[k] for k in sorted(counts) if counts[k] > 0}}
    BASELINE.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python tools/typecheck.py",
        description="Run pyright (configured in pyproject.toml) and compare its error count per file with "
                    "tools/typecheck-baseline.json. Exit 1 when a file's count rose or an import does not resolve; "
                    "exit 0 otherwise (with a note when counts fell: lower the baseline with --update); exit 2 "
                    "when pyright could not run.",
        epilog=f"Install first (strict editable mode, so that pyright resolves stepwatch.*): {INSTALL_HINT}")
    ap.add_argument("--update", action="store_true",
                    help="rewrite the baseline with today's counts; refused where a count rose, unless --force")
    ap.add_argument("--force", action="store_true", help="with --update: write the counts even where they rose")
    ap.add_argument("--from-json", type=Path, metavar="FILE",
                    help="read a saved `pyright --outputjson` report instead of running pyright")
    a = ap.parse_args(argv)
    if a.force and not a.update:
        ap.error("--force goes with --update")

    if a.from_json:
        try:
            report = json.loads(a.from_json.read_text())
        except (OSError, ValueError) as e:
            print(f"typecheck: cannot read {a.from_json}: {e}", file=sys.stderr)
            return 2
    else:
        report = run_pyright()
    version = str(report.get("version", "?"))
    found = errors_of(report)
    counts = Counter(f["file"] for f in found)
    base = load_baseline()

    rules = Counter(f["rule"] for f in found)
    print(f"pyright {version}: {len(found)} errors in {len(counts)} files "
          f"(baseline {sum(base.values())} in {len(base)} files)")
    print("  " + ", ".join(f"{r} {n}" for r, n in rules.most_common()) if rules else "  no errors")

    unresolved = [f for f in found if is_unresolved_import(f)]
    rose = sorted(p for p in counts if counts[p] > base.get(p, 0))
    fell = sorted(p for p in base if counts.get(p, 0) < base[p])

    if a.update:
        if unresolved:  # an unresolved import hides the errors behind it: such counts are no baseline
            print(f"typecheck: not updating: {len(unresolved)} unresolved import(s); run: {INSTALL_HINT}",
                  file=sys.stderr)
            for f in unresolved:
                print(show(f), file=sys.stderr)
            return 1
        if rose and not a.force:
            print(f"typecheck: not updating: {len(rose)} file(s) rose above the baseline "
                  "(fix them, or --update --force and say why)", file=sys.stderr)
            for p in rose:
                print(f"  {p}: {base.get(p, 0)} -> {counts[p]}", file=sys.stderr)
            return 1
        write_baseline(dict(counts), version)
        print(f"typecheck: baseline written: {sum(counts.values())} errors in {len(counts)} files "
              f"({BASELINE.relative_to(ROOT)})")
        return 0

    failed = False
    if unresolved:
        failed = True
        print(f"\ntypecheck: FAIL: {len(unresolved)} unresolved import(s). Is the checkout installed in strict "
              f"editable mode, and reinstalled since a module was added?\n  {INSTALL_HINT}")
        for f in unresolved:
            print(show(f))
    if rose:
        failed = True
        print(f"\ntypecheck: FAIL: {len(rose)} file(s) have more pyright errors than tools/typecheck-baseline.json "
              "allows; their findings:")
        for p in rose:
            print(f"{p}: {base.get(p, 0)} allowed, {counts[p]} now")
            for f in sorted((f for f in found if f["file"] == p), key=lambda f: f["line"]):
                print(show(f))
    if fell:
        print(f"\ntypecheck: {len(fell)} file(s) fell below the baseline "
              f"({sum(base[p] - counts.get(p, 0) for p in fell)} fewer errors): lower it with "
              "`python tools/typecheck.py --update` and commit tools/typecheck-baseline.json")
        for p in fell:
            print(f"  {p}: {base[p]} -> {counts.get(p, 0)}")
    if not failed:
        print("typecheck: ok (no file above its baseline, every import resolved)")
    return 1 if failed else 0


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):  # `| head` ends the listing quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
