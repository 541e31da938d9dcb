"""The log-progress parser's edges (issue 21: the mutants that survived), through ProgressTracker, the
interface the supervisor feeds every train.log segment to: a rate of 0 is no step time; a redraw at
the same step is no advance; the bar's last step (step == total) finishes it; updates seen only as
history, or in one arrival, give no step time; a real uninstrumented run whose bar is complete is no
stall while it saves at the end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.parsers.hf_progress import ProgressTracker, parse_progress


def bar(step: int, total: int = 20, rate: str = "2.00it/s") -> str:
    pct = 100 * step // total
    return f"{pct:3d}%|{'#' * (pct // 10):10}| {step}/{total} [00:{step:02d}<00:10, {rate}]"


def test_a_rate_of_zero_is_no_seconds_per_step_either_way():
    assert parse_progress(bar(1, rate="0.00it/s")).seconds_per_step is None
    assert parse_progress(bar(1, rate="0.00s/it")).seconds_per_step is None
    assert parse_progress(bar(1, rate="4.00it/s")).seconds_per_step == 0.25  # control
    assert parse_progress(bar(1, rate="4.00s/it")).seconds_per_step == 4.0


def test_a_redraw_at_the_same_step_is_no_advance_and_no_step_time():
    t = ProgressTracker()
    assert len(t.feed_text(bar(1), at_s=100.0, poll_seq=1)) == 1
    assert t.feed_text(bar(1), at_s=100.5, poll_seq=2) == []  # the same counter again (after a log dict)
    adv = t.feed_text(bar(2), at_s=101.0, poll_seq=3)
    assert [(a.step, a.dt_s) for a in adv] == [(2, 1.0)]  # timed from the step's FIRST drawing
    assert list(t.step_times) == [(2, 1.0)]


def test_the_bars_last_step_finishes_it_and_one_short_does_not():
    t = ProgressTracker()
    for k in range(1, 20):
        t.feed_text(bar(k), at_s=100.0 + k, poll_seq=k)
    assert not t.finished  # 19/20: under way
    t.feed_text(bar(20), at_s=120.0, poll_seq=20)
    assert t.finished and t.global_step == 20


def test_history_and_one_arrival_give_no_step_time_and_a_zero_interval_is_none():
    t = ProgressTracker()
    t.feed_text(bar(1), at_s=100.0, poll_seq=1, live=False)  # read back from an earlier log
    t.feed_text(bar(2), at_s=100.2, poll_seq=2, live=False)
    assert list(t.step_times) == []
    t.feed_text(bar(3), at_s=101.0, poll_seq=3)
    t.feed_text(bar(4), at_s=101.0, poll_seq=3)  # the same read: no interval between them
    assert list(t.step_times) == []
    t.feed_text(bar(5), at_s=101.0, poll_seq=4)  # another read, the same instant: a zero interval
    assert list(t.step_times) == []
    t.feed_text(bar(6), at_s=101.5, poll_seq=5)  # control: a real interval
    assert list(t.step_times) == [(6, 0.5)]


BAR_PY = r'''
import sys, time
total = 20
for step in range(1, total + 1):
    time.sleep(0.05)
    pct = 100 * step // total
    sys.stderr.write(f"\r{pct:3d}%|{'#' * (pct // 10):10}| {step}/{total} [00:01<00:01, 20.00it/s]")
    sys.stderr.flush()
sys.stderr.write("\n")
print("saving the final checkpoint ...", flush=True)
time.sleep(120)
'''


@pytest.mark.slow
def test_a_complete_bar_then_a_long_final_save_is_no_stall(tmp_path: Path):
    from stepwatch.monitors.detectors.stall import STALL_FLOOR_S

    repo = make_repo(tmp_path / "h", {"bar.py": BAR_PY})
    r = stepwatch("launch", "--no-tui", "--name", "bar", "--", sys.executable, "bar.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "bar"

    def status() -> dict:
        return json.loads(stepwatch("status", str(run_dir), "--json").stdout)

    try:
        snap = wait_until(lambda: (s := status())["step"]["global_step"] == 20 and (s["stall"].get(
            "current_step_elapsed_s") or 0) > STALL_FLOOR_S + 3 and s, 40, interval_s=0.5,
                          what="the bar complete, the save under way past the stall floor")
        assert snap["stall"]["state"] != "stalled", snap["stall"]
        assert not [a for a in snap["alerts"] if a["kind"] == "stall"]
    finally:
        stepwatch("stop", str(run_dir), "--grace", "1", timeout=30)
