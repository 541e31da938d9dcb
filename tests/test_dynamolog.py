"""DynamoLogScanner on the real dynamo captures, plus rank-prefixed and reformatted copies of them."""

from __future__ import annotations

import dataclasses
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


# ------------------------------------------------------------------------------------------------
# DynamoLogScanner at its edges:
# records from a plain logging formatter, the limit warning whose attempt was already released (the count taken back),
# which record a warning absorbs (the same attempt, the same process), the released records' bound, the counters after
# a take-back, records fed several lines at once or glued after a progress bar, and each event's fields.

G = "V1130 06:49:43.015000 {pid} torch/_dynamo/guards.py:5396] [{f}/{c}] [__recompiles] "
W = "W1130 06:50:34.283000 {pid} torch/_dynamo/convert_frame.py:1994] [{f}/{c}] "
B = "V1130 06:50:35.832000 {pid} torch/_dynamo/symbolic_convert.py:5124] [{f}/{c}] [__graph_breaks] "


def recompile(f: int, c: int, reasons=("0/0: tensor 'ids' size mismatch at index 1. expected 17, actual 33",),
              pid: int = 8003, fn: str = "forward", pfx: str = "") -> list[str]:
    g = pfx + G.format(pid=pid, f=f, c=c)
    return ([g + f"Recompiling function {fn} in train.py:61", g + "    triggered by the following guard failure(s):"]
            + [g + f"    - {r}" for r in reasons])


def limit(f: int, c: int, pid: int = 8003, fn_line: str | None = "function: 'forward' (train.py:61)",
          reason: str | None = "0/3: tensor 'ids' size mismatch at index 1. expected 49, actual 65") -> list[str]:
    w = W.format(pid=pid, f=f, c=c)
    return ([w + "torch._dynamo hit config.recompile_limit (4)"] + ([w + "   " + fn_line] if fn_line else [])
            + ([w + f"   last reason: {reason}"] if reason else []))


def scan(lines: list[str], flush: bool = True) -> tuple[DynamoLogScanner, list]:
    s = DynamoLogScanner()
    out = []
    for ln in lines:
        out += s.feed(ln)
    if flush:
        out += s.flush()
    return s, out


OTHER = "I1130 06:50:40.000000 8003 torch/_inductor/foo.py:10] compiled a kernel"  # another record of that process


