"""The stall detector (monitors/detectors/stall.py): when a run's current step has taken too long.

The fallback detector's tests are in tests/test_fallback.py.
"""

from __future__ import annotations

import pytest
from conftest import step_controls

from stepwatch.monitors.detectors.frozen import STOPPED_S, StoppedProcess, frozen_verdict
from stepwatch.monitors.detectors.stall import StallVerdict, stall_state
from stepwatch.monitors.states import FLAGGED, NOT_JUDGED, OK
from stepwatch.monitors.stats.stepstats import StepStats

sc = step_controls()

def fast_stats(n=20, dt=0.05):
    s = StepStats()
    s.add(0, 2.0, ["first"])
    for i in range(1, n + 1):
        s.add(i, dt)
    return s


def test_twenty_fast_steps_then_a_hang_reads_stalled_within_seconds():
    s = fast_stats()
    last_end = 1_780_000_000.0
    assert stall_state(last_end, last_end + 1.0, s, None).state == "ok"
    v = stall_state(last_end, last_end + 3.5, s, None)
    assert isinstance(v, StallVerdict)
    assert v.state == "stalled" and v.current_step_elapsed_s == pytest.approx(3.5)
    assert v.threshold_s <= 3.0
    assert v.as_dict() == {"state": "stalled", "current_step_elapsed_s": pytest.approx(3.5), "threshold_s": v.threshold_s}


def test_save_or_eval_phase_is_not_a_stall():
    s = fast_stats()
    for phase in ("save", "eval", True):
        v = stall_state(0.0, 600.0, s, phase)
        assert v.state == "ok" and v.current_step_elapsed_s == 600.0


def test_too_few_steps_is_ok():
    s = fast_stats(n=4)
    v = stall_state(0.0, 10_000.0, s, None)
    assert v.state == "ok" and v.threshold_s is None and "at least 5" in v.reason


def test_stall_threshold_scales_with_p99_and_takes_a_summary_dict():
    s = StepStats()
    for i, dt in enumerate(sc.real_distribution_durations(0)):
        s.add(i + 1, dt, ["first"] if i == 0 else ())
    summary = s.summary()
    v = stall_state(0.0, 10 * summary["p99"] - 1, summary, None)
    assert v.state == "ok"
    v = stall_state(0.0, 10 * summary["p99"] + 1, summary, None)
    assert v.state == "stalled" and "p99" in v.reason
    # the compile-sized step (45.79 s) and an ordinary max are nowhere near a stall
    assert stall_state(0.0, 45.79, s, None).state == "ok"


def test_stall_unknown_start_and_clock_skew():
    s = fast_stats()
    assert stall_state(None, 100.0, s, None).as_dict() == {"state": "ok", "current_step_elapsed_s": None, "threshold_s": None}
    assert stall_state(100.0, 90.0, s, None).current_step_elapsed_s == 0.0


def test_the_log_only_stall_guard_controls():
    """Steps seen through the log only: a complete bar is not judged; a live log is no stall; a
    silent one leaves the stall standing (the positive control)."""
    from stepwatch.monitors.detectors.stall import log_only_guard

    stalled = StallVerdict("stalled", 40.0, 10.0, "")
    assert log_only_guard(stalled, True, 100.0)[0] == "not judged"
    assert log_only_guard(stalled, False, 2.0)[0] == "ok"
    assert log_only_guard(stalled, False, 30.0) is None
    assert log_only_guard(StallVerdict("ok", 1.0, 10.0, ""), False, 0.5) is None


# --- frozen: a process held stopped (monitors/detectors/frozen.py) --------------------------------

def test_a_process_held_stopped_past_the_threshold_is_frozen_naming_pid_and_rank():
    stopped: list[StoppedProcess] = [{"pid": 812, "rank": 1, "name": "python", "stopped_s": 3.4}]
    v = frozen_verdict(stopped, examined=3, running=True)
    assert v["state"] == FLAGGED and v["processes"] == stopped
    assert v["reason"] == "pid 812 (rank 1, python) stopped for 3 s"


def test_a_stop_shorter_than_the_threshold_or_none_is_ok_and_nothing_examined_is_not_judged():
    brief: list[StoppedProcess] = [{"pid": 9, "rank": None, "name": "python", "stopped_s": STOPPED_S - 0.1}]
    assert frozen_verdict(brief, examined=1, running=True)["state"] == OK  # Ctrl-Z and fg: no freeze
    assert frozen_verdict([], examined=2, running=True)["state"] == OK
    v = frozen_verdict([], examined=0, running=True)
    assert v["state"] == NOT_JUDGED and "could be examined" in v["reason"]  # never ok by default
    assert frozen_verdict(brief, examined=1, running=False)["state"] == NOT_JUDGED
