"""The mutation tool's own bookkeeping (issue 21): tools/mutation/equivalent.md stays true to the code
it names, and ``run.py --carry`` keeps only the outcomes of mutants whose line did not change. Runs
without cosmic-ray (the tool imports only the standard library until it runs a target)."""

from __future__ import annotations

import importlib.util
import re
import sqlite3
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tools" / "mutation" / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)  # type: ignore[union-attr]

#: What the line of a mutant of each operator must hold (cosmic-ray's core operators): a row naming a
#: line without it names code that moved or went (the row then counts an unrelated mutant as equivalent).
_COMPARE = {"Eq": "==", "NotEq": "!=", "Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=", "Is": " is ",
            "IsNot": " is not ", "In": " in ", "NotIn": " not in "}
_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FloorDiv": "//", "Mod": "%"}


def _must_hold(op: str) -> re.Pattern[str]:
    name = op.removeprefix("core/")
    if m := re.fullmatch(r"ReplaceComparisonOperator_(\w+?)_(\w+)", name):
        return re.compile(re.escape(_COMPARE[m.group(1)]))
    if m := re.fullmatch(r"ReplaceBinaryOperator_(\w+?)_(\w+)", name):
        return re.compile(re.escape(_BINARY[m.group(1)]))
    return re.compile({
        "NumberReplacer": r"\d", "ReplaceTrueWithFalse": r"\bTrue\b", "ReplaceFalseWithTrue": r"\bFalse\b",
        "ReplaceAndWithOr": r"\band\b", "ReplaceOrWithAnd": r"\bor\b", "AddNot": r"\b(if|elif|while|and|or|return|assert)\b|=",
        "ReplaceUnaryOperator_Delete_Not": r"\bnot\b", "ReplaceUnaryOperator_USub_Not": r"-",
        "ReplaceUnaryOperator_USub_Invert": r"-", "ExceptionReplacer": r"\bexcept\b",
        "ReplaceContinueWithBreak": r"\bcontinue\b", "ReplaceBreakWithContinue": r"\bbreak\b",
        "ZeroIterationForLoop": r"\bfor\b",
    }[name])


def _rows() -> list[tuple[str, int, str, str]]:
    rows = []
    for line in (ROOT / "tools" / "mutation" / "equivalent.md").read_text().splitlines():
        if line.startswith("| `"):
            f, ln, op, why = (c.strip().strip("`") for c in line.split("|")[1:5])
            rows.append((f, int(ln), op, why))
    return rows


def test_every_equivalent_row_names_a_line_that_holds_its_operator():
    rows = _rows()
    assert len(rows) > 300 and len({(f, ln, op) for f, ln, op, _ in rows}) == len(rows)  # no row twice
    assert {(f, ln, op) for f, ln, op, _ in rows} == run.equivalents()
    wrong = []
    for f, ln, op, why in rows:
        lines = (ROOT / f).read_text().splitlines()
        assert why, (f, ln, op)
        code = lines[ln - 1] if 0 < ln <= len(lines) else ""
        if not _must_hold(op).search(code.split("  #")[0]):
            wrong.append(f"{f}:{ln} {op}: {code.strip()!r}")
    assert wrong == []


def test_the_operator_check_refuses_a_line_without_its_operator():
    """The control of the check above: each pattern misses a line without its operator."""
    assert _must_hold("core/ReplaceComparisonOperator_GtE_Gt").search("if a >= b:")
    assert not _must_hold("core/ReplaceComparisonOperator_GtE_Gt").search("if a > b:")
    assert not _must_hold("core/NumberReplacer").search("short = self._short")
    assert not _must_hold("core/ReplaceOrWithAnd").search("if a and b:")


