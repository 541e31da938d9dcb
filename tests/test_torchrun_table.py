"""torchrun's failure table, line by line (beyond the real capture, whose ranks equal their
local ranks):
each field from its own group, the root cause only after its header, at most 256 entries, a line
over 300 characters ignored, an exit code line with no rank line before it, signal names."""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.monitors.parsers.torchrun import MAX_ENTRIES, FailureTable, RankFailure, signal_name

TABLE = """\
[default0]:torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  time      : 2026-12-01_13:47:17
  host      : node7
  rank      : 11 (local_rank: 3)
  exitcode  : 1 (pid: 40211)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_13:47:16
  host      : node7
  rank      : 9 (local_rank: 1)
  exitcode  : -9 (pid: 40209)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 40209
"""


def feed(text: str) -> FailureTable:
    t = FailureTable()
    for ln in text.splitlines():
        t.feed(ln)
    return t


def test_each_field_comes_from_its_own_place_and_the_root_cause_from_its_header():
    t = feed(TABLE)
    assert t.entries == [RankFailure(11, 3, 1, 40211, False), RankFailure(9, 1, -9, 40209, True)]
    assert t.entries[0].how() == "exited with code 1" and t.entries[1].how() == "killed by SIGKILL"
    assert t.by_pid() == {40211: t.entries[0], 40209: t.entries[1]}
    assert feed("[rank3]:  rank      : 5 (local_rank: 2)\n[rank3]:  exitcode  : -15 (pid: 77)\n").entries == [
        RankFailure(5, 2, -15, 77, False)]  # behind a rank prefix; no header yet: no root cause


def test_a_table_read_half_written_names_no_failure_until_its_root_cause_is_read():
    """torchrun prints the torn-down ranks before the root cause: a log caught mid-print must not
    make a SIGTERMed rank the first death (it did, under load, in test_ranks)."""
    head, tail = TABLE.split("Root Cause")
    t = feed(head)
    assert t.entries == [] and t.pending == [RankFailure(11, 3, 1, 40211, False)]
    for ln in ("Root Cause" + tail).splitlines():
        t.feed(ln)
    assert t.entries == [RankFailure(11, 3, 1, 40211, False), RankFailure(9, 1, -9, 40209, True)]
    assert t.pending == []


def test_an_exit_code_needs_its_rank_line_and_a_new_header_forgets_a_pending_rank():
    assert feed("  exitcode  : -9 (pid: 1234)\n").entries == []  # no rank line before it: nothing, no crash
    t = feed("  rank      : 4 (local_rank: 0)\nRoot Cause (first observed failure):\n  exitcode  : -9 (pid: 9)\n")
    assert t.entries == []
    t = feed("  rank      : 4 (local_rank: 0)\nFailures:\n  exitcode  : -9 (pid: 9)\n")
    assert t.entries == [] and t.pending == []
    t = feed("  rank      : 4 (local_rank: 0)\n  exitcode  : 2 (pid: 9)\n  exitcode  : 3 (pid: 10)\n")
    assert t.entries == [RankFailure(4, 0, 2, 9, False)]  # one rank line, one entry


def test_at_most_256_entries_and_a_line_of_301_characters_is_ignored():
    entry = "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: {})\n"
    t = feed("".join(entry.format(1000 + k) for k in range(300)))
    assert MAX_ENTRIES == 256 and len(t.entries) == 256 and t.entries[-1].pid == 1255
    rank, code = "  rank      : 6 (local_rank: 2)", "  exitcode  : -9 (pid: 5)"
    assert feed(rank.ljust(300) + "\n" + code.ljust(300) + "\n").entries == [RankFailure(6, 2, -9, 5, False)]
    assert feed(rank.ljust(301) + "\n" + code + "\n").entries == []
    assert feed(rank + "\n" + code.ljust(301) + "\n").entries == []


def test_signal_names_from_negative_exit_codes():
    assert (signal_name(-9), signal_name(-15), signal_name(-1), signal_name(-11)) == ("SIGKILL", "SIGTERM", "SIGHUP",
                                                                                      "SIGSEGV")
    assert signal_name(0) is None and signal_name(1) is None and signal_name(-999) is None  # unknown: no name, no raise
    assert RankFailure(0, 0, -999, 1, False).how() == "exited with code -999"


def test_an_entry_is_a_frozen_value():
    e = RankFailure(1, 1, -9, 5, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.pid = 6
    assert not hasattr(e, "__dict__")  # slotted: thousands of them cost no dicts
