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


@pytest.mark.parametrize("rate, per_s", [("2.00it/s", 2.0), ("0.50it/s", 0.5), ("1.50kit/s", 1500.0), ("2.00Mit/s", 2e6),
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


def test_the_iteration_unit_and_which_bars_are_the_training_bar():
    u = parse_progress("Map:  30%|███       | 300/1000 [00:01<00:02, 250.00examples/s]")
    assert (u.iter_unit, u.desc, u.total) == ("examples", "Map", 1000)
    assert parse_progress(bar(5, 10, "4.00s/it")).iter_unit == "it"
    t = ProgressTracker()
    for line in ("Map:  30%|███       | 300/1000 [00:01<00:02, 250.00examples/s]",
                 " 30%|███       | 300/1000 [00:01<00:02, 250.00tok/s]",
                 " 30%|███       | 300/1000 [00:01<00:02, 250.00batch/s]",
                 "[rank1]:" + bar(7, 10)):
        t.feed_text(line)
    assert (t.global_step, t.other_bars) == (None, 4)  # another unit, another rank: never the training bar
    t.feed_text("[rank0]:" + bar(3, 10))
    assert t.global_step == 3  # rank 0's own prefix: the default tracker's
    named = ProgressTracker(desc="train")
    named.feed_text(bar(4, 10, desc="eval"))
    named.feed_text(bar(2, 10, desc="train"))
    assert named.global_step == 2 and named.other_bars == 1
    two = ProgressTracker(rank=2)
    two.feed_text("[rank1]:" + bar(5, 10))  # a lower rank's bar: not rank 2's
    assert two.global_step is None and two.other_bars == 1
    two.feed_text("[rank2]:" + bar(6, 10))
    assert two.global_step == 6


def test_which_larger_or_smaller_bar_takes_over():
    t = ProgressTracker()
    for n in range(0, 11):
        t.feed_text(bar(n, 10))  # a short bar to its end
    t.feed_text(bar(12, 200))  # a larger one, beyond the short one's counter: the training bar, not finished
    assert (t.total, t.global_step, t.finished) == (200, 12, False)
    t = ProgressTracker()
    t.feed_text(bar(3, 200))
    t.feed_text(bar(40, 50))  # a smaller bar (an evaluation): never the training bar, whatever its counter
    assert (t.total, t.global_step) == (200, 3)
    t = ProgressTracker()
    t.feed_text(bar(5, 10))  # under way
    t.feed_text(bar(5, 100))  # a larger bar at the locked counter, not beyond it: an evaluation mid-training
    assert (t.total, t.global_step) == (10, 5)
    t.feed_text(bar(6, 10))
    assert t.global_step == 6


def test_a_bar_beyond_its_total_is_finished_and_a_finished_run_stays_finished_on_a_redraw():
    t = ProgressTracker()
    t.feed_text(bar(99, 100))
    t.feed_text("100%|██████████| 105/100 [00:10<00:00, 10.00it/s]")  # a loop that ran past its total
    assert t.finished and t.global_step == 105
    free = ProgressTracker()
    free.feed_text("5it [00:05, 1.00it/s]")
    free.feed_text("TrainOutput(global_step=5, training_loss=1.0, metrics={})")
    free.feed_text("5it [00:05, 1.00it/s]")  # the same counter drawn again
    assert free.finished
    free.feed_text("6it [00:06, 1.00it/s]")
    assert free.finished and free.global_step == 6


def test_step_times_never_from_a_counter_going_back_or_a_clock_going_back():
    t = ProgressTracker()
    t.feed_text(bar(5, 100), at_s=10.0, poll_seq=1)
    t.feed_text(bar(6, 100), at_s=11.0, poll_seq=2)
    advs = t.feed_text(bar(1, 100), at_s=12.0, poll_seq=3)  # back to 1: a new bar, no time
    assert [(a.step, a.dt_s) for a in advs] == [(1, None)]
    advs = t.feed_text(bar(2, 100), at_s=11.5, poll_seq=4)  # the clock went back: no negative time
    assert [(a.step, a.dt_s) for a in advs] == [(2, None)]
    assert list(t.step_times) == [(6, 1.0)]


def test_a_log_dict_up_to_65536_characters_and_keyword_only():
    from stepwatch.monitors.parsers.hf_progress import StepAdvance, parse_log_dict

    pad = "{'loss': '1.5', 'note': '" + "x" * 65000
    exact = pad + "x" * (65536 - len(pad) - 2) + "'}"
    assert len(exact) == 65536 and parse_log_dict(exact) == {"loss": 1.5}
    assert parse_log_dict(exact[:-2] + "x'}") is None  # 65537 characters: not read
    assert parse_log_dict("") is None and parse_log_dict("{") is None and parse_log_dict("{}") is None
    assert parse_log_dict("{'a': 1}", max_chars=8) == {"a": 1.0} and parse_log_dict("{'a': 1}", max_chars=7) is None
    with pytest.raises(TypeError):
        parse_log_dict("{'a': 1}", 100)  # max_chars is keyword-only
    adv = StepAdvance(3, 2, 0.5, 10.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        adv.step = 4
    assert not hasattr(adv, "__dict__")


def test_a_rate_of_zero_or_below_has_no_seconds_per_step():
    """tqdm prints no sign, but a ProgressUpdate can be built by a caller: a rate at or below 0 is
    no time per step; the smallest positive one is."""
    u = parse_progress(bar(3, 10, rate="2.00it/s"))
    assert u is not None and u.seconds_per_step == 0.5
    for rate in (0.0, -2.0):
        assert dataclasses.replace(u, rate=rate).seconds_per_step is None
    assert dataclasses.replace(u, rate=0.001).seconds_per_step == 1000.0


def test_a_segment_with_only_its_text_is_live_and_no_note():
    """feed() takes anything with a ``text`` (the attributes a Segment has beyond it default to: not
    a note, not backfill): two bars a second apart give one step time."""
    from types import SimpleNamespace

    t = ProgressTracker()
    t.feed(SimpleNamespace(text=bar(1, 10), at_s=100.0))
    advs = t.feed(SimpleNamespace(text=bar(2, 10), at_s=101.0))
    assert [(a.step, a.dt_s) for a in advs] == [(2, 1.0)] and list(t.step_times) == [(2, 1.0)]
    assert t.feed(SimpleNamespace(text=bar(3, 10), at_s=102.0, is_note=True)) == [] and t.global_step == 2


@pytest.mark.parametrize("own, other", [(2, 1), (0, 1), (1, 2)])
def test_a_rank_tracker_reads_only_its_own_ranks_log_dicts(own, other):
    """A tracker of rank ``own``: a lower or higher rank's log dict and TrainOutput pass by; its own
    rank's (and an unprefixed line, as torchrun without --tee prints) are read."""
    t = ProgressTracker(rank=own)
    t.feed_text(f"[rank{other}]:{{'loss': 9.0}}")
    t.feed_text(f"[rank{other}]:TrainOutput(global_step=77, training_loss=9.0, metrics={{}})")
    assert (t.last_log, t.n_logs, t.global_step, t.finished) == (None, 0, None, False)
    t.feed_text(f"[rank{own}]:{{'loss': 2.0}}")
    t.feed_text("{'loss': 1.5}")
    assert (t.last_log, t.n_logs) == ({"loss": 1.5}, 2)
