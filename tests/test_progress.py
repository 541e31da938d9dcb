"""Progress parsing (tqdm bars, printed log dicts) and the ProgressTracker, on real captures."""

from __future__ import annotations

import pytest

from conftest import FIXTURES_REAL
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
