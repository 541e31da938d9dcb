"""The straggler, stuck-rank and recompile-storm rules by their numbers: each trip
point, window and floor pinned by a case on either side of it. Pure functions, exact inputs (binary fractions of a second)."""

from __future__ import annotations

import json
from pathlib import Path

from stepwatch.monitors.detectors.storm import recompile_storm
from stepwatch.monitors.detectors.straggler import stuck_ranks, straggler_state
from stepwatch.monitors.snapshot.ranks import RankSteps, cascades, first_of
from stepwatch.monitors.snapshot.types import Rank


def ends(lag_by_rank: dict[int, float], steps: range = range(1, 61), base: float = 1000.0) -> dict[int, dict[int, float]]:
    return {r: {s: base + s + lag for s in steps} for r, lag in lag_by_rank.items()}


def test_a_straggler_needs_two_ranks_and_ten_common_steps():
    one = straggler_state(ends({0: 0.0}))
    assert one["state"] == "not judged" and one["reason"] == "fewer than 2 ranks record their steps (STEPWATCH_ALL_RANKS=1)"
    assert straggler_state({0: ends({0: 0.0})[0], 1: {}})["state"] == "not judged"  # a rank with no step yet
    nine = straggler_state(ends({0: 0.0, 1: 0.5}, range(1, 10)))
    assert nine["state"] == "not judged" and nine["reason"] == "9 step(s) recorded by every rank (judged from 10)"
    assert nine["steps"] == 9
    ten = straggler_state(ends({0: 0.0, 1: 0.5}, range(1, 11)))
    assert ten["state"] == "flagged" and ten["steps"] == 10
    apart = {0: ends({0: 0.0}, range(1, 31))[0], 1: ends({1: 0.5}, range(25, 61))[1]}  # 6 steps in common
    assert straggler_state(apart)["steps"] == 6 and straggler_state(apart)["state"] == "not judged"


def test_a_straggler_is_judged_over_the_last_50_common_steps_by_the_median():
    e = ends({0: 0.0, 1: 0.0}, range(1, 101))
    for s in range(1, 51):
        e[1][s] += 1.0  # rank 1 lagged a second in the first 50 steps, never since
    got = straggler_state(e)
    assert got["steps"] == 50 and got["state"] == "ok" and got["lag_s"] == 0.0
    e = ends({0: 0.0, 1: 0.0})
    for s in (3, 9, 27):
        e[1][s] += 5.0  # three spikes: the median lag is 0
    assert straggler_state(e)["state"] == "ok"


def test_the_lag_is_behind_the_earliest_rank_of_each_step_and_the_trip_sits_outside_the_others_jitter():
    e = ends({0: 0.0, 1: 0.0, 2: 0.25})
    for s in range(1, 61, 2):
        e[0][s] += 0.5  # rank 0 is late on odd steps: the earliest rank changes from step to step
    got = straggler_state(e)
    assert got["lags_s"] == {"0": 0.25, "1": 0.0, "2": 0.25}, got  # rank 0: the median of 0 and 0.5 s lags
    assert (got["rank"], got["trip_s"], got["state"]) == (0, 0.75, "ok")  # the first of the slowest; jitter 0.25 s
    flagged = straggler_state(ends({0: 0.0, 1: 0.0, 2: 0.125}))
    assert (flagged["state"], flagged["rank"], flagged["lag_s"], flagged["trip_s"]) == ("flagged", 2, 0.125, 0.05)
    assert flagged["reason"] == "rank 2 ends its steps a median 0.125 s after the earliest rank over the last 50 steps (trip 0.050 s)"
    assert flagged["lags_s"] == {"0": 0.0, "1": 0.0, "2": 0.125}
    at_trip = straggler_state(ends({0: 0.0, 1: 0.25, 2: 0.75}))  # 3 x the other ranks' 0.25 s: at the trip, not over
    assert (at_trip["state"], at_trip["trip_s"], at_trip["rank"]) == ("ok", 0.75, 2)
    assert at_trip["reason"] == "the slowest rank (2) lags 0.750 s (trip 0.750 s)"
    over = straggler_state(ends({0: 0.0, 1: 0.25, 2: 0.875}))
    assert over["state"] == "flagged" and over["trip_s"] == 0.75
    under_floor = straggler_state(ends({0: 0.0, 1: 0.0, 2: 0.03125}))  # 31 ms of jitter: under the 50 ms floor
    assert under_floor["state"] == "ok" and under_floor["trip_s"] == 0.05
    assert straggler_state(ends({0: 0.0, 1: 0.0625}))["state"] == "flagged"  # 62.5 ms: over it