def test_the_events_are_frozen_values():
    for ev in (Recompile("f", None, None, None, None), RecompileLimit("f", 4, None), GraphBreak("r", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.rank = 3
        assert not hasattr(ev, "__dict__")


def test_a_recompile_has_its_first_failure_as_reason_and_every_count_is_exact():
    s, out = scan(recompile(0, 1, ("0/0: a 1", "0/0: b 2")) + [OTHER] + recompile(0, 2, ("0/1: a 7",))
                  + recompile(1, 1, ("1/0: c 3",), fn="step"))
    assert [(e.function, e.reason, e.reasons, e.frame_id, e.compile_id, e.pid) for e in out] == [
        ("forward", "a 1", ("0/0: a 1", "0/0: b 2"), 0, 1, 8003), ("forward", "a 7", ("0/1: a 7",), 0, 2, 8003),
        ("step", "c 3", ("1/0: c 3",), 1, 1, 8003)]
    assert s.recompiles == 3 and dict(s.function_counts) == {"forward": 2, "step": 1}
    assert dict(s.reason_counts) == {"a N": 2, "c N": 1} and s.most_common_reason() == ("a N", 2)
    c = s.counts()
    assert (c["top_recompile_reason"], c["top_recompile_reason_count"]) == ("a N", 2)
    assert s.implied_graphs == 3 + 2  # frame 0 up to compile 2, frame 1 up to compile 1
    empty = DynamoLogScanner().counts()
    assert (empty["top_recompile_reason"], empty["top_recompile_reason_count"], empty["recompiles"]) == (None, 0, 0)
    assert DynamoLogScanner().most_common_reason() is None
    _, zero = scan(recompile(2, 0))  # a record that says compile 0 (hostile, or an odd torch): one graph
    s0, _ = scan(recompile(2, 0))
    assert s0.implied_graphs == 1 and zero[0].compile_id == 0


def test_a_limit_warning_absorbs_only_its_own_attempt():
    s, out = scan(recompile(0, 4) + limit(0, 4))  # the attempt that hit the limit: no recompile
    assert (s.recompiles, s.recompile_limit_hits) == (0, 1)
    assert [type(e) for e in out] == [RecompileLimit] and out[0].function == "forward"
    for rec_c in (3, 5):  # another attempt's record before the warning: a recompile of its own
        s, out = scan(recompile(0, rec_c) + limit(0, 4))
        assert (s.recompiles, s.recompile_limit_hits) == (1, 1), rec_c
    for pid in (8002, 8004):  # another process's record: never absorbed
        s, out = scan(recompile(0, 4, pid=pid) + limit(0, 4))
        assert (s.recompiles, s.recompile_limit_hits) == (1, 1), pid


def test_an_absorbed_records_first_reason_is_the_limits_until_the_warning_says_its_own():
    s, out = scan(recompile(0, 4, ("0/3: first 1", "0/2: second 2")) + limit(0, 4, fn_line=None, reason=None))
    assert out == [RecompileLimit("forward", 4, None, "recompile_limit", 0, 4, "first 1", "train.py:61")]
    s, out = scan(recompile(0, 4, ()) + limit(0, 4, fn_line=None, reason=None))  # no failure line: no reason
    assert out[0].last_reason is None and out[0].function == "forward"
    s, out = scan(limit(0, 4, fn_line="function: 'step' (model.py:9)", reason="0/3: own 5"))
    assert (out[0].function, out[0].location, out[0].last_reason) == ("step", "model.py:9", "own 5")
    s, out = scan(recompile(0, 4) + limit(0, 4, fn_line="function: 'forward'", reason=None))  # no location
    assert out[0].location == "train.py:61"  # the absorbed record's


def test_a_warning_after_its_record_was_released_takes_the_count_back():
    lines = recompile(2, 3, ("2/2: a 1",)) + [OTHER] + limit(2, 3)  # released by the other line first
    s, out = scan(lines)
    assert (s.recompiles, s.recompile_limit_hits) == (0, 1)
    assert dict(s.reason_counts) == {} and dict(s.function_counts) == {} and s.most_common_reason() is None
    assert s.implied_graphs == 3  # frame 2's highest counted compile is 2 now
    two = recompile(2, 2, ("2/1: a 9",)) + recompile(2, 3, ("2/2: a 1",)) + [OTHER] + limit(2, 3)
    s, _ = scan(two)
    assert s.recompiles == 1 and dict(s.reason_counts) == {"a N": 1} and dict(s.function_counts) == {"forward": 1}
    later = recompile(0, 3) + recompile(0, 5) + [OTHER] + limit(0, 3)  # a later compile stays the frame's highest
    s, _ = scan(later)
    assert s.recompiles == 1 and s.implied_graphs == 6
    first = recompile(0, 0) + [OTHER] + limit(0, 0)  # compile 0 taken back: the frame implies nothing
    s, _ = scan(first)
    assert s.recompiles == 0 and s.implied_graphs == 0


def test_released_records_are_bounded_at_256():
    lines = []
    for k in range(300):
        lines += recompile(0, k + 1, (f"0/{k}: r {k}",)) + [OTHER]
    s, _ = scan(lines + limit(0, 44))  # the 44th record (compile 44) is beyond the newest 256: not taken back
    assert s.recompiles == 300
    s, _ = scan(lines + limit(0, 45))  # the 45th is among them: taken back
    assert s.recompiles == 299


def test_records_from_a_plain_logging_formatter():
    rec = ["Recompiling function forward in train.py:61", "    triggered by the following guard failure(s):",
           "    - 0/0: tensor 'x' size mismatch", "    -", "    guard failure detail"]
    s, out = scan(rec + ["epoch 1 done"])
    assert len(out) == 1 and out[0].reasons == ("0/0: tensor 'x' size mismatch",) and out[0].pid is None
    assert s.implied_graphs == 0 and s.recompiles == 1  # no ids: no graphs implied, no crash
    lim = ["torch._dynamo hit config.recompile_limit (8)", "   function: 'forward' (train.py:61)",
           "   last reason: 0/7: guard x"]
    s = DynamoLogScanner()
    got = [s.feed(ln) for ln in lim]
    assert got[:2] == [[], []] and got[2] == [RecompileLimit("forward", 8, None, "recompile_limit", None, None,
                                                             "guard x", "train.py:61")]  # at its last line
    s = DynamoLogScanner()
    assert s.feed(lim[0]) == [] and s.feed("   - 0/0: not a limit's line") != []  # closes the warning: emitted
    s = DynamoLogScanner()
    s.feed(rec[0])
    got = s.feed("   function: 'forward' (train.py:61)")  # a limit's line ends a recompile record
    assert [type(e) for e in got] == [Recompile] and got[0].reasons == ()
    s, out = scan(["torch._dynamo is quiet today", "nothing more"])  # a keyword, no record: nothing, no crash
    assert out == [] and s.recompiles == 0


def test_a_record_fed_in_one_piece_or_glued_after_a_progress_bar():
    s = DynamoLogScanner()
    out = s.feed("\n".join(recompile(0, 1)) + "\n" + OTHER + "\n")
    assert len(out) == 1 and out[0].reasons == ("0/0: tensor 'ids' size mismatch at index 1. expected 17, actual 33",)
    s = DynamoLogScanner()
    out = s.feed("\r".join(recompile(0, 1)) + "\r" + OTHER)
    assert len(out) == 1 and len(out[0].reasons) == 1
    glued = " 40%|████      | 40/100 [00:04<00:06,  9.8it/s][rank1]:" + recompile(0, 1)[0]
    s, out = scan([glued, *("[rank1]:" + ln for ln in recompile(0, 1)[1:])])
    assert out[0].rank == 1 and len(out[0].reasons) == 1
    s, out = scan([OTHER.replace("_inductor", "_dynamo")])  # a dynamo line that opens nothing
    assert out == []


def test_a_record_ends_at_another_records_line_of_its_rank_whatever_its_level():
    for level in ("W", "I", "E"):
        other = f"{level}1130 06:50:40.000000 8003 torch/_dynamo/other.py:1] - 0/0: not a failure of the record"
        s, out = scan(recompile(0, 1, ("0/0: a 1",)) + [other])
        assert out[0].reasons == ("0/0: a 1",), level


def test_graph_breaks_closed_with_or_without_their_reason_line():
    b = B.format(pid=8003, f=1, c=0)
    s, out = scan([b + "Graph break in user code at train.py:183", b + "User code traceback:",
                   b + "Graph Break Reason: print() is not traceable", b + "Graph Break Reason: a second one"])
    assert out == [GraphBreak("print() is not traceable", None, "train.py:183", 1, 0)] and s.graph_breaks == 1
    s, out = scan([b + "Graph break in user code at train.py:183"])  # closed by flush, no reason line
    assert out == [GraphBreak("Graph break in user code at train.py:183", None, "train.py:183", 1, 0)]
    assert (s.graph_breaks, s.recompile_limit_hits) == (1, 0)
    s, out = scan(limit(0, 4, reason=None))  # a warning closed by flush: emitted then
    assert [type(e) for e in out] == [RecompileLimit] and (s.recompile_limit_hits, s.graph_breaks) == (1, 0)


def test_a_plain_record_ends_at_a_line_that_is_none_of_its_own():
    for other in ("   ", "(x) unrelated", "+1 more", "# note", "!!"):
        s = DynamoLogScanner()
        s.feed("Recompiling function forward in train.py:61")
        s.feed("    - 0/0: tensor 'x' size mismatch")
        got = s.feed(other)
        assert [type(e) for e in got] == [Recompile] and got[0].reasons == ("0/0: tensor 'x' size mismatch",), other


def test_a_second_warning_or_a_graph_break_is_never_absorbed_as_a_recompile():
    s, out = scan(limit(0, 4, reason=None) + limit(0, 4, reason=None))  # the same warning twice, no last reason yet
    assert s.recompile_limit_hits == 2 and [type(e) for e in out] == [RecompileLimit, RecompileLimit]
    b = B.format(pid=8003, f=1, c=0)
    s, out = scan([b + "Graph break in user code at train.py:183"] + limit(1, 0))
    assert (s.graph_breaks, s.recompile_limit_hits, s.recompiles) == (1, 1, 0)
    assert [type(e) for e in out] == [GraphBreak, RecompileLimit]
