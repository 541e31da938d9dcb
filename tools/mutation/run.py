"""Mutation testing of the silent properties, with cosmic-ray (``pip install cosmic-ray``).

    python tools/mutation/run.py                 # every target of targets.toml
    python tools/mutation/run.py watchdog rotate # some of them
    python tools/mutation/run.py --timeout 120   # seconds per mutant's test run
    python tools/mutation/run.py energy --survivors  # after new tests: the survivors again
    python tools/mutation/run.py --report        # the sessions already run
    python tools/mutation/run.py fallback --continue  # a run cut short: only the mutants left
    python tools/mutation/run.py fallback --carry     # after a small change of the file (see carry())
    python tools/mutation/run.py fallback --equivalents  # is a row of equivalent.md killed by a test now?
    python tools/mutation/run.py --check-ledger  # does each row of equivalent.md still name its line?

For each target: ``cosmic-ray init`` (a session in .mutation/<name>.sqlite), ``cosmic-ray baseline``
(the tests pass on the unmutated code, else the target is not measured), ``cosmic-ray exec`` (each
mutant applied in place, the target's tests run with ``pytest -x``, the file restored), then the
kill rate and the survivors. Survivors named in equivalent.md (file, the line's text, operator)
are counted apart, with the reason there; a row that matches no survivor of the session is printed. Exit status 1 when a target is below --min (default 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: Every test run compiles the project's (mutated) source afresh: a mutant of the same size written
#: within the second of the last .pyc would otherwise run as the stale bytecode of an earlier variant
#: (and "survive"). The project's __pycache__ folders are removed before a target and none is written
#: while it runs; the libraries' bytecode is read as usual (compiling pytest afresh cost ~1 s a run).
NO_PYC = "PYTHONDONTWRITEBYTECODE=1"
#: The operators sampled. Left out: an arithmetic operator replaced by (or replacing) a bit, shift,
#: power or matrix operator, and an ordering comparison swapped with identity or membership. On the
#: floats and counts these files compute with, nearly every one is a TypeError at its first
#: evaluation (or ``x in 3``): they measure whether a line runs, not whether a test judges its result,
#: and they were half of all mutants (4,026 of 8,326 over the targets). Every other cosmic-ray
#: operator is kept (+ - * / // % among themselves, the six orderings, is/is not, and/or, not,
#: numbers, True/False, break/continue, exception handlers, zero-iteration loops, decorators).
EXCLUDED_OPERATORS = [
    r"core/ReplaceBinaryOperator_\w+_(BitOr|BitAnd|BitXor|LShift|RShift|MatMult|Pow)$",
    r"core/ReplaceBinaryOperator_(BitOr|BitAnd|BitXor|LShift|RShift|MatMult|Pow)_\w+$",
    r"core/ReplaceComparisonOperator_(Eq|NotEq|Lt|LtE|Gt|GtE)_(Is|IsNot|In|NotIn)$",
    r"core/ReplaceComparisonOperator_(Is|IsNot|In|NotIn)_(Eq|NotEq|Lt|LtE|Gt|GtE)$",
]


def purge_bytecode() -> None:
    """Remove the project's own __pycache__ folders (never the virtual environment's)."""
    import shutil

    for top in ("launcher", "monitors", "tui", "assets", "tests", "tools"):
        for d in (ROOT / top).rglob("__pycache__"):
            shutil.rmtree(d, ignore_errors=True)


class Row(NamedTuple):
    """One row of equivalent.md: the mutants of ``op`` on the line of ``file`` that reads ``text``
    (stripped), in the function or class ``scope`` ('' at the top level; None: wherever the text is),
    the ``nth`` line reading so there (None: each), at column ``col`` (None: every place on the line)."""

    file: str
    text: str
    scope: str | None
    nth: int | None
    col: int | None
    op: str
    why: str


#: A table cell's edge: a ``|`` not written ``\|`` (a line's own ``|`` inside its code span).
_CELL = re.compile(r"(?<!\\)\|")


def _code_span(cell: str) -> str:
    return cell.removeprefix("`").removesuffix("`").replace("\\|", "|")


def equivalents(path: Path | None = None) -> list[Row]:
    """The rows of equivalent.md: the mutants no behaviour tells apart, keyed by the text of their line
    (never its number: an edit elsewhere in the file leaves a row true)."""
    out = []
    for line in (path or HERE / "equivalent.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in _CELL.split(line)[1:-1]]
        if len(cells) < 6:
            continue
        where = re.fullmatch(r"(?:`([^`]+)`|\((module)\))?\s*(?:#(\d+))?", cells[2])
        if where is None or not (cells[3] == "" or cells[3].isdigit()):
            raise SystemExit(f"equivalent.md: a row it cannot read: {line}")
        scope = where.group(1) if where.group(1) else "" if where.group(2) else None
        out.append(Row(_code_span(cells[0]), _code_span(cells[1]), scope, int(where.group(3)) if where.group(3) else None,
                       int(cells[3]) if cells[3] else None, cells[4], " | ".join(cells[5:])))
    return out


def line_keys(source: str) -> dict[int, tuple[str, str, int]]:
    """Each line's (1-based) key: its stripped text, the qualified name of the innermost function or
    class holding it ('' at the top level), and which line reading so it is in there (1, 2... from the
    top). What a row of equivalent.md names, and what an edit of other lines does not shift."""
    import ast

    lines = source.splitlines()
    scope = dict.fromkeys(range(1, len(lines) + 1), "")

    def walk(node: ast.AST, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{qual}.{child.name}" if qual else child.name
                for ln in range(child.lineno, (child.end_lineno or child.lineno) + 1):
                    scope[ln] = q
                walk(child, q)
            else:
                walk(child, qual)

    walk(ast.parse(source), "")
    seen: dict[tuple[str, str], int] = {}
    keys = {}
    for ln, text in enumerate(lines, 1):
        k = (text.strip(), scope[ln])
        seen[k] = seen.get(k, 0) + 1
        keys[ln] = (k[0], k[1], seen[k])
    return keys


def names_line(row: Row, key: tuple[str, str, int]) -> bool:
    """Whether ``row`` names the line whose key (``line_keys``) is ``key``."""
    text, scope, nth = key
    return row.text == text and row.scope in (None, scope) and row.nth in (None, nth)


def listed(equiv: list[Row], file: str, keys: dict[int, tuple[str, str, int]], row: int, op: str, col: int) -> bool:
    """Whether equivalent.md names the mutant of ``op`` at ``row``:``col`` of ``file`` (``keys``: its
    ``line_keys``)."""
    key = keys.get(row)
    return key is not None and any(r.file == file and r.op == op and r.col in (None, col) and names_line(r, key) for r in equiv)


#: What the line of a mutant of each operator must hold (cosmic-ray's core operators): a row naming a
#: line without it names code that changed (the row would count an unrelated mutant as equivalent).
_COMPARE = {"Eq": r"==", "NotEq": r"!=", "Lt": r"(?<![<-])<(?![<=])", "LtE": r"<=", "Gt": r"(?<![>=-])>(?![>=])",
            "GtE": r">=", "Is": r"\bis\b(?! not)", "IsNot": r"\bis not\b", "In": r"(?<!not )\bin\b", "NotIn": r"\bnot in\b"}
_BINARY = {"Add": r"\+", "Sub": r"-(?!>)", "Mul": r"(?<!\*)\*(?!\*)", "Div": r"(?<!/)/(?!/)", "FloorDiv": r"//", "Mod": r"%"}
_OTHER = {
    "NumberReplacer": r"\d", "ReplaceTrueWithFalse": r"\bTrue\b", "ReplaceFalseWithTrue": r"\bFalse\b",
    "ReplaceAndWithOr": r"\band\b", "ReplaceOrWithAnd": r"\bor\b", "AddNot": r"\b(if|elif|while|and|or|return|assert)\b|=",
    "ReplaceUnaryOperator_Delete_Not": r"\bnot\b", "ReplaceUnaryOperator_USub_Not": r"-",
    "ReplaceUnaryOperator_USub_Invert": r"-", "ExceptionReplacer": r"\bexcept\b",
    "ReplaceContinueWithBreak": r"\bcontinue\b", "ReplaceBreakWithContinue": r"\bbreak\b",
    "ZeroIterationForLoop": r"\bfor\b",
}


def must_hold(op: str) -> re.Pattern[str] | None:
    """What a line must hold for a mutant of cosmic-ray's operator ``op`` to be on it (None: an
    operator this check does not know)."""
    name = op.removeprefix("core/")
    if m := re.fullmatch(r"ReplaceComparisonOperator_([A-Za-z]+?)_([A-Za-z]+)", name):
        pattern = _COMPARE.get(m.group(1))
    elif m := re.fullmatch(r"ReplaceBinaryOperator_([A-Za-z]+?)_([A-Za-z]+)", name):
        pattern = _BINARY.get(m.group(1))
    else:
        pattern = _OTHER.get(name)
    return re.compile(pattern) if pattern else None


def describe(r: Row) -> str:
    """Where on its line's text a row points, as equivalent.md writes it (``in`` scope, ``#N``, ``col``)."""
    scope = "" if r.scope is None else f" in {r.scope or '(module)'}"
    return f"{scope}{'' if r.nth is None else f' #{r.nth}'}{'' if r.col is None else f' col {r.col}'}"


