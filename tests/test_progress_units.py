"""The tqdm bar parser and the training-bar tracker at their edges (issue 21: the mutants a
cosmic-ray run of monitors/parsers/hf_progress.py left): every SI rate prefix, tqdm's intervals,
a bar without a total, switching to a larger bar, a counter that goes back, TrainOutput, the
bounds of what is kept, and the tracker's keyword-only shape."""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.monitors.parsers.hf_progress import ProgressTracker, parse_interval_s, parse_progress


def bar(step: int, total: int, rate: str = "2.00it/s", desc: str = "") -> str:
    d = f"{desc}: " if desc else ""
    return f"{d}{100 * step // total:3d}%|██        | {step}/{total} [00:05<00:10, {rate}]"


@pytest.mark.parametrize("rate, per_s", [("2.00it/s", 2.0), ("1.50kit/s", 1500.0), ("2.00Mit/s", 2e6),
                                         ("3.00Git/s", 3e9), ("4.00Tit/s", 4e12), ("5.00Pit/s", 5e15),
                                         ("1.25s/it", 1.25)])
def test_every_si_prefix_of_a_rate(rate, per_s):
    u = parse_progress(bar(5, 10, rate))
    assert u.rate == per_s
    assert u.seconds_per_step == (per_s if rate.endswith("s/it") else 1.0 / per_s)


@pytest.mark.parametrize("text, seconds", [("1:02", 62.0), ("01:02:03", 3723.0), ("100:00:00", 360000.0),
                                           ("1:00:00", 3600.0), ("05", None), ("1:0:0:0", None), ("?", None),
                                           ("", None), (None, None), ("1:x", None), (" 00:07 ", 7.0)])
def test_tqdms_intervals(text, seconds):
    assert parse_interval_s(text) == seconds


def test_an_update_is_a_frozen_value():
    u = parse_progress(bar(5, 10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        u.step = 6
    assert not hasattr(u, "__dict__")


def test_a_bar_without_a_total_is_the_training_bar_only_while_none_is_locked():
    free = ProgressTracker()
    for n in (1, 2, 3):
        free.feed_text(f"{n}it [00:0{n}, 1.00it/s]")
    assert free.global_step == 3 and free.total is None
    locked = ProgressTracker()
    locked.feed_text(bar(5, 100))
    locked.feed_text("7it [00:07, 1.00it/s]")  # some other loop's counter: never the training step
    assert (locked.global_step, locked.total, locked.other_bars) == (5, 100, 1)


def test_a_larger_bar_after_a_finished_smaller_one_is_the_training_bar_and_not_finished():
    t = ProgressTracker()
    for n in range(0, 11):
        t.feed_text(bar(n, 10))  # a short bar first (a tokenizer's, an eval's), to its end
    assert t.finished and t.total == 10
    t.feed_text(bar(3, 200))
    assert (t.total, t.global_step, t.finished) == (200, 3, False)


def test_a_counter_that_goes_back_is_a_new_bar_and_an_advance():
    t = ProgressTracker()
    for n in (98, 99, 100):
        t.feed_text(bar(n, 100))
    assert t.finished
    advs = t.feed_text(bar(1, 100))  # a second train() of the same length
    assert [(a.step, a.prev_step) for a in advs] == [(1, 100)] and t.global_step == 1 and t.finished is False


def test_trainoutput_sets_the_final_step():
    t = ProgressTracker()
    t.feed_text(bar(59, 60))
    t.feed_text("TrainOutput(global_step=60, training_loss=5.55, metrics={'train_runtime': 3.1})")
    assert (t.global_step, t.finished) == (60, True)
    t2 = ProgressTracker()
    t2.feed_text("no TrainOutput here: global_step=7")
    assert t2.global_step is None and not t2.finished


def test_what_is_kept_is_bounded_at_10_000_and_the_tracker_takes_keywords_only():
    t = ProgressTracker()
    for i in range(10_005):
        t.feed_text(f"{{'loss': '{i}'}}")
    assert len(t.logs) == 10_000 and t.logs[0][1] == {"loss": 5.0} and t.last_log == {"loss": 10004.0}
    small = ProgressTracker(keep=3)
    for i in range(5):
        small.feed_text(f"{{'loss': '{i}'}}")
    assert [d["loss"] for _, d in small.logs] == [2.0, 3.0, 4.0]
    with pytest.raises(TypeError):
        ProgressTracker("")  # desc is keyword-only
