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
_COMPARE = {"Eq": r"==", "NotEq": r"!=", "Lt": r"(?<![<-])<(?![<=])", "LtE": r"<=", "Gt": r"(?<![>=-])>(?![>=])",
            "GtE": r">=", "Is": r"\bis\b(?! not)", "IsNot": r"\bis not\b", "In": r"(?<!not )\bin\b", "NotIn": r"\bnot in\b"}
_BINARY = {"Add": r"\+", "Sub": r"-(?!>)", "Mul": r"(?<!\*)\*(?!\*)", "Div": r"(?<!/)/(?!/)", "FloorDiv": r"//", "Mod": r"%"}


def _must_hold(op: str) -> re.Pattern[str]:
    name = op.removeprefix("core/")
    if m := re.fullmatch(r"ReplaceComparisonOperator_([A-Za-z]+?)_([A-Za-z]+)", name):
        return re.compile(_COMPARE[m.group(1)])
    if m := re.fullmatch(r"ReplaceBinaryOperator_([A-Za-z]+?)_([A-Za-z]+)", name):
        return re.compile(_BINARY[m.group(1)])
    return re.compile({
        "NumberReplacer": r"\d", "ReplaceTrueWithFalse": r"\bTrue\b", "ReplaceFalseWithTrue": r"\bFalse\b",
        "ReplaceAndWithOr": r"\band\b", "ReplaceOrWithAnd": r"\bor\b", "AddNot": r"\b(if|elif|while|and|or|return|assert)\b|=",
        "ReplaceUnaryOperator_Delete_Not": r"\bnot\b", "ReplaceUnaryOperator_USub_Not": r"-",
        "ReplaceUnaryOperator_USub_Invert": r"-", "ExceptionReplacer": r"\bexcept\b",
        "ReplaceContinueWithBreak": r"\bcontinue\b", "ReplaceBreakWithContinue": r"\bbreak\b",
        "ZeroIterationForLoop": r"\bfor\b",
    }[name])


def _rows() -> list[tuple[str, int, int | None, str, str]]:
    rows = []
    for line in (ROOT / "tools" / "mutation" / "equivalent.md").read_text().splitlines():
        if line.startswith("| `"):
            f, ln, op, why = (c.strip().strip("`") for c in line.split("|")[1:5])
            row, _, col = ln.partition(":")
            rows.append((f, int(row), int(col) if col else None, op, why))
    return rows


def test_every_equivalent_row_names_a_line_that_holds_its_operator():
    """Each row's line (at its column, when it names one) holds the operator it names."""
    rows = _rows()
    assert len(rows) > 300 and len({r[:4] for r in rows}) == len(rows)  # no row twice
    assert {r[:4] for r in rows} == {(f, ln, col, op) for f, ln, op, col in run.equivalents()}
    wrong = []
    for f, ln, col, op, why in rows:
        lines = (ROOT / f).read_text().splitlines()
        assert why, (f, ln, op)
        code = lines[ln - 1] if 0 < ln <= len(lines) else ""
        code = code[col:] if col is not None else code.split("  #")[0]
        if not _must_hold(op).search(code if col is None else code[:12]):
            wrong.append(f"{f}:{ln}{'' if col is None else f':{col}'} {op}: {code.strip()!r}")
    assert wrong == []


def test_the_operator_check_refuses_a_line_without_its_operator():
    """The control of the check above: each pattern misses a line without its operator."""
    assert _must_hold("core/ReplaceComparisonOperator_GtE_Gt").search("if a >= b:")
    assert not _must_hold("core/ReplaceComparisonOperator_GtE_Gt").search("if a > b:")
    assert not _must_hold("core/NumberReplacer").search("short = self._short")
    assert not _must_hold("core/ReplaceOrWithAnd").search("if a and b:")
    assert not _must_hold("core/ReplaceComparisonOperator_Gt_GtE").search("def f(x) -> int:")
    assert not _must_hold("core/ReplaceComparisonOperator_Lt_LtE").search("if a <= b:")
    assert not _must_hold("core/ReplaceBinaryOperator_Div_Mul").search("a // b")
    assert not _must_hold("core/ReplaceComparisonOperator_Is_IsNot").search("if a is not b:")


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


def _diff(source: str, row: int, mutated_line: str) -> str:
    """The diff cosmic-ray records for a mutant that changes line ``row`` (1-based) of ``source``."""
    import difflib

    lines = source.split("\n")
    mutated = lines[: row - 1] + [mutated_line] + lines[row:]
    return "\n".join(["--- mutation diff ---", *difflib.unified_diff(lines, mutated, "a/m.py", "b/m.py", lineterm="")])