def ledger_problems(rows: list[Row], root: Path = ROOT) -> list[str]:
    """What is wrong with equivalent.md's ``rows`` against the files under ``root``: a row twice, a row
    without a reason or with an operator the check does not know, a row that names no line of its file
    (the code changed or went) or several where it should name one (say which with `in` and `#N`), a
    line that does not hold the row's operator (at its column, when it names one)."""
    problems, seen, keys_of = [], set(), {}
    for r in rows:
        where = f"{r.file}: `{r.text}`{describe(r)} {r.op}"
        if r[:6] in seen:
            problems.append(f"{where}: listed twice")
        seen.add(r[:6])
        pattern = must_hold(r.op)
        if not r.why.strip() or pattern is None:
            problems.append(f"{where}: {'no reason given' if pattern else 'an operator the check does not know'}")
            continue
        if r.file not in keys_of:
            path = root / r.file
            keys_of[r.file] = (line_keys(path.read_text()), path.read_text().splitlines()) if path.is_file() else ({}, [])
        keys, lines = keys_of[r.file]
        at = [ln for ln, key in keys.items() if names_line(r, key)]
        if not at:
            problems.append(f"{where}: no line of the file reads so (the code changed or went)")
        elif len(at) > 1 and (r.scope is None or r.nth is None):
            problems.append(f"{where}: {len(at)} lines read so (lines {', '.join(map(str, at))}): name one with `in` and `#N`")
        for ln in at:
            code = lines[ln - 1][r.col:][:12] if r.col is not None else lines[ln - 1].split("  #")[0]
            if not pattern.search(code):
                problems.append(f"{where}: line {ln} does not hold the operator{'' if r.col is None else ' at that column'}")
    return problems


