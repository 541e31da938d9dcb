"""LogTracker's rules, segment by segment: a line is whole only at its newline, step times from arrival
only between consecutive steps of different polls, a user pattern first but not alone, the hint's
line counts at their edges, the series cap, the run config's patterns. Segments are the log
reader's own (stepwatch.monitors.readers.textlog.Segment)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepwatch.monitors.parsers.logformats import compile_patterns
from stepwatch.monitors.parsers.logtracker import (HINT_AFTER_LINES, LIGHTNING_BANNER, MAX_SERIES, LogTracker,
                                                   is_summary, log_hint, run_patterns)
from stepwatch.monitors.readers.textlog import Segment


def seg(text: str, at_s: float, poll_seq: int, end: str = "\n", **kw) -> Segment:
    return Segment(text, end, at_s=at_s, poll_seq=poll_seq, **kw)


def test_a_step_line_is_read_at_its_newline_never_from_the_unterminated_tail():
    t = LogTracker()
    assert t.feed(seg("step 5 | loss 2.0", 100.0, 1, end="")) == [] and t.global_step is None
    assert t.lines_seen == 0  # a tail is not a line yet
    [adv] = t.feed(seg("step 5 | loss 2.0", 100.5, 2))
    assert (adv.step, t.global_step, t.format, t.lines_seen) == (5, 5, "step_line", 1)
    assert t.feed(seg("loading shards 3/7", 101.0, 3, end="")) == []  # a tail no bar and no shape reads


def test_step_times_from_arrival_between_consecutive_steps_of_different_polls():
    t = LogTracker()
    for step, at_s, poll in [(1, 10.0, 1), (2, 10.5, 2), (3, 11.25, 3), (4, 11.25, 3), (6, 12.0, 4),
                             (7, 12.0, 5), (8, 11.5, 6)]:
        t.feed(seg(f"step {step} | loss 2.0", at_s, poll))
    # 2 and 3: 0.5 s and 0.75 s after the step before; 4 came in the same poll as 3 (its spacing is
    # unknown); 6 follows 4, not 5; 7 arrived at the same second as 6 (no time passed); 8 before 7
    assert list(t.step_times) == [(2, 0.5), (3, 0.75)]


def test_arrival_times_only_from_live_segments():
    t = LogTracker()
    t.feed(seg("step 1 | loss 2.0", 10.0, 1, backfill=True))  # history read at attach: not when it was written
    t.feed(seg("step 2 | loss 2.0", 10.5, 2))
    t.feed(seg("step 3 | loss 2.0", 11.0, 3))
    assert list(t.step_times) == [(3, 0.5)]
    t = LogTracker()
    t.feed_text("step 1 | loss 2.0", 10.0, poll_seq=1)  # feed_text is live unless told
    t.feed_text("step 2 | loss 2.0", 10.5, poll_seq=2)
    assert list(t.step_times) == [(2, 0.5)]


def test_a_user_pattern_is_tried_first_and_other_shapes_still_read_when_it_matches_nothing():
    [rx] = compile_patterns([r"^it (?P<step>\d+) loss (?P<loss>[\d.]+)$"])
    t = LogTracker([rx])
    t.feed_text("step 3 | loss 2.0", 1.0, poll_seq=1)
    assert (t.format, t.global_step) == ("step_line", 3)
    t = LogTracker([rx])
    t.feed_text("it 4 loss 1.5", 1.0, poll_seq=1)
    assert (t.format, t.global_step) == ("pattern 1", 4)
    t.feed_text("step 9 | loss 2.0", 2.0, poll_seq=2)  # locked to the pattern: another shape never moves it
    assert t.global_step == 4


@pytest.mark.parametrize("lines, hinted", [(HINT_AFTER_LINES - 1, False), (HINT_AFTER_LINES, True)])
def test_the_hint_comes_after_50_unread_lines(lines, hinted):
    t = LogTracker()
    for i in range(lines):
        t.feed(seg(f"loading thing {i}", 1.0, 1))
    hint = log_hint(t, steps_from_events=False)
    assert HINT_AFTER_LINES == 50
    if hinted:
        assert hint == (f"no known shape matched {lines} lines of the log: add [log] patterns to the run config "
                        "(README: Reading any training log), or use stepwatch.telemetry")
    else:
        assert hint is None
    assert log_hint(t, steps_from_events=True) is None


@pytest.mark.parametrize("lines, rich_hint", [(4, False), (5, True)])
def test_the_rich_hint_comes_after_lightnings_banner_and_5_lines(lines, rich_hint):
    t = LogTracker()
    t.feed(seg(LIGHTNING_BANNER + "True (cuda), used: True", 1.0, 1))
    for i in range(lines - 1):
        t.feed(seg(f"line {i}", 1.0, 1))
    hint = log_hint(t, steps_from_events=False)
    assert (hint is not None and hint.startswith("Lightning's progress bar is not in the log")) == rich_hint
    assert t.lightning_seen


def test_at_most_64_metric_series():
    t = LogTracker()
    names = [f"m{i:02d}" for i in range(70)]
    for k in range(0, 70, 10):
        t.feed_text(json.dumps({"step": k + 1, **{n: 1.0 for n in names[k:k + 10]}}), 1.0 + k, poll_seq=k + 1)
    assert len(t.series) == MAX_SERIES == 64 and list(t.series) == names[:64]
    assert "m64" not in t.last_metrics and t.last_metrics["m63"] == (61, 1.0)


def test_the_summary_dict_is_told_from_a_training_dict():
    assert is_summary({"train_runtime": 10.0, "train_loss": 2.0})
    assert is_summary({"train_runtime": 10.0, "train_samples_per_second": 3.0})
    assert not is_summary({"loss": 2.0, "train_runtime": 10.0})  # with include_num_input_tokens_seen
    assert not is_summary({"loss": 2.0, "learning_rate": 1e-4})


def test_the_run_configs_patterns_only_from_this_users_run_json(tmp_path: Path):
    assert run_patterns(tmp_path) == []  # no run.json at all
    (tmp_path / "run.json").write_text(json.dumps({"config": {"log": {"patterns": [r"it (?P<step>\d+)"]}}}))
    [rx] = run_patterns(tmp_path)
    assert rx.pattern == r"it (?P<step>\d+)"
    (tmp_path / "run.json").write_text(json.dumps({"config": {"log": {"patterns": [r"it (\d+)"]}}}))
    assert run_patterns(tmp_path) == []  # no step group: not compiled, nothing read by it
    (tmp_path / "run.json").write_text(json.dumps({"config": {"log": "it (?P<step>\\d+)"}}))
    assert run_patterns(tmp_path) == []


def test_the_run_configs_patterns_are_not_taken_from_another_users_run_json(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the file to another user")
    (tmp_path / "run.json").write_text(json.dumps({"config": {"log": {"patterns": [r"it (?P<step>\d+)"]}}}))
    os.chown(tmp_path / "run.json", 65534, 65534)
    assert run_patterns(tmp_path) == []


def test_a_reported_step_time_is_kept_only_for_a_step_forward():
    """nanoGPT's own times: kept for each step after the first; a step going back (a restart from a
    checkpoint, a second loop) moves the step but its time is no step time of this run's sequence."""
    t = LogTracker()
    for k, (it, ms) in enumerate([(1, 100), (2, 110), (3, 120), (1, 130)]):
        t.feed_text(f"iter {it}: loss 2.0, time {ms}.00ms", 1.0 + k, poll_seq=k + 1)
    assert t.global_step == 1 and list(t.step_times) == [(2, 0.11), (3, 0.12)]