OLD = "a = 1\nb = 2 + 3\nc = 4\nd = (1 +\n     2)\na = 1\ny = 0\na = 1\ny = 0\na = 1\n"
NEW = "a = 1\nb = 2 + 3\nc = 5\nd = (1 +\n     2)\na = 1\ny = 9\na = 1\ny = 0\na = 1\nz = 1\n"
NUM, ADD = "core/NumberReplacer", "core/ReplaceBinaryOperator_Add_Sub"


def test_carry_keeps_the_outcomes_of_unchanged_lines_only(tmp_path):
    """Old and new files differ at line 3 (``c = 4`` -> ``c = 5``), at line 7 (the first of two
    ``y = 0`` lines between ``a = 1`` lines) and by a line added at the end. Carried: line 1's two
    alike mutants (unchanged, and so is the line after it), paired in order. Afresh: line 2's (the
    line after it changed); line 9's (its twin at line 7 was edited: two old outcomes for the one
    line now there, and an edited copy must not lend its outcome); the mutant over lines 4-5. A job
    with a result already (the operator filter's) keeps it."""
    new_file = tmp_path / "m.py"
    new_file.write_text(NEW)
    old_db, new_db = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    old_specs = [("o1", NUM, 0, 1, 4, 1, 5), ("o2", NUM, 1, 1, 4, 1, 5), ("o3", NUM, 2, 2, 4, 2, 5),
                 ("o4", NUM, 3, 7, 4, 7, 5), ("o5", NUM, 4, 9, 4, 9, 5), ("o6", ADD, 0, 4, 7, 5, 6)]
    _session(old_db, old_specs, {
        "o1": ("KILLED", _diff(OLD, 1, "a = 2")), "o2": ("SURVIVED", _diff(OLD, 1, "a = 0")),
        "o3": ("KILLED", _diff(OLD, 2, "b = 3 + 3")),
        "o4": ("KILLED", _diff(OLD, 7, "y = 1")), "o5": ("SURVIVED", _diff(OLD, 9, "y = 1")),
        "o6": ("KILLED", _diff(OLD, 4, "d = (1 -"))})
    _session(new_db, [("n1", NUM, 0, 1, 4, 1, 5), ("n2", NUM, 1, 1, 4, 1, 5), ("n3", NUM, 2, 2, 4, 2, 5),
                      ("n5", NUM, 4, 9, 4, 9, 5), ("n6", ADD, 0, 4, 7, 5, 6), ("n7", NUM, 5, 11, 4, 11, 5)],
             {"n7": ("SKIPPED", "")})
    carried, survivors = run.carry("m", {"file": str(new_file)}, old_db, new_db)
    got = dict(sqlite3.connect(new_db).execute("SELECT job_id, test_outcome FROM work_results").fetchall())
    assert got == {"n1": "KILLED", "n2": "SURVIVED", "n7": "SKIPPED"}
    assert (carried, survivors) == (2, 1)
    out = sqlite3.connect(new_db).execute("SELECT output FROM work_results WHERE job_id = 'n1'").fetchone()[0]
    assert out.startswith("carried from old.sqlite")


def test_carry_pairs_a_twin_line_only_when_both_sessions_hold_as_many(tmp_path):
    """The control of the twin case above: with neither copy edited, both ``y = 0`` lines keep their
    own outcomes, in order."""
    src = "a = 1\ny = 0\na = 1\ny = 0\na = 1\n"
    (tmp_path / "m.py").write_text(src)
    old_db, new_db = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    _session(old_db, [("o1", NUM, 0, 2, 4, 2, 5), ("o2", NUM, 1, 4, 4, 4, 5)],
             {"o1": ("KILLED", _diff(src, 2, "y = 1")), "o2": ("SURVIVED", _diff(src, 4, "y = 1"))})
    _session(new_db, [("n1", NUM, 0, 2, 4, 2, 5), ("n2", NUM, 1, 4, 4, 4, 5)], {})
    assert run.carry("m", {"file": str(tmp_path / "m.py")}, old_db, new_db) == (2, 1)
    got = dict(sqlite3.connect(new_db).execute("SELECT job_id, test_outcome FROM work_results").fetchall())
    assert got == {"n1": "KILLED", "n2": "SURVIVED"}


@pytest.mark.parametrize("row, key", [((2, 4, 2, 5), ("op", "a = 1", "b = 2", None, 4, 5)), ((2, 4, 3, 1), None)])
def test_a_mutant_s_key_is_its_line_its_neighbours_and_its_place_on_it(row, key):
    assert run._single_line_key("op", "b = 2", row, ("a = 1", None)) == key
    assert run._diff_line_and_around(_diff("a = 1\nb = 2", 2, "b = 3")) == ("b = 2", ("a = 1", None))