def check_ledger() -> int:
    """``--check-ledger``: 1 when a row of equivalent.md is stale (printed), else 0."""
    rows = equivalents()
    problems = ledger_problems(rows)
    for p in problems:
        print(f"equivalent.md: {p}")
    print(f"equivalent.md: {len(rows)} rows, {len(problems)} problems")
    return 1 if problems else 0


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (line, col) of every annotation in ``path``: with ``from __future__ import
    annotations`` they are never evaluated, so a mutant inside one (``int | None`` -> ``int & None``)
    is equivalent by construction."""
    import ast

    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        for ann in ([node.annotation] if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation else []) + (
                [node.returns] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns else []):
            spans.append(((ann.lineno, ann.col_offset), (ann.end_lineno, ann.end_col_offset)))
    return spans


def tests_pass(spec: dict, timeout_s: float) -> bool:
    """The target's tests, on the code as it is now, pass within ``timeout_s`` (a hang fails)."""
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in NO_PYC.split()))
    try:
        t = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *spec.get("args", []),
                            *spec["tests"]], cwd=ROOT, capture_output=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return False
    return t.returncode == 0


def retest_survivors(name: str, spec: dict, timeout_s: float, only_listed: bool = False) -> None:
    """Run the target's (now larger) tests again on each mutant that survived in the session, one at
    a time (``cosmic-ray apply``, the file restored after each), and record the new outcomes: after
    new tests, only the survivors need another look."""
    db = ROOT / ".mutation" / f"{name}.sqlite"
    con = sqlite3.connect(db)
    rows = con.execute("SELECT m.job_id, m.module_path, m.operator_name, m.occurrence, m.start_pos_row, m.start_pos_col FROM "
                       "mutation_specs m JOIN work_results r ON m.job_id = r.job_id "
                       "WHERE lower(r.test_outcome) = 'survived'").fetchall()
    left_out = re.compile("|".join(EXCLUDED_OPERATORS))
    rows = [r for r in rows if not left_out.match(r[2])]  # a session from before the sampling: only what counts
    equiv = equivalents()
    keys = line_keys((ROOT / spec["file"]).read_text())
    # equivalent.md's rows are not run again (no test can kill them), unless ``only_listed``: then only
    # those are, to find a row a new test made wrong (the row goes; the mutant counts as killed)
    rows = [r for r in rows if listed(equiv, spec["file"], keys, r[4], r[2], r[5]) == only_listed]
    if rows and not tests_pass(spec, timeout_s):  # else every mutant would read as killed
        raise SystemExit(f"{name}: the tests fail on the unmutated code: no survivor re-tested")
    purge_bytecode()
    path = ROOT / spec["file"]
    original = path.read_bytes()
    cr = str(Path(sys.executable).parent / "cosmic-ray")
    try:
        lines = original.decode().splitlines()
        for job, module, op, occ, row, _col in rows:
            applied = subprocess.run([cr, "apply", module, op, str(occ)], cwd=ROOT, capture_output=True)
            now = path.read_bytes().decode().splitlines()
            changed = next((i + 1 for i, (a, b) in enumerate(zip(lines, now)) if a != b), None)
            if applied.returncode != 0 or changed != row:  # the code changed since: not the mutant the session holds
                path.write_bytes(original)
                print(f"{name}: {op} #{occ} no longer applies to {spec['file']} (the code changed): run the target afresh")
                continue
            outcome = "SURVIVED" if tests_pass(spec, timeout_s) else "KILLED"  # a hang counts as noticed
            path.write_bytes(original)
            if only_listed and outcome == "KILLED":
                text = keys.get(row, ("?",))[0]
                print(f"{name}: equivalent.md lists line {row} (`{text}`) {op}, which a test kills now: remove the row")
            con.execute("UPDATE work_results SET test_outcome = ? WHERE job_id = ?", (outcome, job))
            con.commit()
    finally:
        path.write_bytes(original)


