"""Progress parsing (tqdm bars, printed log dicts) and the ProgressTracker, on real captures."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES_REAL, make_repo, stepwatch, wait_until
from stepwatch.monitors.readers.rankprefix import rank_prefix
from stepwatch.monitors.readers.textlog import LogFollower, Segment
from stepwatch.monitors.parsers.hf_progress import (
    ProgressTracker,
    parse_interval_s,
    parse_log_dict,
    parse_progress,
    parse_train_output,
)

FIXTURES = FIXTURES_REAL


def segments(name: str) -> list[Segment]:
    f = LogFollower(FIXTURES / name, from_start=True)
    segs = [s for s in f.poll() if not s.is_note]
    if f.partial_segment is not None:
        segs.append(f.partial_segment)
    return segs


def bars(name: str):
    return [u for u in (parse_progress(s.text) for s in segments(name)) if u is not None]


def live(segs: list[Segment], dt: float = 1.5, t0: float = 1_000_000.0) -> list[Segment]:
    """The same segments as if each had arrived in its own poll, ``dt`` seconds apart."""
    return [
        Segment(s.text, s.end, s.cut, s.nbytes, t0 + i * dt, i + 1, False, False) for i, s in enumerate(segs)
    ]


# --------------------------------------------------------------------------- parse_progress


def test_parse_it_per_s_form_from_the_plain_capture() -> None:
    u = parse_progress(" 10%|█         | 6/60 [00:00<00:00, 56.05it/s]")
    assert u is not None
    assert (u.step, u.total, u.percent, u.elapsed_s, u.remaining_s, u.rate, u.unit, u.desc, u.rank) == (
        6, 60, 10, 0.0, 0.0, 56.05, "it/s", "", None,
    )
    assert u.seconds_per_step == pytest.approx(1 / 56.05)


def test_parse_s_per_it_form_from_the_slow_capture() -> None:
    u = parse_progress("  5%|▌         | 1/20 [00:01<00:32,  1.73s/it]")
    assert u is not None
    assert (u.step, u.total, u.elapsed_s, u.remaining_s, u.rate, u.unit) == (1, 20, 1.0, 32.0, 1.73, "s/it")
    assert u.seconds_per_step == 1.73


def test_parse_first_segment_with_unknown_rate() -> None:
    u = parse_progress("  0%|          | 0/60 [00:00<?, ?it/s]")
    assert u is not None
    assert (u.step, u.total, u.remaining_s, u.rate, u.unit, u.seconds_per_step) == (0, 60, None, None, "it/s", None)


def test_parse_wide_tty_bar_and_other_bars() -> None:
    tty = [u for u in bars("hf_trainer_tty.log")]
    assert tty[0].step == 0 and tty[-1].step == 60 and all(u.total == 60 for u in tty)
    w = parse_progress("Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 175.41it/s]")
    assert w is not None and (w.desc, w.step, w.total) == ("Writing model shards", 1, 1)


def test_parse_bar_with_glued_dynamo_record() -> None:
    seg = [s.text for s in segments("hf_trainer_compile.log") if "V1130" in s.text and "%|" in s.text][0]
    u = parse_progress(seg)
    assert u is not None and (u.step, u.total, u.rate, u.unit, u.elapsed_s, u.remaining_s) == (
        1, 40, 25.96, "s/it", 25.0, 16 * 60 + 52.0,
    )


def test_parse_rank_prefix_postfix_no_total_and_hours() -> None:
    u = parse_progress("[default3]:[rank3]: 42%|████▏     | 25/60 [1:00:03<00:04,  7.12it/s, loss=1.2]")
    assert u is not None and (u.rank, u.step, u.elapsed_s, u.rate) == (3, 25, 3603.0, 7.12)
    n = parse_progress("Epoch 1: 25it [00:03, 7.12it/s]")
    assert n is not None and (n.desc, n.step, n.total, n.percent) == ("Epoch 1", 25, None, None)
    assert rank_prefix("[default2]:hello") == (2, "hello")
    assert parse_interval_s("125:03:02") == 125 * 3600 + 3 * 60 + 2
    assert parse_interval_s("?") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Script started on 2026-11-30 06:55:45+00:00 [COMMAND=\"stty cols 120\"]",
        "{'loss': '5.558', 'grad_norm': '0.6336'}",
        "STEP 5 seq_len=81 seconds=0.0717 phase=limit_hit",
        " 10%|█         | 6/6",  # a half-written bar
    ],
)
def test_non_bars_are_none(text: str) -> None:
    assert parse_progress(text) is None


# --------------------------------------------------------------------------- log dicts


def test_parse_log_dict_strings_and_ints() -> None:
    d = parse_log_dict(
        "{'loss': '5.557', 'grad_norm': '0.6277', 'learning_rate': '3.333e-05', 'epoch': '0.2', "
        "'num_input_tokens_seen': 2560, 'train_runtime': '0.1163', 'train_tokens_per_second': '2.202e+04'}"
    )
    assert d == {
        "loss": 5.557, "grad_norm": 0.6277, "learning_rate": 3.333e-05, "epoch": 0.2,
        "num_input_tokens_seen": 2560.0, "train_runtime": 0.1163, "train_tokens_per_second": 22020.0,
    }
    assert all(type(v) is float for v in d.values())
    assert parse_log_dict("[rank0]:{'loss': '1', 'note': 'text'}") == {"loss": 1.0}


@pytest.mark.parametrize("text", ["{", "{}", "not a dict", "[1, 2]", "{'a': __import__('os')}", "{1: 2}"])
def test_parse_log_dict_rejects(text: str) -> None:
    assert parse_log_dict(text) is None



def test_a_line_that_only_holds_a_brace_is_never_evaluated(monkeypatch) -> None:
    """Every log line with a ``{`` anywhere reaches parse_log_dict (a JSON log, a Python logging dict,
    a format string): only text that starts with ``{`` and ends with ``}`` (a rank prefix aside) goes
    to ast.literal_eval, the rest is refused before it. The positive control: a log dict is evaluated."""
    import ast

    evaluated: list[str] = []
    real = ast.literal_eval
    monkeypatch.setattr(ast, "literal_eval", lambda s: evaluated.append(s) or real(s))
    refused = [
        "step 3 {'loss': 1.0}",  # starts with a character below '{'
        "| {'loss': 1.0}",  # ... and one above it
        "{'loss': 1.0",  # ends with a character below '}'
        "{'loss': 1.0} ~",  # ... and one above it
        "{'loss': 1.0} é",
        "x}",
        "[rank1]:{'loss': 1.0",
    ]
    for text in refused:
        assert parse_log_dict(text) is None, text
    assert evaluated == []
    assert parse_log_dict("[rank0]: {'loss': 1.0} ") == {"loss": 1.0}
    assert evaluated == ["{'loss': 1.0}"]

def test_parse_train_output() -> None:
    assert parse_train_output("TrainOutput: TrainOutput(global_step=60, training_loss=5.55)") == 60
    assert parse_train_output("nothing") is None


# --------------------------------------------------------------------------- tracker on real captures


def test_tracker_plain_log_ends_at_60_of_60_and_summary() -> None:
    t = ProgressTracker()
    advances = [a for s in segments("hf_trainer_plain.log") for a in t.feed(s)]
    assert (t.global_step, t.total, t.finished) == (60, 60, True)
    # the final bar printed twice at 100% (and redraws after each dict) are not advances
    assert [a.step for a in advances].count(60) == 1
    assert t.summary is not None and t.summary["train_loss"] == 5.559 and t.summary["train_runtime"] == 0.8789
    assert t.last_log == {"loss": 5.56, "grad_norm": 0.5335, "learning_rate": 1.818e-05, "epoch": 1.0}
    assert len(t.logs) == 7
    assert (t.rate, t.unit) == (68.31, "it/s")
    # replayed from a file (backfill): no arrival times, so no step durations
    assert list(t.step_times) == []


def test_tracker_slow_log_every_step_with_arrival_times() -> None:
    segs = live(segments("hf_trainer_slow.log"), dt=1.5)
    t = ProgressTracker()
    advances = [a for s in segs for a in t.feed(s)]
    assert [a.step for a in advances] == list(range(0, 21))
    assert (t.global_step, t.total, t.unit) == (20, 20, "s/it")
    # every step was printed one by one: a duration for each of steps 1..20
    assert [s for s, _dt in t.step_times] == list(range(1, 21))
    assert all(dt > 0 for _s, dt in t.step_times)
    # after a log dict the bar is redrawn with the same count: the step's time is measured from
    # the FIRST arrival of the previous count, not from the redraw. Steps 5->6: bar 5, blank, dict,
    # the empty segment between '\n' and '\r', redraw 5, bar 6 = 5 segments apart.
    dts = dict(t.step_times)
    assert dts[6] == pytest.approx(5 * 1.5)
    assert dts[2] == pytest.approx(1.5)


def test_tracker_no_duration_for_updates_in_the_same_poll_or_backfill() -> None:
    segs = segments("hf_trainer_slow.log")
    same_poll = [Segment(s.text, s.end, s.cut, s.nbytes, 1000.0 + i, 7, False, False) for i, s in enumerate(segs)]
    t = ProgressTracker()
    for s in same_poll:
        t.feed(s)
    assert t.global_step == 20 and list(t.step_times) == []
    backfill = [Segment(s.text, s.end, s.cut, s.nbytes, 1000.0 + i, i + 1, True, False) for i, s in enumerate(segs)]
    t2 = ProgressTracker()
    for s in backfill:
        t2.feed(s)
    assert t2.global_step == 20 and list(t2.step_times) == []


def test_tracker_skipped_counts_give_no_duration() -> None:
    t = ProgressTracker()
    for s in live(segments("hf_trainer_plain.log"), dt=0.1):
        t.feed(s)
    # the plain log advances by 6, 4, 3, 7, 1, ...: only the +1 advances (20->21, 50->51, 59->60)
    # give a duration
    assert [s for s, _ in t.step_times] == [21, 51, 60]


def test_tracker_feeding_the_partial_twice_is_harmless() -> None:
    t = ProgressTracker()
    s1 = Segment("  5%|▌         | 1/20 [00:01<00:32,  1.73s/it]", "", at_s=100.0, poll_seq=1)
    assert [a.step for a in t.feed(s1)] == [1]
    again = Segment(s1.text, "\r", at_s=101.0, poll_seq=2)
    assert t.feed(again) == []
    s2 = Segment(" 10%|█         | 2/20 [00:03<00:35,  1.95s/it]", "", at_s=102.0, poll_seq=3)
    adv = t.feed(s2)
    assert adv[0].dt_s == pytest.approx(2.0)  # from the first sighting of 1, not the re-feed


def test_tracker_compile_log_rate_flips_and_glued_record() -> None:
    ups = bars("hf_trainer_compile.log")
    units = [u.unit for u in ups]
    assert "s/it" in units and "it/s" in units
    assert units[-2:] == ["it/s", "s/it"]  # the final close line flips back to the overall average
    t = ProgressTracker()
    advances = [a.step for s in segments("hf_trainer_compile.log") for a in t.feed(s)]
    assert advances == [0, 1, 2, 10, 12, 20, 23, 30, 34, 40]
    assert (t.global_step, t.unit, t.rate) == (40, "s/it", 1.32)


def test_tracker_ignores_other_bars() -> None:
    t = ProgressTracker()
    for s in segments("hf_trainer_printer_callback.log"):
        t.feed(s)
    assert t.global_step is None and t.total is None  # `Writing model shards:` never moves it
    assert t.other_bars == 4
    assert [round(d["loss"], 3) for _step, d in t.logs if "loss" in d] == [5.557, 5.557]
    assert t.summary is not None and t.summary["train_loss"] == 5.556
    assert t.last_log is not None and t.last_log["num_input_tokens_seen"] == 5120.0


def test_tracker_ignores_eval_bar_and_other_ranks() -> None:
    t = ProgressTracker()
    t.feed_text(" 10%|█         | 10/100 [00:10<01:30,  1.00it/s]", 1.0, poll_seq=1)
    t.feed_text(" 40%|████      | 2/5 [00:01<00:01,  2.00it/s]", 2.0, poll_seq=2)  # evaluation bar
    t.feed_text("[rank1]: 12%|█▏        | 12/100 [00:12<01:28,  1.00it/s]", 3.0, poll_seq=3)
    assert (t.global_step, t.total) == (10, 100)
    t.feed_text(" 11%|█         | 11/100 [00:11<01:29,  1.00it/s]", 4.0, poll_seq=4)
    assert t.global_step == 11 and list(t.step_times) == [(11, 3.0)]


def test_tracker_switches_to_a_larger_total_when_it_locked_on_an_eval_bar() -> None:
    t = ProgressTracker()
    t.feed_text(" 40%|████      | 2/5 [00:01<00:01,  2.00it/s]")
    t.feed_text(" 10%|█         | 10/100 [00:10<01:30,  1.00it/s]")
    assert (t.global_step, t.total) == (10, 100)
    t.feed_text(" 60%|██████    | 3/5 [00:01<00:01,  2.00it/s]")
    assert t.global_step == 10
    # with max_steps known from events, the lock never moves
    t2 = ProgressTracker(expected_total=5)
    t2.feed_text(" 10%|█         | 10/100 [00:10<01:30,  1.00it/s]")
    assert t2.global_step is None


def test_an_evaluation_bar_with_more_batches_mid_training_never_takes_over() -> None:
    """The training bar at 15/30, then an evaluation bar of 50 batches from 0: still the training bar."""
    t = ProgressTracker()
    for s in range(16):
        t.feed_text(f" {s * 3}%|#         | {s}/30 [00:0{s % 10}<00:10,  3.00it/s]", at_s=float(s), poll_seq=s)
    for b in range(0, 50, 5):
        assert t.feed_text(f" {b * 2}%|#         | {b}/50 [00:01<00:10,  9.00it/s]", at_s=20.0 + b, poll_seq=100 + b) == []
    assert (t.global_step, t.total) == (15, 30)
    t.feed_text(" 53%|#####     | 16/30 [00:20<00:10,  3.00it/s]", at_s=80.0, poll_seq=200)
    assert t.global_step == 16


# ------------------------------------------------------------------------------------------------
# The tqdm bar parser and the training-bar tracker at their edges: every SI rate prefix, tqdm's intervals, a bar
# without a total, switching to a larger bar, a counter that goes back, TrainOutput, the bounds of what is kept, and
# the tracker's keyword-only shape.


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


# ------------------------------------------------------------------------------------------------
# The log-progress parser's edges, through ProgressTracker, the interface the supervisor feeds every train.log
# segment to: a rate of 0 is no step time; a redraw at the same step is no advance; the bar's last step (step ==
# total) finishes it; updates seen only as history, or in one arrival, give no step time; a real uninstrumented run
# whose bar is complete is no stall while it saves at the end.


def ticked_bar(step: int, total: int = 20, rate: str = "2.00it/s") -> str:
    pct = 100 * step // total
    return f"{pct:3d}%|{'#' * (pct // 10):10}| {step}/{total} [00:{step:02d}<00:10, {rate}]"


def test_a_rate_of_zero_is_no_seconds_per_step_either_way():
    assert parse_progress(ticked_bar(1, rate="0.00it/s")).seconds_per_step is None
    assert parse_progress(ticked_bar(1, rate="0.00s/it")).seconds_per_step is None
    assert parse_progress(ticked_bar(1, rate="4.00it/s")).seconds_per_step == 0.25  # control
    assert parse_progress(ticked_bar(1, rate="4.00s/it")).seconds_per_step == 4.0


def test_a_redraw_at_the_same_step_is_no_advance_and_no_step_time():
    t = ProgressTracker()
    assert len(t.feed_text(ticked_bar(1), at_s=100.0, poll_seq=1)) == 1
    assert t.feed_text(ticked_bar(1), at_s=100.5, poll_seq=2) == []  # the same counter again (after a log dict)
    adv = t.feed_text(ticked_bar(2), at_s=101.0, poll_seq=3)
    assert [(a.step, a.dt_s) for a in adv] == [(2, 1.0)]  # timed from the step's FIRST drawing
    assert list(t.step_times) == [(2, 1.0)]


def test_the_bars_last_step_finishes_it_and_one_short_does_not():
    t = ProgressTracker()
    for k in range(1, 20):
        t.feed_text(ticked_bar(k), at_s=100.0 + k, poll_seq=k)
    assert not t.finished  # 19/20: under way
    t.feed_text(ticked_bar(20), at_s=120.0, poll_seq=20)
    assert t.finished and t.global_step == 20


def test_history_and_one_arrival_give_no_step_time_and_a_zero_interval_is_none():
    t = ProgressTracker()
    t.feed_text(ticked_bar(1), at_s=100.0, poll_seq=1, live=False)  # read back from an earlier log
    t.feed_text(ticked_bar(2), at_s=100.2, poll_seq=2, live=False)
    assert list(t.step_times) == []
    t.feed_text(ticked_bar(3), at_s=101.0, poll_seq=3)
    t.feed_text(ticked_bar(4), at_s=101.0, poll_seq=3)  # the same read: no interval between them
    assert list(t.step_times) == []
    t.feed_text(ticked_bar(5), at_s=101.0, poll_seq=4)  # another read, the same instant: a zero interval
    assert list(t.step_times) == []
    t.feed_text(ticked_bar(6), at_s=101.5, poll_seq=5)  # control: a real interval
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