def test_another_ranks_log_dict_or_train_output_is_never_the_runs():
    """A tqdm run under torchrun --tee: rank 1's prefixed log dict and TrainOutput line pass by; the
    last log, the summary and the step stay rank 0's (found by the mutation run of logtracker.py: rank
    1's dict used to become the run's last log, its TrainOutput its final step)."""
    t = LogTracker()
    t.feed_text("[rank0]: 50%|█████     | 5/10 [00:01<00:01,  4.00it/s]", 1.0, poll_seq=1)
    t.feed_text("[rank0]: {'loss': 2.0, 'learning_rate': 0.1, 'epoch': 0.5}", 1.1, poll_seq=2)
    assert t.format == "tqdm" and t.last_log == {"loss": 2.0, "learning_rate": 0.1, "epoch": 0.5}
    t.feed_text("[rank1]: {'loss': 9.0, 'learning_rate': 0.1, 'epoch': 0.5}", 1.2, poll_seq=3)
    t.feed_text("[rank1]: {'train_runtime': 3.0, 'train_loss': 9.0}", 1.3, poll_seq=4)
    t.feed_text("[rank1]: TrainOutput(global_step=77, training_loss=9.0, metrics={})", 1.4, poll_seq=5)
    assert (t.last_log["loss"], t.summary, t.global_step, t.finished) == (2.0, None, 5, False)
    assert t.last_metrics["loss"] == (5, 2.0)
    t.feed_text("[rank0]: TrainOutput(global_step=10, training_loss=2.0, metrics={})", 1.5, poll_seq=6)
    assert (t.global_step, t.finished) == (10, True)


BAR = "{}%|█████     | {}/100 [00:01<00:01,  4.00it/s]"


