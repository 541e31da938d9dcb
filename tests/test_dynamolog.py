"""DynamoLogScanner on the real dynamo captures, plus rank-prefixed and reformatted copies of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import FIXTURES_REAL
from stepwatch.monitors.parsers.dynamolog import DynamoLogScanner, GraphBreak, Recompile, RecompileLimit, normalize_reason
from stepwatch.monitors.readers.textlog import LogFollower

FIXTURES = FIXTURES_REAL


def scan_file(path: Path) -> tuple[DynamoLogScanner, list]:
    """Follow the file like the app does (segments from LogFollower) and scan every segment once."""
    f = LogFollower(path, from_start=True)
    sc = DynamoLogScanner()
    events = []
    for s in f.poll():
        if not s.is_note:
            events += sc.feed(s.text)
    events += sc.flush()
    return sc, events


def scan_lines(lines: list[str]) -> tuple[DynamoLogScanner, list]:
    sc = DynamoLogScanner()
    events = []
    for line in lines:
        events += sc.feed(line)
    events += sc.flush()
    return sc, events


def fixture_lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_recompiles_fixture_truth_3_recompiles_1_limit_hit_1_graph_break() -> None:
    sc, events = scan_file(FIXTURES / "dynamo_recompiles.log")
    # 4 'Recompiling' records, but the one at [0/4] is the attempt that hit the limit
    assert sum(1 for line in fixture_lines("dynamo_recompiles.log") if "Recompiling function" in line) == 4
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (3, 1, 1)
    assert sc.implied_graphs == 4  # 1 first compile + 3 recompiles (the truth: unique_graphs=4)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Recompile", "Recompile", "Recompile", "RecompileLimit", "GraphBreak"]
    recs = [e for e in events if isinstance(e, Recompile)]
    assert [(r.function, r.frame_id, r.compile_id, r.rank) for r in recs] == [
        ("forward", 0, 1, None), ("forward", 0, 2, None), ("forward", 0, 3, None),
    ]
    assert recs[0].reason == "tensor 'ids' size mismatch at index 1. expected 17, actual 33"
    assert recs[2].reasons[0] == "0/2: tensor 'ids' size mismatch at index 1. expected 49, actual 65"
    assert len(recs[2].reasons) == 3
    assert recs[0].location == "<fixtures>/scripts/dynamo_recompile.py:61"
    limit = events[3]
    assert isinstance(limit, RecompileLimit)
    assert (limit.function, limit.limit, limit.limit_name, limit.rank, limit.frame_id, limit.compile_id) == (
        "forward", 4, "recompile_limit", None, 0, 4,
    )
    assert limit.last_reason == "tensor 'ids' size mismatch at index 1. expected 65, actual 81"
    gb = events[4]
    assert isinstance(gb, GraphBreak)
    assert gb.reason.startswith("Encountered graph break when attempting to trace CALL")
    assert gb.location == "<fixtures>/scripts/dynamo_recompile.py:183" and (gb.frame_id, gb.compile_id) == (1, 0)
    assert sc.most_common_reason() == ("tensor 'ids' size mismatch at index N. expected N, actual N", 3)
    assert sc.counts()["limit_hits"] == [{"function": "forward", "rank": None, "limit": 4}]


def test_limit_warning_found_without_torch_logs() -> None:
    sc, events = scan_file(FIXTURES / "dynamo_limit_default.log")
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (0, 1, 0)
    assert [(e.function, e.limit) for e in events] == [("forward", 4)]


@pytest.mark.parametrize(
    "name", ["hf_trainer_plain.log", "hf_trainer_tty.log", "hf_trainer_slow.log", "hf_trainer_printer_callback.log"]
)
def test_logs_without_dynamo_records_give_none(name: str) -> None:
    sc, events = scan_file(FIXTURES / name)
    assert events == []
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (0, 0, 0)


def test_glued_record_after_a_tqdm_bar_is_found() -> None:
    sc, events = scan_file(FIXTURES / "hf_trainer_compile.log")
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (1, 0, 0)
    (r,) = events
    assert isinstance(r, Recompile)
    assert r.function == "wrapped_func" and (r.frame_id, r.compile_id) == (0, 1)
    assert r.reason == "tensor 'kwargs['input_ids']' size mismatch at index 1. expected 49, actual 129"
    assert r.location == "<venv>/lib/python3.11/site-packages/transformers/utils/deprecation.py:121"


@pytest.mark.parametrize("prefix,rank", [("[rank3]:", 3), ("[default3]:", 3), ("[default2]:[rank5]:", 5)])
def test_rank_prefixes(prefix: str, rank: int) -> None:
    lines = [prefix + line for line in fixture_lines("dynamo_recompiles.log")]
    sc, events = scan_lines(lines)
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (3, 1, 1)
    assert {e.rank for e in events} == {rank}
    assert sc.limit_hits[0].function == "forward" and sc.limit_hits[0].rank == rank


def test_glued_record_keeps_the_torchrun_prefix_rank() -> None:
    seg = [s for s in fixture_lines("hf_trainer_compile.log")]
    text = (FIXTURES / "hf_trainer_compile.log").read_text()
    glued = re.search(r"  2%\|[^\r\n]*V1130[^\n]*", text).group(0)
    rest = [line for line in seg if "[__recompiles]     " in line]
    sc, events = scan_lines(["[default1]:" + glued] + ["[default1]:" + r for r in rest])
    assert [(e.function, e.rank) for e in events] == [("wrapped_func", 1)]


def test_two_ranks_interleaved_line_by_line() -> None:
    base = fixture_lines("dynamo_recompiles.log")
    lines = []
    for line in base:
        lines.append("[rank0]:" + line)
        lines.append("[rank1]:" + line.replace(" 8003 ", " 8004 "))
    sc, events = scan_lines(lines)
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (6, 2, 2)
    assert sorted(e.rank for e in sc.limit_hits) == [0, 1]


def test_plain_logging_formatter_variant() -> None:
    """The same records as a plain ``logging`` formatter prints them (no prefix on continuation lines)."""
    glog = re.compile(r"^[VIWEDC]\d{4} \S+ +\d+ \S+\] (?:\[\d+/\d+\] )?(?:\[__\w+\] ?)?")
    lines = []
    for line in fixture_lines("dynamo_recompiles.log"):
        m = glog.match(line)
        if not m:
            lines.append(line)
            continue
        body = line[m.end():]
        if "Recompiling function" in body:
            lines.append("DEBUG:torch._dynamo.guards.__recompiles:" + body)
        elif "hit config." in body:
            lines.append("WARNING:torch._dynamo.convert_frame:" + body)
        elif "[__graph_breaks]" in line:
            continue
        else:
            lines.append(body)
    sc, _events = scan_lines(lines)
    assert (sc.recompiles, sc.recompile_limit_hits) == (3, 1)
    assert sc.limit_hits[0].function == "forward"


def test_limit_after_the_record_was_released_still_counts_right() -> None:
    lines = fixture_lines("dynamo_recompiles.log")
    i = next(k for k, line in enumerate(lines) if "hit config.recompile_limit" in line)
    sc = DynamoLogScanner()
    for line in lines[:i]:
        sc.feed(line)
    released = sc.flush()  # e.g. an idle flush before the warning arrived
    assert [type(e).__name__ for e in released] == ["Recompile"] and sc.recompiles == 4
    for line in lines[i:]:
        sc.feed(line)
    sc.flush()
    assert (sc.recompiles, sc.recompile_limit_hits, sc.graph_breaks) == (3, 1, 1)
    assert sc.most_common_reason() == ("tensor 'ids' size mismatch at index N. expected N, actual N", 3)
    assert sc.implied_graphs == 4


def test_limit_is_reported_without_waiting_for_a_later_line() -> None:
    """The limit warning is the alert: it comes out of feed() at its 'last reason' line."""
    lines = [line for line in fixture_lines("dynamo_limit_default.log") if line.startswith("W1130")]
    sc = DynamoLogScanner()
    out = []
    for line in lines[:3]:
        out += sc.feed(line)
    assert [type(e).__name__ for e in out] == ["RecompileLimit"]


def test_normalize_reason() -> None:
    assert normalize_reason("tensor 'ids' size mismatch at index 1. expected 17, actual 33") == (
        "tensor 'ids' size mismatch at index N. expected N, actual N"
    )
