"""The stall rule by its numbers and words: the 3 s floor and 10x p99 on either side, elapsed exactly at
the threshold, the reasons as a user reads them, the log-only guard at its edge, the call's shape."""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.monitors.detectors.stall import (NOT_JUDGED, STALL_FACTOR, STALL_FLOOR_S, StallVerdict, log_only_guard,
                                                stall_state)

FAST = {"n": 20, "p99": 0.125}  # 10 x p99 = 1.25 s: the 3 s floor decides
SLOW = {"n": 20, "p99": 0.5}  # 10 x p99 = 5 s


def test_the_threshold_is_max_of_10x_p99_and_3_s_and_elapsed_must_exceed_it():
    assert (STALL_FACTOR, STALL_FLOOR_S) == (10.0, 3.0)
    assert stall_state(1000.0, 1002.75, FAST).state == "ok"
    v = stall_state(1000.0, 1003.0, FAST)  # exactly the floor: not more
    assert (v.state, v.threshold_s, v.current_step_elapsed_s) == ("ok", 3.0, 3.0)
    assert v.reason == "step in progress for 3.0 s; stalled after 3.0 s"
    v = stall_state(1000.0, 1003.25, FAST)
    assert (v.state, v.threshold_s) == ("stalled", 3.0)
    assert v.reason == ("step in progress for 3.2 s > 3.0 s (= max(10 x p99 0.12 s, 3 s)); no save/eval phase open")
    assert stall_state(1000.0, 1005.0, SLOW).state == "ok" and stall_state(1000.0, 1005.25, SLOW).state == "stalled"
    assert stall_state(1000.0, 1005.25, SLOW).threshold_s == 5.0
    assert stall_state(1000.0, 999.0, FAST).current_step_elapsed_s == 0.0  # clock skew: clamped at 0


def test_too_few_steps_or_no_start_say_so_in_words():
    assert stall_state(None, 2000.0, FAST) == StallVerdict("ok", None, None, "no step start known")
    for stats, words in (({}, "0 counted steps"), ({"n": 1, "p99": 0.1}, "1 counted step;"),
                         ({"n": 2, "p99": 0.1}, "2 counted steps"), ({"n": 4, "p99": 0.1}, "4 counted steps"),
                         ({"n": 9, "p99": None}, "9 counted steps")):
        v = stall_state(1000.0, 2000.0, stats)
        assert v.state == "ok" and v.threshold_s is None and v.reason.startswith(words), (stats, v.reason)
        assert v.reason.endswith("; a stall needs at least 5") and v.current_step_elapsed_s == 1000.0
    assert stall_state(1000.0, 2000.0, {"n": 5, "p99": 0.1}).state == "stalled"


def test_a_save_or_eval_phase_is_never_a_stall_and_is_named():
    assert stall_state(1000.0, 2000.0, FAST, "save").reason == "in a save phase for 1000.0 s; not a stall"
    assert stall_state(1000.0, 2000.0, FAST, True).reason == "in a save/eval phase for 1000.0 s; not a stall"
    v = stall_state(1000.0, 2000.0, FAST, "eval")
    assert (v.state, v.threshold_s) == ("ok", 3.0)
    assert stall_state(1000.0, 2000.0, FAST, "").state == "stalled"  # no phase open


def test_the_log_only_guard_at_its_edges():
    stalled = stall_state(1000.0, 1010.0, FAST)
    assert log_only_guard(stalled, True, None) == (NOT_JUDGED, "the training bar is complete")
    assert log_only_guard(stalled, False, 2.5) == ("ok", "the step runs long but the log was written 2 s ago "
                                                         "(a save or an evaluation?): not a stall")
    assert log_only_guard(stalled, False, 3.0) is None  # written exactly the threshold ago: the stall stands
    assert log_only_guard(stalled, False, None) is None
    assert log_only_guard(stalled, False, None, finish_line=True) == (NOT_JUDGED, "the log says training is over "
                                                                                  "(finishing)")
    ok = stall_state(1000.0, 1001.0, FAST)
    assert log_only_guard(ok, False, 0.5) is None  # only a stalled verdict is ever set aside
    few = stall_state(1000.0, 1010.0, {"n": 2, "p99": 0.1})
    assert log_only_guard(few, False, 0.5) is None


def test_the_call_and_the_verdict_keep_their_shape():
    v = stall_state(current_step_started_at=1000.0, now=1010.0, stats=FAST, in_phase=None)  # by keyword
    assert v.state == "stalled"
    with pytest.raises(TypeError):
        stall_state(1000.0, 1010.0, FAST, None, 1.0)  # factor is keyword-only
    assert stall_state(1000.0, 1010.0, FAST, factor=100.0).threshold_s == 12.5
    assert stall_state(1000.0, 1010.0, FAST, floor_s=20.0).state == "ok"
    assert stall_state(1000.0, 1010.0, {"n": 3, "p99": 0.1}, min_steps=3).state == "stalled"
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.state = "ok"
    assert not hasattr(v, "__dict__") and v.as_dict() == {"state": "stalled", "current_step_elapsed_s": 10.0, "threshold_s": 3.0}


def test_what_the_judge_saw_of_the_step_bounds_the_wall_clock_difference():
    """``observed`` (at least, at most seconds on the judge's monotonic clock) clamps ``now - start``:
    a run's clock a day behind reads the step's real length; a judge's clock behind the run's cannot
    hide a stall; within the bounds the wall clock stands, and nothing is said."""
    day = 86400.0
    v = stall_state(1000.0, 1000.0 + day, FAST, observed=(1.0, 2.0))
    assert (v.state, v.current_step_elapsed_s) == ("ok", 2.0)
    assert v.reason == ("step in progress for 2.0 s; stalled after 3.0 s (timed on the judge's own clock: "
                        "the run's step times are about 86398 s behind it)")
    v = stall_state(1000.0, 1000.0 - day, FAST, observed=(20.0, 21.0))  # the run's clock ahead of the judge's
    assert (v.state, v.current_step_elapsed_s) == ("stalled", 20.0) and v.reason.endswith("20 s ahead of it)")
    v = stall_state(1000.0, 1001.5, FAST, observed=(1.0, 2.0))  # inside the bounds: the wall clock, exactly
    assert (v.current_step_elapsed_s, v.reason) == (1.5, "step in progress for 1.5 s; stalled after 3.0 s")
    assert stall_state(1000.0, 1000.0 + day, FAST, observed=(day, day + 1)).state == "stalled"  # a real day


def test_the_observed_start_bounds_only_a_step_the_judge_saw_begin():
    from stepwatch.monitors.snapshot.stepsource import RECORD_LATENCY_S, ObservedStart

    o = ObservedStart()
    assert o.observe(500.0, 10.0) is None  # there at the first look: the wall clock alone
    assert o.observe(500.0, 11.0) is None
    assert o.observe(501.0, 12.0) == (0.0, 1.0 + RECORD_LATENCY_S)  # began between the looks at 11 and 12
    assert o.observe(501.0, 20.0) == (8.0 - RECORD_LATENCY_S, 9.0 + RECORD_LATENCY_S)
    assert o.observe(400.0, 21.0) is None  # moved back: another source speaks; not seen begin
    assert o.observe(None, 22.0) is None
    assert o.observe(402.0, 23.0) == (0.0, 1.0 + RECORD_LATENCY_S)  # the first step after none