def _single_line_key(op: str, line: str, spec_row: tuple[int, int, int, int],
                     around: tuple[str | None, str | None] = (None, None)) -> tuple | None:
    """What identifies a one-line mutant across edits of other lines: the operator, the text of the
    line it changes and of the lines just before and after it, and where on the line (a mutant
    spanning lines has no key: it is run again)."""
    start_row, start_col, end_row, end_col = spec_row
    return (op, around[0], line, around[1], start_col, end_col) if start_row == end_row else None


def _diff_line_and_around(diff: str) -> tuple[str, tuple[str | None, str | None]] | None:
    """The one line a recorded diff changes, with the context lines around it (None at a file's end)."""
    body = [x for x in (diff or "").splitlines() if not x.startswith(("---", "+++", "@@")) and x != "--- mutation diff ---"]
    minus = [i for i, x in enumerate(body) if x.startswith("-")]
    plus = [i for i, x in enumerate(body) if x.startswith("+")]
    if len(minus) != 1 or len(plus) != 1:
        return None
    i, j = minus[0], plus[0]
    before = body[i - 1][1:] if i > 0 and body[i - 1].startswith(" ") else None
    after = body[j + 1][1:] if j + 1 < len(body) and body[j + 1].startswith(" ") else None
    return body[i][1:], (before, after)