def _session(path: Path, specs: list[tuple], results: dict[str, tuple]) -> None:
    """A cosmic-ray session file (the three tables run.py reads) with ``specs`` (job, op, occurrence,
    start row, start col, end row, end col) and ``results`` {job: (test outcome, diff)}."""
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE work_items (job_id VARCHAR NOT NULL PRIMARY KEY);"
        "CREATE TABLE mutation_specs (module_path VARCHAR, operator_name VARCHAR, operator_args JSON, occurrence INTEGER,"
        " start_pos_row INTEGER, start_pos_col INTEGER, end_pos_row INTEGER, end_pos_col INTEGER, definition_name VARCHAR,"
        " job_id VARCHAR NOT NULL PRIMARY KEY);"
        "CREATE TABLE work_results (worker_outcome VARCHAR(9), output TEXT, test_outcome VARCHAR(11), diff TEXT,"
        " job_id VARCHAR NOT NULL PRIMARY KEY);")
    for job, op, occ, r0, c0, r1, c1 in specs:
        con.execute("INSERT INTO work_items VALUES (?)", (job,))
        con.execute("INSERT INTO mutation_specs VALUES ('m.py', ?, '{}', ?, ?, ?, ?, ?, NULL, ?)", (op, occ, r0, c0, r1, c1, job))
    for job, (outcome, diff) in results.items():
        con.execute("INSERT INTO work_results VALUES ('normal', '', ?, ?, ?)", (outcome, diff, job))
    con.commit()
    con.close()


def test_carry_keeps_the_outcomes_of_unchanged_lines_only(tmp_path):
    """Old file: ``b = 2 + 3`` (line 2) and ``c = 4`` (line 3). The new file has a line inserted above
    both and ``c = 5``: the mutant of ``2`` (killed) moves to line 3 and keeps its outcome; the two
    alike mutants of ``3`` pair up in order; ``c``'s line changed, and a mutant over two lines is never
    carried; both run afresh (no result)."""
    new_file = tmp_path / "m.py"
    new_file.write_text("a = 1\nx = 0\nb = 2 + 3\nc = 5\nd = (1 +\n     2)\n")
    num = "core/NumberReplacer"
    old_db, new_db = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    _session(old_db, [("o1", num, 0, 2, 4, 2, 5), ("o2", num, 1, 2, 8, 2, 9), ("o3", num, 2, 2, 8, 2, 9),
                      ("o4", num, 3, 3, 4, 3, 5), ("o5", "core/ReplaceBinaryOperator_Add_Sub", 0, 4, 7, 5, 6)],
             {"o1": ("KILLED", "--- a\n+++ b\n@@\n-b = 2 + 3\n+b = 3 + 3"),
              "o2": ("SURVIVED", "--- a\n+++ b\n@@\n-b = 2 + 3\n+b = 2 + 4"),
              "o3": ("KILLED", "--- a\n+++ b\n@@\n-b = 2 + 3\n+b = 2 + 2"),
              "o4": ("SURVIVED", "--- a\n+++ b\n@@\n-c = 4\n+c = 5"),
              "o5": ("KILLED", "--- a\n+++ b\n@@\n-d = (1 +\n+d = (1 -")})
    _session(new_db, [("n1", num, 0, 3, 4, 3, 5), ("n2", num, 1, 3, 8, 3, 9), ("n3", num, 2, 3, 8, 3, 9),
                      ("n4", num, 3, 4, 4, 4, 5), ("n5", "core/ReplaceBinaryOperator_Add_Sub", 0, 5, 7, 6, 6)], {})
    carried, survivors = run.carry("m", {"file": str(new_file)}, old_db, new_db)
    assert (carried, survivors) == (3, 1)
    got = dict(sqlite3.connect(new_db).execute("SELECT job_id, test_outcome FROM work_results").fetchall())
    assert got == {"n1": "KILLED", "n2": "SURVIVED", "n3": "KILLED"}
    out = sqlite3.connect(new_db).execute("SELECT output FROM work_results WHERE job_id = 'n1'").fetchone()[0]
    assert out.startswith("carried from old.sqlite")


@pytest.mark.parametrize("row, key", [((2, 4, 2, 5), ("op", "b = 2", 4, 5)), ((2, 4, 3, 1), None)])
def test_a_mutant_s_key_is_its_line_and_place_on_it(row, key):
    assert run._single_line_key("op", "b = 2", row) == key
