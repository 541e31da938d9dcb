"""The supervisor's log step timer on exact arrivals (LogStepTimer and RankLogTimers
fed exact times, which no real run can pin): one record per step per update, k
steps sharing an update's interval, the program's own reported times with the arrival figure
beside them, a counter that goes back, the first record flagged, and the per-rank timers' bounds."""

from __future__ import annotations

import json

import pytest

from stepwatch.monitors.readers.textlog import Segment
from stepwatch.monitors.parsers.logtracker import LogTracker
from stepwatch.monitors.watch.logsteps import LogStepTimer, RankLogTimers, encode_records


def bar(step: int, total: int = 100, pfx: str = "") -> str:
    filled = "█" * (10 * step // total)
    return f"{pfx}{100 * step // total:3d}%|{filled:<10}| {step}/{total} [00:01<00:09,  9.00it/s]"


def seg(text: str, at: float, seq: int, end: str = "\r") -> Segment:
    return Segment(text, end, at_s=at, poll_seq=seq)


def polls(timer: LogStepTimer, items: list[tuple[list[str], float]], partial: bool = False) -> list[list[dict]]:
    out = []
    for seq, (texts, at) in enumerate(items, 1):
        segs = [seg(t, at, seq) for t in texts]
        if partial:
            out.append(timer.feed_poll(segs[:-1], segs[-1]))
        else:
            out.append(timer.feed_poll(segs, None))
    return out


def test_one_update_per_step_gives_one_record_each_the_first_flagged():
    got = polls(LogStepTimer(), [([bar(0)], 10.0), ([bar(1)], 10.5), ([bar(2)], 10.75), ([bar(2)], 11.0),
                                 ([bar(3)], 11.25)])
    assert got[0] == [] and got[3] == []  # the bar's first drawing times nothing; a redraw is no step
    recs = [r for g in got for r in g]
    assert [(r["step"], r["dt"], r["step_begin"], r["step_end"], r["t"]) for r in recs] == [
        (1, 0.5, 10.0, 10.5, 10.5), (2, 0.25, 10.5, 10.75, 10.75), (3, 0.5, 10.75, 11.25, 11.25)]
    assert [r["flags"] for r in recs] == [["first"], [], []]
    assert {(r["timing"], r["steps_in_update"], r["rank"], r["kind"], r["v"]) for r in recs} == {("per_update", 1, 0, "step", 1)}
    assert all(r["tokens"] is None and r["padded_tokens"] is None for r in recs)


def test_steps_sharing_an_update_share_its_interval():
    got = polls(LogStepTimer(), [([bar(10)], 20.0), ([bar(14)], 21.0)])
    recs = got[1]
    assert [(r["step"], r["dt"], r["step_begin"], r["step_end"]) for r in recs] == [
        (11, 0.25, 20.0, 20.25), (12, 0.25, 20.25, 20.5), (13, 0.25, 20.5, 20.75), (14, 0.25, 20.75, 21.0)]
    assert {(r["timing"], r["steps_in_update"]) for r in recs} == {("shared", 4)}
    assert [r["flags"] for r in recs] == [["first"], [], [], []]


def test_the_tail_of_a_poll_counts_and_an_interval_of_zero_times_nothing():
    t = LogStepTimer()
    got = polls(t, [(["loading", bar(0)], 5.0), (["noise", bar(1)], 5.5)], partial=True)
    assert [r["step"] for r in got[1]] == [1]
    assert polls(t, [([bar(2)], 5.5)]) == [[]]  # the same arrival time: no interval to share
    assert [(r["step"], r["dt"]) for r in polls(t, [([bar(3)], 6.0)])[0]] == [(3, 0.5)]


def single_bar_timer() -> LogStepTimer:
    """A timer whose tracker follows one bar wherever its counter goes (the bar's description fixed): how
    the timer handles a counter that went back, apart from telling several processes' bars apart (that is
    tests/test_logvariants.py's: there a new bar takes over only once the old one stopped)."""
    return LogStepTimer(LogTracker(desc=""))


def test_a_counter_that_goes_back_starts_over_without_a_record():
    t = single_bar_timer()
    polls(t, [([bar(50)], 1.0), ([bar(51)], 2.0)])
    assert polls(t, [([bar(0)], 3.0)]) == [[]]  # a second train() of the same length, or a resumed run
    got = polls(t, [([bar(1)], 3.5), ([bar(2)], 4.25)])
    assert [(r["step"], r["dt"], r["flags"]) for r in got[0] + got[1]] == [(1, 0.5, []), (2, 0.75, [])]


def test_reported_times_are_the_programs_and_the_arrival_rides_beside():
    t = LogStepTimer()
    lines = [("iter 0: loss 4.2, time 900.00ms, mfu -100.00%", 1.0), ("iter 1: loss 4.1, time 250.00ms, mfu 1.00%", 1.5),
             ("iter 2: loss 4.0, time 125.00ms, mfu 1.00%", 1.75), ("iter 5: loss 3.9, time 250.00ms, mfu 1.00%", 2.5)]
    recs = [r for g in polls(t, [([ln], at) for ln, at in lines]) for r in g]
    assert [(r["step"], r["dt"], r["timing"], r["steps_in_update"], r["arrival_dt_s"]) for r in recs] == [
        (0, 0.9, "reported", 1, None), (1, 0.25, "reported", 1, 0.5), (2, 0.125, "reported", 1, 0.25),
        (5, 0.25, "reported", 3, 0.25)]  # 0.75 s over the 3 steps since iter 2
    assert [(r["step_begin"], r["step_end"]) for r in recs][1] == (1.25, 1.5)  # it ended when its line arrived
    assert recs[0]["flags"] == ["first"] and all(r["flags"] == [] for r in recs[1:])
    same = LogStepTimer()  # two printed steps in one read: the second's arrival is no interval
    both = same.feed_poll([seg("iter 0: loss 4.2, time 900.00ms, mfu 1.00%", 1.0, 1, "\n"),
                           seg("iter 1: loss 4.1, time 250.00ms, mfu 1.00%", 1.0, 1, "\n")], None)
    assert [(r["step"], r["arrival_dt_s"]) for r in both] == [(0, None), (1, None)]


def test_records_encode_as_compact_json_lines():
    recs = [{"step": 1, "dt": 0.5}, {"step": 2, "dt": 0.25}]
    assert encode_records(recs) == b'{"step":1,"dt":0.5}\n{"step":2,"dt":0.25}\n'
    assert [json.loads(x) for x in encode_records(recs).splitlines()] == recs and encode_records([]) == b""


def test_per_rank_timers_take_prefixed_lines_only_and_are_bounded():
    timers = RankLogTimers()
    for seq, at in enumerate((1.0, 1.5), 1):
        step = seq - 1
        segs = [seg(bar(step, pfx=f"[default{r}]:"), at, seq) for r in range(1, 300)]
        segs += [seg(bar(step, pfx="[rank99999]:"), at, seq), seg(bar(step, pfx="[rank100000]:"), at, seq),
                 Segment(bar(step, pfx="[rank7777]:"), "\n", at_s=at, poll_seq=seq, is_note=True),
                 seg(" " + bar(step, pfx="[rank5555]:"), at, seq)]
        got = timers.feed_poll(segs, None)
    assert len(timers.timers) == 256 and RankLogTimers.MAX_RANKS == 256  # a log can print any number of prefixes
    odd = RankLogTimers()  # each refusal on its own, far below the cap
    for seq, at in enumerate((1.0, 1.5), 1):
        step = seq - 1
        odd.feed_poll([seg(bar(step, pfx="[rank99999]:"), at, seq), seg(bar(step, pfx="[rank100000]:"), at, seq),
                       Segment(bar(step, pfx="[rank7777]:"), "\n", at_s=at, poll_seq=seq, is_note=True),
                       seg(" " + bar(step, pfx="[rank5555]:"), at, seq)], None)
    assert sorted(odd.timers) == [99999]  # not rank 100000, not a note of stepwatch's, not an indented line
    assert sorted(got)[:3] == [1, 2, 3] and all(got[r][0]["rank"] == r and got[r][0]["step"] == 1 for r in got)
    few = RankLogTimers()
    few.feed_poll([seg(bar(0, pfx="[rank99999]:"), 1.0, 1)], seg(bar(0, pfx="[rank3]:"), 1.0, 1))
    got = few.feed_poll([seg(bar(1, pfx="[rank99999]:"), 2.0, 2)], seg(bar(1, pfx="[rank3]:"), 2.0, 2))
    assert sorted(got) == [3, 99999] and got[3][0]["dt"] == 1.0  # the tail belongs to its own rank's timer


@pytest.mark.parametrize("rank", [0, None])
def test_rank_0_and_unprefixed_lines_never_start_a_rank_timer(rank):
    timers = RankLogTimers()
    pfx = "" if rank is None else f"[rank{rank}]:"
    for seq in (1, 2):
        timers.feed_poll([seg(bar(seq - 1, pfx=pfx), float(seq), seq)], None)
    assert timers.timers == {}


def test_a_rank_over_the_cap_never_stops_the_known_ranks_of_the_same_read():
    timers = RankLogTimers()
    for r in range(1, 257):
        timers.feed_poll([seg(bar(0, pfx=f"[rank{r}]:"), 1.0, 1)], None)
    got = timers.feed_poll([seg(bar(1, pfx="[rank900]:"), 2.0, 2), seg(bar(1, pfx="[rank5]:"), 2.0, 2)], None)
    assert list(got) == [5] and 900 not in timers.timers


def test_a_clock_that_steps_back_times_nothing():
    t = LogStepTimer()
    polls(t, [([bar(0)], 100.0), ([bar(1)], 101.0)])
    assert polls(t, [([bar(2)], 99.5)]) == [[]]  # the wall clock went back: no negative step time
    lines = [("iter 0: loss 4.2, time 900.00ms, mfu 1.00%", 100.0), ("iter 1: loss 4.1, time 250.00ms, mfu 1.00%", 99.0)]
    recs = [r for g in polls(LogStepTimer(), [([ln], at) for ln, at in lines]) for r in g]
    assert [(r["step"], r["dt"], r["arrival_dt_s"]) for r in recs] == [(0, 0.9, None), (1, 0.25, None)]


def test_reported_steps_that_go_back_start_over_without_a_record():
    t = LogStepTimer()
    lines = [("iter 10: loss 4.2, time 100.00ms, mfu 1.00%", 1.0), ("iter 11: loss 4.1, time 100.00ms, mfu 1.00%", 1.5),
             ("iter 0: loss 9.9, time 500.00ms, mfu 1.00%", 2.0)]  # a relaunched loop printing from 0 again
    got = polls(t, [([ln], at) for ln, at in lines])
    assert [r["step"] for r in got[0] + got[1]] == [10, 11] and got[2] == []


def test_printed_steps_going_forward_then_back_in_one_read_start_over_without_a_record():
    t = LogStepTimer()
    polls(t, [(["iter 10: loss 4.2, time 100.00ms, mfu 1.00%"], 1.0)])
    both = t.feed_poll([seg("iter 11: loss 4.1, time 100.00ms, mfu 1.00%", 2.0, 2, "\n"),
                        seg("iter 0: loss 9.9, time 500.00ms, mfu 1.00%", 2.0, 2, "\n")], None)
    assert both == []  # the counter went back within the read: a new run, nothing timed across it
    after = t.feed_poll([seg("iter 1: loss 9.8, time 250.00ms, mfu 1.00%", 3.0, 3, "\n")], None)
    assert [(r["step"], r["dt"]) for r in after] == [(1, 0.25)]


def test_a_new_bar_that_reaches_the_last_timed_step_within_one_poll_times_nothing_then_goes_on():
    """Step 5 timed; then one poll holds a new bar (1/100) drawn up to 5/100 again: the counter is
    where the last timed step was, no interval to share (no record, no division by zero steps). The
    next advance is timed from that poll."""
    got = polls(single_bar_timer(), [([bar(4)], 10.0), ([bar(5)], 11.0),
                                     ([bar(1), bar(2), bar(3), bar(4), bar(5)], 12.0), ([bar(6)], 12.5)])
    assert [r["step"] for r in got[1]] == [5] and got[2] == []
    assert [(r["step"], r["dt"], r["step_begin"]) for r in got[3]] == [(6, 0.5, 12.0)]


def test_a_new_bar_below_the_last_timed_step_times_from_its_own_first_poll():
    """Step 50 timed; a second train() starts a bar at 1/100: nothing is timed across the restart;
    2/100 is timed from 1/100's poll."""
    got = polls(single_bar_timer(), [([bar(49)], 10.0), ([bar(50)], 11.0), ([bar(1)], 30.0), ([bar(2)], 30.25)])
    assert got[2] == [] and [(r["step"], r["dt"]) for r in got[3]] == [(2, 0.25)]


def test_a_resumed_attempts_jump_over_its_restored_steps_is_one_step_not_41():
    """The HF Trainer resumed from checkpoint-40 draws 0/80, then 41/80 once step 41 ran (capture: the live restart
    test): the restored steps are not this attempt's; step 41 gets the whole interval. The control: a run that was
    not resumed shares the jump's interval among its steps, as before."""
    resumed = polls(LogStepTimer(resume_step=40), [([bar(0, 80)], 10.0), ([bar(41, 80)], 10.6), ([bar(42, 80)], 10.8)])
    assert [(r["step"], round(r["dt"], 3), r["timing"]) for p in resumed for r in p] == [
        (41, 0.6, "per_update"), (42, 0.2, "per_update")]
    fresh = polls(LogStepTimer(), [([bar(0, 80)], 10.0), ([bar(41, 80)], 10.6)])
    assert len(fresh[1]) == 41 and fresh[1][0]["timing"] == "shared"