def test_log_dicts_are_still_read_after_the_kept_ones_are_full():
    """``logs`` keeps the last ``keep`` dicts; every later dict still becomes the latest metrics (a run
    logging every step for longer than keep steps kept showing the loss of the dict that filled it)."""
    t = LogTracker(keep=3)
    for k in range(1, 7):
        t.feed_text(BAR.format(k, k), float(k), poll_seq=2 * k)
        t.feed_text(f"{{'loss': {k}.5, 'learning_rate': 0.1, 'epoch': 0.1}}", k + 0.5, poll_seq=2 * k + 1)
    assert len(t.logs) == 3 and t.n_logs == 6 and t.last_metrics["loss"] == (6, 6.5)


def test_a_log_dict_takes_the_step_of_the_bar_redrawn_after_it():
    t = LogTracker()
    t.feed_text("{'loss': 9.0, 'learning_rate': 0.1, 'epoch': 0.0}", 0.5, poll_seq=1)  # before any bar: no step
    t.feed_text(BAR.format(5, 5), 1.0, poll_seq=2)
    assert t.last_metrics["loss"] == (None, 9.0)  # a dict without a step is never relabelled
    t.feed_text("{'loss': 2.0, 'learning_rate': 0.1, 'epoch': 0.1}", 1.5, poll_seq=3)
    assert t.last_metrics["loss"] == (5, 2.0)
    t.feed_text(BAR.format(10, 10), 2.0, poll_seq=4)  # tqdm.write redraws the bar: the dict was step 10's
    assert t.last_metrics["loss"] == (10, 2.0) and t.matched_lines == 2
    t.feed_text(BAR.format(11, 11), 2.5, poll_seq=5)  # the next redraw is another step's: no relabel
    assert t.last_metrics["loss"] == (10, 2.0) and t.matched_lines == 3


def test_a_step_restated_is_no_advance_and_the_bar_finishes_at_its_total():
    t = LogTracker()
    assert len(t.feed_text(json.dumps({"step": 5, "max_steps": 10, "loss": 1.0}), 1.0, poll_seq=1)) == 1
    assert t.feed_text(json.dumps({"step": 5, "loss": 0.9}), 1.5, poll_seq=2) == []  # restated: its metrics kept
    assert t.last_metrics["loss"] == (5, 0.9) and t.finished is False
    t.feed_text(json.dumps({"step": 10, "loss": 0.8}), 2.0, poll_seq=3)
    assert t.finished is True
    t.feed_text(json.dumps({"step": 12, "loss": 0.8}), 2.5, poll_seq=4)
    assert t.finished is True
    [adv] = t.feed_text(json.dumps({"step": 3, "loss": 0.8}), 3.0, poll_seq=5)  # back: a new loop
    assert (adv.step, adv.dt_s, t.finished) == (3, None, False)


def test_arrival_times_without_poll_numbers():
    t = LogTracker()
    t.feed_text("step 1 | loss 2.0", 10.0)
    [adv] = t.feed_text("step 2 | loss 2.0", 10.5)
    assert adv.dt_s == 0.5


def test_lightnings_tqdm_bar_made_global_its_resets_and_what_it_is_not():
    t = LogTracker()
    t.feed_text("GPU available: False, used: False")  # Lightning's first line names the bar's program
    t.feed_text("Epoch 0:   0%|          | 0/10 [00:00<?, ?it/s]", 1.0, poll_seq=1)
    assert (t.format, t.global_step) == ("lightning_tqdm", 0)
    t.feed_text("Epoch 0:  90%|█████████ | 9/10 [00:01<00:00,  4.00it/s, v_num=0, train_loss=2.31]", 2.0, poll_seq=2)
    assert t.global_step == 9 and t.last_metrics["train_loss"] == (9, 2.31) and "Epoch" not in t.last_metrics
    assert set(t.last_metrics) == {"v_num", "train_loss"}
    t.feed_text("Epoch 0:   0%|          | 0/10 [00:00<?, ?it/s]", 2.5, poll_seq=3)  # the reset before "Epoch 1"
    assert t.global_step == 9
    t.feed_text("Epoch 1:   0%|          | 0/10 [00:00<?, ?it/s]", 3.0, poll_seq=4)
    assert t.global_step == 10
    t.feed_text("Epoch 1: 120%|██████████| 12/10 [00:01<00:00,  4.00it/s]", 3.5, poll_seq=5)  # past its total
    assert t.global_step == 10
    again = LogTracker()  # a second fit() in the same log: its counter starts over, followed (not a reset)
    again.feed_text("Epoch 2:  50%|█████     | 5/10 [00:01<00:01,  4.00it/s]", 1.0, poll_seq=1)
    again.feed_text("Epoch 0:  30%|███       | 3/10 [00:01<00:01,  4.00it/s]", 2.0, poll_seq=2)
    assert again.global_step == 3  # 25 before: only a bar at 0 behind the counter is an epoch's reset
    slow = LogTracker()  # a step over 1 s: tqdm prints s/it, and the metrics follow it all the same
    slow.feed_text("GPU available: False, used: False")
    slow.feed_text("Epoch 0:   0%|          | 0/10 [00:00<?, ?it/s]", 1.0, poll_seq=1)
    slow.feed_text("Epoch 0:  20%|██        | 2/10 [00:05<00:20,  2.50s/it, v_num=0, train_loss=2.31]", 6.0, poll_seq=2)
    assert (slow.format, slow.global_step, slow.last_metrics["train_loss"]) == ("lightning_tqdm", 2, (2, 2.31))
    assert set(slow.last_metrics) == {"v_num", "train_loss"}
    for unit in ("batch", "tokens"):
        u = LogTracker()
        u.feed_text(f"Epoch 1:  50%|█████     | 5/10 [00:01<00:01,  4.00{unit}/s]", 1.0, poll_seq=1)
        assert u.format != "lightning_tqdm", unit
    s = LogTracker()
    s.feed_text("step 3 | loss 2.0", 1.0, poll_seq=1)
    s.feed_text("Epoch 1:  50%|█████     | 5/10 [00:01<00:01,  4.00it/s]", 2.0, poll_seq=2)
    assert (s.format, s.global_step) == ("step_line", 3)
    s.feed_text("step 4 | loss 2.0", 3.0, poll_seq=3)
    assert s.global_step == 4