def test_a_stuck_rank_stopped_while_another_went_on_by_more_than_the_stall_threshold():
    last = {0: (120, 1110.0, 0.125), 1: (100, 1100.0, 0.125)}
    assert stuck_ranks(last, now=1111.0) == [{"rank": 1, "last_step": 100, "behind_s": 10.0, "ahead_rank": 0,
                                               "ahead_step": 120, "threshold_s": 3.0}]  # max(10 x 0.125, 3 s)
    slow = {0: (120, 1110.0, 0.5), 1: (100, 1104.0, 0.5)}  # p99 0.5 s: threshold 5 s, 6 s behind
    assert [(s["rank"], s["threshold_s"]) for s in stuck_ranks(slow, now=1111.0)] == [(1, 5.0)]
    assert stuck_ranks({0: (120, 1110.0, 0.5), 1: (100, 1105.0, 0.5)}, now=1111.0) == []  # exactly 5 s: not more
    assert stuck_ranks({0: (120, 1110.0, None), 1: (100, 1106.5, None)}, now=1111.0)[0]["threshold_s"] == 3.0
    assert stuck_ranks({0: (120, 1110.0, None), 1: (100, 1107.0, None)}, now=1111.0) == []  # 3 s: the floor, not more
    assert stuck_ranks({0: (120, 1110.0, 0.1), 1: (100, 1100.0, 0.1)}, now=1102.0) == []  # now: only 2 s since its step
    assert stuck_ranks({1: (100, 1100.0, 0.1)}, now=2000.0) == []  # alone: the whole-run stall's business
    assert stuck_ranks({0: (None, None, None), 1: (100, 1100.0, 0.1)}, now=2000.0) == []  # the other never stepped
    three = {0: (130, 1120.0, 0.1), 1: (100, 1100.0, 0.1), 2: (125, 1115.0, 0.1)}
    got = stuck_ranks(three, now=1121.0)  # behind the newest of the others, and 2 is behind 0 too
    assert [(s["rank"], s["ahead_rank"], s["behind_s"]) for s in got] == [(1, 0, 20.0), (2, 0, 5.0)]
    assert stuck_ranks({0: (5, 1110.0, 0.1), 1: (4, 1100.0, 0.1)}, now=1111.0, factor=1.0, floor_s=20.0) == []


def test_a_recompile_storm_is_five_recompiles_within_100_steps_after_warm_up():
    steady = {"state": "steady", "until_step": 100}
    got = recompile_storm([[101, 120, 140, 160, 201]], steady, "tensor 'x' size mismatch")
    assert got == (101, "recompile storm after warm-up: 5 recompiles since step 101; most frequent reason: "
                        "tensor 'x' size mismatch")
    assert recompile_storm([[101, 120, 140, 160, 202]], steady, None) is None  # 101 steps apart: no storm
    assert recompile_storm([[101, 120, 140, 160]], steady, None) is None  # four
    assert recompile_storm([[90, 101, 120, 140, 160]], steady, None) is None  # one was in the warm-up
    assert recompile_storm([[100, 101, 120, 140, 160]], steady, None) is None  # at the warm-up's last step
    late = recompile_storm([[101, 300, 310, 320, 330, 340]], steady, None)
    assert late == (300, "recompile storm after warm-up: 6 recompiles since step 101; most frequent reason: "
                         "unknown (enable TORCH_LOGS=recompiles)")
    assert recompile_storm([[1, 2, 3, 4, 5]], {"state": "warming up", "until_step": None}, None) is None
    assert recompile_storm([[1, 2, 3, 4, 5]], {"state": "steady", "until_step": None}, None)[0] == 1
    assert recompile_storm([[101, 400], [150, 151, 152, 153, 154]], steady, None)[0] == 150  # each source alone
    assert recompile_storm([[101, 102], [103, 104, 105]], steady, None) is None  # never counted together


def test_the_straggler_figures_are_rounded_to_4_decimals_and_start_at_zero_steps():
    assert straggler_state({})["steps"] == 0 and straggler_state(ends({0: 0.0}))["steps"] == 0
    odd = straggler_state(ends({0: 0.0, 1: 0.0, 2: 0.123456}, base=0.0))
    assert (odd["lag_s"], odd["lags_s"]["2"], odd["trip_s"]) == (0.1235, 0.1235, 0.05)
    jitter = straggler_state(ends({0: 0.0, 1: 0.0345678, 2: 0.5}, base=0.0))
    assert jitter["trip_s"] == 0.1037 and jitter["lags_s"]["1"] == 0.0346  # 3 x 0.0345678 to 4 decimals


