"""The mutation tool's own logic, on files of its own (never the product's, so no edit elsewhere can
fail it): equivalent.md's rows name a line by its text, ``--check-ledger`` reports a stale row, and
``run.py --carry`` keeps only the outcomes of mutants whose line did not change. Runs without
cosmic-ray (the tool imports only the standard library until it runs a target). Whether the real
equivalent.md is true to the code is ``python tools/mutation/run.py --check-ledger`` (on demand)."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tools" / "mutation" / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)  # type: ignore[union-attr]

LEDGER = """\
| file | line | in | col | operator | why |
|---|---|---|---|---|---|
| `m.py` | `if a >= b:` |  |  | core/ReplaceComparisonOperator_GtE_Gt | a and b are never equal |
| `m.py` | `x = a \\| b + c` |  | 18 | core/ReplaceBinaryOperator_Add_Sub | c is 0 |
| `m.py` | `return 0` | `F.g` #2 |  | core/NumberReplacer | the second return only |
| `m.py` | `y = 1` | (module) |  | core/NumberReplacer | the module's own |
"""
SOURCE = ("y = 1\nclass F:\n    y = 1\n    def g(self, a, b):\n        if a >= b:\n            return 0\n"
          "        x = a | b + c\n        return 0\n")


def _ledger(tmp_path: Path, source: str = SOURCE, ledger: str = LEDGER) -> list:
    (tmp_path / "m.py").write_text(source)
    (tmp_path / "equivalent.md").write_text(ledger)
    return run.equivalents(tmp_path / "equivalent.md")


def test_a_row_is_read_with_its_scope_its_place_and_an_escaped_bar(tmp_path):
    rows = _ledger(tmp_path)
    assert [(r.text, r.scope, r.nth, r.col) for r in rows] == [
        ("if a >= b:", None, None, None), ("x = a | b + c", None, None, 18), ("return 0", "F.g", 2, None), ("y = 1", "", None, None)]
    assert rows[0].why == "a and b are never equal"


def test_a_row_names_its_line_by_text_so_lines_added_above_leave_it_true(tmp_path):
    """A comment line (or any line) added at the top of the file moves every line down by one: the
    rows still name the same lines, each still holds its operator, and a mutant there is listed."""
    assert run.ledger_problems(_ledger(tmp_path), tmp_path) == []
    rows = _ledger(tmp_path, "# a comment added at the top\n" + SOURCE)
    assert run.ledger_problems(rows, tmp_path) == []
    keys = run.line_keys((tmp_path / "m.py").read_text())
    assert run.listed(rows, "m.py", keys, 6, "core/ReplaceComparisonOperator_GtE_Gt", 13)
    assert run.listed(rows, "m.py", keys, 9, "core/NumberReplacer", 15)  # the second ``return 0`` of F.g
    assert not run.listed(rows, "m.py", keys, 7, "core/NumberReplacer", 19)  # the first one is not listed
    assert run.listed(rows, "m.py", keys, 2, "core/NumberReplacer", 4)  # the module's ``y = 1``
    assert not run.listed(rows, "m.py", keys, 4, "core/NumberReplacer", 8)  # not the class's
    assert run.listed(rows, "m.py", keys, 8, "core/ReplaceBinaryOperator_Add_Sub", 18)
    assert not run.listed(rows, "m.py", keys, 8, "core/ReplaceBinaryOperator_Add_Sub", 6)  # another column


def test_the_ledger_check_reports_a_changed_line_an_ambiguous_row_and_a_missing_operator(tmp_path):
    source = SOURCE.replace("if a >= b:", "if a > b:") + "    def h(self):\n        x = a | b + c\n"
    ledger = LEDGER + "| `m.py` | `y = 1` | (module) |  | core/ReplaceTrueWithFalse | no True there |\n"
    problems = run.ledger_problems(_ledger(tmp_path, source, ledger), tmp_path)
    assert len(problems) == 3, problems
    assert "`if a >= b:`" in problems[0] and "no line of the file reads so" in problems[0]
    assert "`x = a | b + c`" in problems[1] and "2 lines read so (lines 7, 10)" in problems[1]
    assert "does not hold the operator" in problems[2] and "ReplaceTrueWithFalse" in problems[2]


def test_the_operator_check_refuses_a_line_without_its_operator():
    """The patterns the ledger check applies: each finds its operator and misses a line without it."""
    assert run.must_hold("core/ReplaceComparisonOperator_GtE_Gt").search("if a >= b:")
    assert not run.must_hold("core/ReplaceComparisonOperator_GtE_Gt").search("if a > b:")
    assert not run.must_hold("core/NumberReplacer").search("short = self._short")
    assert not run.must_hold("core/ReplaceOrWithAnd").search("if a and b:")
    assert not run.must_hold("core/ReplaceComparisonOperator_Gt_GtE").search("def f(x) -> int:")
    assert not run.must_hold("core/ReplaceComparisonOperator_Lt_LtE").search("if a <= b:")
    assert not run.must_hold("core/ReplaceBinaryOperator_Div_Mul").search("a // b")
    assert not run.must_hold("core/ReplaceComparisonOperator_Is_IsNot").search("if a is not b:")
    assert run.must_hold("core/NoSuchOperator") is None


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


def test_the_report_counts_a_listed_survivor_as_equivalent_and_names_the_rows_no_survivor_matches(tmp_path, monkeypatch):
    """A session over m.py, a comment line added at its top since the ledger was written: the survivor
    on ``if a >= b:`` (line 6 now) is the row's, the one on ``y = 1`` of the class is nobody's, and the
    rows that match no survivor are printed by their text."""
    _ledger(tmp_path, "# added\n" + SOURCE)
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(run, "HERE", tmp_path)
    (tmp_path / ".mutation").mkdir()
    _session(tmp_path / ".mutation" / "t.sqlite",
             [("j1", "core/ReplaceComparisonOperator_GtE_Gt", 0, 6, 13, 6, 15), ("j2", NUM, 1, 4, 8, 4, 9),
              ("j3", NUM, 2, 2, 4, 2, 5)],
             {"j1": ("SURVIVED", ""), "j2": ("SURVIVED", ""), "j3": ("KILLED", "")})
    r = run.report("t", {"file": "m.py"})
    assert (r["mutants"], r["killed"], r["equivalent"], r["survivors"]) == (3, 1, 1, [(4, NUM, 1)])
    assert r["stale_rows"] == ["`x = a | b + c` col 18 core/ReplaceBinaryOperator_Add_Sub",
                               "`return 0` in F.g #2 core/NumberReplacer", "`y = 1` in (module) core/NumberReplacer"]