def carry(name: str, spec: dict, prev: Path, db: Path) -> tuple[int, int]:
    """After an edit of some lines of the target's file: the fresh session ``db`` takes the outcome
    the previous session ``prev`` recorded for each one-line mutant whose line, and the lines just
    before and after it, read exactly as they did then (same operator, same place on the line).
    Mutants alike on one line pair up in order, and only when both sessions have as many of them:
    a line that now appears more or fewer times (an edited or a new copy) runs afresh, as does every
    mutant of a changed line or one spanning lines. Carried survivors are tested again
    (``retest_survivors``). The kills carried were made by the tests of that session on code that
    differed elsewhere in the file: a change that made a mutant live again through another line is
    not seen (run the target afresh, without --carry, for the figure of record)."""
    lines = (ROOT / spec["file"]).read_text().splitlines()
    old = sqlite3.connect(prev)
    pool: dict[tuple, list[tuple]] = {}
    for op, _occ, r0, c0, r1, c1, outcome, worker, diff, output in old.execute(
            "SELECT m.operator_name, m.occurrence, m.start_pos_row, m.start_pos_col, m.end_pos_row, m.end_pos_col, "
            "r.test_outcome, r.worker_outcome, r.diff, r.output FROM mutation_specs m JOIN work_results r "
            "ON m.job_id = r.job_id ORDER BY m.occurrence"):
        got = _diff_line_and_around(diff)
        key = _single_line_key(op, got[0], (r0, c0, r1, c1), got[1]) if got else None
        if key is not None:
            pool.setdefault(key, []).append((outcome, worker, diff, output))
    new = sqlite3.connect(db)
    done = {j for (j,) in new.execute("SELECT job_id FROM work_results")}  # the operator filter's skipped ones
    wanted: dict[tuple, list[str]] = {}
    for job, op, r0, c0, r1, c1 in new.execute(
            "SELECT job_id, operator_name, start_pos_row, start_pos_col, end_pos_row, end_pos_col "
            "FROM mutation_specs ORDER BY occurrence").fetchall():
        if job in done or not 0 < r0 <= len(lines):
            continue
        around = (lines[r0 - 2] if r0 > 1 else None, lines[r0] if r0 < len(lines) else None)
        key = _single_line_key(op, lines[r0 - 1], (r0, c0, r1, c1), around)
        if key is not None:
            wanted.setdefault(key, []).append(job)
    carried = survivors = 0
    for key, jobs in wanted.items():
        if len(pool.get(key, ())) != len(jobs):
            continue  # as many alike mutants in both sessions, or none carried
        for job, (outcome, worker, diff, output) in zip(jobs, pool[key]):
            new.execute("INSERT INTO work_results (job_id, worker_outcome, output, test_outcome, diff) VALUES (?, ?, ?, ?, ?)",
                        (job, worker, f"carried from {prev.name}\n{output or ''}", outcome, diff))
            carried += 1
            survivors += str(outcome).lower() == "survived"
    new.commit()
    return carried, survivors


def run_target(name: str, spec: dict, timeout_s: float, resume: str = "no") -> dict:
    if resume == "survivors":
        retest_survivors(name, spec, timeout_s)
    if resume == "equivalents":
        retest_survivors(name, spec, timeout_s, only_listed=True)
        resume = "report"
    if resume in ("survivors", "report"):
        return report(name, spec)
    work = ROOT / ".mutation"
    work.mkdir(exist_ok=True)
    cfg, db = work / f"{name}.toml", work / f"{name}.sqlite"
    tests = " ".join(shlex.quote(t) for t in [*spec.get("args", []), *spec["tests"]])
    purge_bytecode()
    cfg.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(spec['file'])}\n"
        f"timeout = {timeout_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(f'env {NO_PYC} {sys.executable} -m pytest -x -q -p no:cacheprovider {tests}')}\n"
        "[cosmic-ray.distributor]\nname = \"local\"\n"
        f"[cosmic-ray.filters.operators-filter]\nexclude-operators = {json.dumps(EXCLUDED_OPERATORS)}\n")
    cr = [str(Path(sys.executable).parent / "cosmic-ray")]
    prev = work / f"{name}.prev.sqlite"
    if resume == "carry" and db.exists():
        db.replace(prev)
    if resume != "continue" or not db.exists():
        db.unlink(missing_ok=True)
        subprocess.run([*cr, "init", str(cfg), str(db)], cwd=ROOT, check=True)
        subprocess.run([str(Path(sys.executable).parent / "cr-filter-operators"), str(db), str(cfg)], cwd=ROOT, check=True)
    if resume == "carry" and prev.exists():
        carried, survived = carry(name, spec, prev, db)
        print(f"{name}: {carried} outcomes carried from {prev.name} ({survived} survivors among them, tested again)")
        retest_survivors(name, spec, timeout_s)
    base = subprocess.run([*cr, "baseline", str(cfg)], cwd=ROOT, capture_output=True, text=True)
    if base.returncode != 0:
        return {"name": name, "file": spec["file"], "error": f"the tests fail on the unmutated code: {base.stdout[-500:]}"}
    subprocess.run([*cr, "exec", str(cfg), str(db)], cwd=ROOT, check=True)
    return report(name, spec)