RICH = "Epoch 0/4 " + "━" * 40 + " {}/50 0:00:01 • 0:00:04 10.53it/s v_num: 0 train_loss: 2.310"


def test_a_rich_bar_drawn_in_place_is_read_from_the_tail_and_only_forward_by_its_frames():
    t = LogTracker()
    [adv] = t.feed(seg(RICH.format(10), 1.0, 1, end=""))
    assert (adv.step, t.format, t.total) == (10, "lightning_rich", 250)
    assert t.feed(seg(RICH.format(10), 1.5, 2, end="")) == []  # the same frame again
    assert t.feed(seg(RICH.format(11), 2.0, 3, end=""))[0].step == 11
    t.feed_text("step 3 | loss 2.0", 2.5, poll_seq=4)  # feed_text after a tail: a whole line, not a tail
    s = LogTracker()
    s.feed(seg("step 3 | loss 2.0", 1.0, 1))
    assert s.feed(seg(RICH.format(20), 1.5, 2, end="")) == [] and s.format == "step_line"
    assert s.feed_text("step 4 | loss 2.0", 2.0, poll_seq=3)[0].step == 4  # a feed_text after a tail is a line


def test_a_user_pattern_reads_lines_up_to_4096_characters_and_a_locked_shape_keeps_reading():
    from stepwatch.monitors.parsers.logformats import MAX_LINE_CHARS

    [rx] = compile_patterns([r"it (?P<step>\d+) loss (?P<loss>[\d.]+)"])
    t = LogTracker([rx])
    line = "it 3 loss 1.5"
    t.feed_text(line + " " * (MAX_LINE_CHARS - len(line)), 1.0, poll_seq=1)
    assert t.global_step == 3
    t.feed_text("it 4 loss 1.5" + " " * MAX_LINE_CHARS, 2.0, poll_seq=2)  # past the limit: not tried
    assert t.global_step == 3
    s = LogTracker([rx])
    for k in (3, 4):
        s.feed_text(f"step {k} | loss 2.0", float(k), poll_seq=k)
    assert (s.format, s.global_step) == ("step_line", 4)


def test_the_hints_keep_coming_past_their_line_counts(tmp_path: Path):
    t = LogTracker()
    for i in range(HINT_AFTER_LINES + 1):
        t.feed(seg(f"loading thing {i}", 1.0, 1))
    assert log_hint(t, False).startswith(f"no known shape matched {HINT_AFTER_LINES + 1} lines")
    r = LogTracker()
    r.feed(seg(LIGHTNING_BANNER + "True (cuda), used: True", 1.0, 1))
    for i in range(6):
        r.feed(seg(f"line {i}", 1.0, 1))
    assert log_hint(r, False).startswith("Lightning's progress bar is not in the log")
    (tmp_path / "run.json").mkdir()  # not a regular file: no patterns, no error
    assert run_patterns(tmp_path) == []


def test_at_the_series_cap_known_metrics_still_update():
    t = LogTracker()
    for k in range(2):  # 32 metrics a line at most
        t.feed_text(json.dumps({"step": k + 1, **{f"m{i:02d}": 1.0 for i in range(32 * k, 32 * k + 32)}}), 1.0 + k,
                    poll_seq=k + 1)
    assert len(t.series) == 64
    t.feed_text(json.dumps({"step": 3, "new": 5.0, "m00": 7.0}), 3.0, poll_seq=3)
    assert "new" not in t.series and t.last_metrics["m00"] == (3, 7.0)