def test_a_stuck_rank_is_judged_for_every_rank_against_the_newest_other_end():
    low = {0: (100, 1100.0, 0.1), 1: (130, 1120.0, 0.1)}  # rank 0 is the one that stopped
    assert [(s["rank"], s["ahead_rank"]) for s in stuck_ranks(low, now=1121.0)] == [(0, 1)]
    three = {0: (130, 1120.0, 0.1), 1: (100, 1100.0, 0.1), 2: (200, 1115.0, 0.9)}  # 2 has the highest step and p99
    assert [(s["rank"], s["ahead_rank"], s["behind_s"]) for s in stuck_ranks(three, now=1121.0)] == [(1, 0, 20.0)]
    assert stuck_ranks({0: (120, 1101.0, 0.1), 1: (100, 1100.0, 0.1)}, now=1500.0) == []  # others 1 s ahead: a whole-run stall
    assert stuck_ranks({0: (120, 1110.0, 0.1), 1: (100, 1100.0, 0.1)}, now=1103.0) == []  # now exactly the threshold after
    odd = stuck_ranks({0: (120, 1110.12345, 0.33333), 1: (100, 1100.0, 0.33333)}, now=1111.0)
    assert (odd[0]["behind_s"], odd[0]["threshold_s"]) == (10.123, 3.333)


def test_a_storm_window_found_in_the_middle_of_a_long_run_and_an_unknown_warm_up_is_not_judged():
    steady = {"state": "steady", "until_step": 100}
    got = recompile_storm([[101, 200, 400, 410, 420, 430, 440, 900, 1000]], steady, None)
    assert got is not None and got[0] == 400  # five within 100 steps: 400..440, not the first or the last
    for warmup in ({"state": None, "until_step": None}, {}, {"state": "warming", "until_step": None}):
        assert recompile_storm([[1, 2, 3, 4, 5]], warmup, None) is None  # not judged before the warm-up ends


def test_the_ahead_rank_is_the_newest_whatever_its_place_and_figures_keep_4_decimals():
    order = {0: (120, 1112.0, 0.1), 1: (100, 1100.0, 0.1), 2: (130, 1118.0, 0.1)}  # the newest is the last
    assert [(s["rank"], s["ahead_rank"], s["behind_s"]) for s in stuck_ranks(order, now=1119.0)] == [
        (0, 2, 6.0), (1, 2, 18.0)]
    fine = straggler_state(ends({0: 0.0, 1: 0.0, 2: 0.1234567}, base=0.0))
    assert fine["lag_s"] == 0.1235 and fine["lags_s"]["2"] == 0.1235
    jit = straggler_state(ends({0: 0.0, 1: 0.0411111, 2: 0.5}, base=0.0))
    assert jit["trip_s"] == 0.1233  # 3 x 0.0411111 = 0.1233333: 4 decimals, not 3 or 5


def _death(rank: int, ended_at_unix: float | None, signal: str | None) -> Rank:
    return Rank(rank=rank, local_rank=rank, pid=100 + rank, alive=False, ended_at_unix=ended_at_unix, returncode=None,
                signal=signal, exit_source="kernel" if ended_at_unix else "torchrun", root_cause=False,
                after_stop=False, restart_count=None, max_restarts=None, started_at_unix=None, steps=None)


def test_a_death_whose_time_is_not_known_yet_joins_the_cascade_and_never_starts_one():
    """A torn-down rank read from torchrun's table before its exit was recorded (no time) is no
    first death: the timed SIGKILL of the other rank starts the cascade (a race seen under load)."""
    untimed, killed = _death(0, None, "SIGTERM"), _death(1, 1000.0, "SIGKILL")
    [group] = cascades([untimed, killed])
    assert group == [killed, untimed] and first_of(group) is killed
    apart = _death(2, 1000.0 + 60, "SIGKILL")
    assert cascades([killed, apart]) == [[killed], [apart]]  # the control: timed deaths a minute apart are two
    assert cascades([untimed]) == [[untimed]]  # alone, it is still a death


def _rank_file(tmp_path: Path, steps: int, max_steps: int | None, run_end: bool = False) -> Path:
    p = tmp_path / "events.rank1.jsonl"
    lines = [{"v": 1, "kind": "run_start", "t": 1000.0, "pid": 4242, "max_steps": max_steps}]
    lines += [{"v": 1, "kind": "step", "t": 1000.0 + s, "step": s, "dt": 1.0, "step_end": 1000.0 + s, "flags": []}
              for s in range(1, steps + 1)]
    lines += [{"v": 1, "kind": "run_end", "t": 2000.0}] if run_end else []
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_a_rank_past_its_last_planned_step_or_its_run_end_is_finished_never_stuck(tmp_path: Path):
    """A rank that did its 600 steps and tears down (destroy_process_group, a final save) while
    another still steps is finishing, not stuck."""
    for steps, max_steps, run_end, finished in ((5, 5, False, True), (4, 5, False, False), (4, None, True, True),
                                                (4, None, False, False)):
        rs = RankSteps(_rank_file(tmp_path, steps, max_steps, run_end))
        rs.read()
        assert (rs.last_step, rs.finished) == (steps, finished), (steps, max_steps, run_end)