def report(name: str, spec: dict) -> dict:
    """The target's kill rate and survivors from its session (.mutation/<name>.sqlite)."""
    if not (ROOT / ".mutation" / f"{name}.sqlite").exists():
        return {"name": name, "file": spec["file"], "error": f"not run yet: python tools/mutation/run.py {name}"}
    con = sqlite3.connect(ROOT / ".mutation" / f"{name}.sqlite")
    rows = con.execute("SELECT m.module_path, m.operator_name, m.occurrence, m.start_pos_row, m.start_pos_col, "
                       "r.test_outcome, r.worker_outcome FROM mutation_specs m JOIN work_results r "
                       "ON m.job_id = r.job_id").fetchall()
    equiv = equivalents()
    keys = line_keys((ROOT / spec["file"]).read_text())
    spans = annotation_spans(ROOT / spec["file"])
    survivors, equivalent, killed = [], [], 0
    left_out = re.compile("|".join(EXCLUDED_OPERATORS))
    sampled = [r for r in rows if not left_out.match(r[1])]  # sessions from before the filter too
    for _path, op, occ, row, col, outcome, worker in sampled:
        outcome, worker = str(outcome or "").lower(), str(worker or "").lower()
        in_annotation = any(a <= (row, col) < b for a, b in spans)
        if outcome == "survived":
            (equivalent if in_annotation or listed(equiv, spec["file"], keys, row, op, col) else survivors).append((row, op, occ))
        elif outcome in ("killed", "incompetent") or worker == "timeout":  # the tests noticed (a hang counts)
            killed += 1
    counted = len(sampled) - len(equivalent)
    surviving = {(row, op, col) for _p, op, _o, row, col, outcome, _w in sampled if str(outcome or "").lower() == "survived"}
    stale = [f"`{r.text}`{describe(r)} {r.op}" for r in equiv if r.file == spec["file"] and not any(
        o == r.op and r.col in (None, c) and ln in keys and names_line(r, keys[ln]) for ln, o, c in surviving)]
    return {"name": name, "file": spec["file"], "mutants": len(sampled), "not_sampled": len(rows) - len(sampled),
            "killed": killed, "equivalent": len(equivalent), "stale_rows": stale,
            "kill_rate": killed / counted if counted else None, "survivors": sorted(survivors)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--min", type=float, default=0.9)
    ap.add_argument("--report", action="store_true", help="only report the sessions already run")
    ap.add_argument("--continue", dest="resume", action="store_true",
                    help="run only the mutants the session has no result for yet (a run cut short), with the "
                         "target's tests as they are now")
    ap.add_argument("--carry", action="store_true",
                    help="after a small change of the file: a fresh session that keeps the last one's outcome for "
                         "each mutant of an unchanged line, tests its survivors again and runs the rest")
    ap.add_argument("--equivalents", action="store_true",
                    help="test the survivors equivalent.md lists again: a row a test now kills is printed (remove it)")
    ap.add_argument("--survivors", action="store_true",
                    help="test only the last session's survivors again (after adding tests), then report")
    ap.add_argument("--check-ledger", action="store_true",
                    help="check that each row of equivalent.md names a line of its file that holds its operator "
                         "(exit 1 on a stale row); runs no target")
    a = ap.parse_args()
    if a.check_ledger:
        return check_ledger()
    targets = tomllib.loads((HERE / "targets.toml").read_text())
    names = a.names or list(targets)
    resume = ("survivors" if a.survivors else "report" if a.report else "continue" if a.resume
              else "carry" if a.carry else "equivalents" if a.equivalents else "no")
    results = [run_target(n, targets[n], a.timeout, resume) for n in names]
    print(f"\n{'target':12} {'file':36} {'mutants':>7} {'killed':>6} {'equiv':>5} {'kill rate':>9} {'not sampled':>11}")
    low = False
    for r in results:
        if "error" in r:
            print(f"{r['name']:12} {r['file']:36} ERROR {r['error']}")
            low = True
            continue
        rate = r["kill_rate"]
        low |= rate is None or rate < a.min
        print(f"{r['name']:12} {r['file']:36} {r['mutants']:7} {r['killed']:6} {r['equivalent']:5} "
              f"{'-' if rate is None else f'{100 * rate:.1f}%':>9} {r['not_sampled']:11}")
        for row, op, occ in r["survivors"]:
            print(f"    survived: line {row} {op} #{occ}")
        for row in r["stale_rows"]:  # killed by a test now, or the code changed: the row is wrong
            print(f"    equivalent.md row with no surviving mutant: {row}")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
