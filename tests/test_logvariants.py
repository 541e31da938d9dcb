"""The variants of the known log families that real programs print (issue 31): a tqdm bar with any
description and a postfix, epoch-scoped counters made global, Lightning's bar with max_steps only, the HF
Trainer with no bar, and what the log last said when the run died. Unit tier: lines fed in process; the
real captures are read in tests/test_realvariants.py."""

from __future__ import annotations

import pytest

from stepwatch.monitors.parsers.epochscope import EpochScope
from stepwatch.monitors.parsers.logformats import compile_patterns
from stepwatch.monitors.parsers.logtracker import LogSettings, LogTracker, log_hint, log_settings
from stepwatch.monitors.parsers.traceback import last_text
from stepwatch.monitors.readers.textlog import Segment


def tqdm_bar(n: int, total: int, desc: str = "", postfix: str = "", rate: str = "5.00it/s") -> str:
    pct = 100 * n // total
    return f"{desc + ': ' if desc else ''}{pct:3d}%|{'█' * (pct // 10):<10}| {n}/{total} [00:01<00:02, {rate}{postfix}]"


def feed(t: LogTracker, lines: list[str], start_s: float = 0.0, dt_s: float = 0.1) -> list[int]:
    """Each line as one poll's segment, dt_s apart: the steps it moved to."""
    steps = []
    for i, ln in enumerate(lines):
        steps += [a.step for a in t.feed(Segment(ln, "\n", at_s=start_s + i * dt_s, poll_seq=i + 1))]
    return steps


# --- a tqdm bar with any description, its postfix ---------------------------------------------------
@pytest.mark.parametrize("desc", ["train", "Training", "steps", "my run", ""])
def test_a_plain_loops_bar_is_read_whatever_its_description_and_its_postfix_loss_is_kept(desc):
    t = LogTracker()
    steps = feed(t, [tqdm_bar(i, 50, desc, f", loss={2.0 - i / 100:.3f}") for i in range(0, 21)])
    assert steps == list(range(0, 21)) and t.format == "tqdm" and t.total == 50
    assert t.last_metrics["loss"] == (20, 1.8)
    assert [s for s, _ in t.step_times] == list(range(1, 21))  # one dt per step, from the arrivals


@pytest.mark.parametrize("desc", ["Map", "Tokenizing", "Writing model shards", "Loading checkpoint shards",
                                  "Validation DataLoader 0", "eval", "Sanity Checking DataLoader 0", "Downloading"])
def test_preprocessing_evaluation_and_checkpoint_bars_never_move_the_step(desc):
    t = LogTracker()
    assert feed(t, [tqdm_bar(i, 10, desc) for i in range(11)]) == [] and t.global_step is None
    assert log_hint(t, False) == "waiting for the first training step (11 lines of preprocessing)"


def test_the_hint_while_preprocessing_says_waiting_and_never_that_no_shape_matched():
    t = LogTracker()
    for i in range(200):  # a tokenizer's bar ended by newlines, as datasets prints when not a terminal
        t.feed(Segment(tqdm_bar(i % 100, 100, "Map", rate="250.00examples/s"), "\n"))
    assert log_hint(t, False) == "waiting for the first training step (200 lines of preprocessing)"
    for i in range(60):  # then the bars stop and 60 lines of something no shape knows
        t.feed(Segment(f"{i}: ok", "\n"))
    assert (log_hint(t, False) or "").startswith("no known shape matched 260 lines")
    t.feed(Segment(tqdm_bar(1, 10, "train"), "\n"))
    assert log_hint(t, False) is None and t.global_step == 1


def test_a_neutral_preparation_bar_that_ran_to_its_end_hands_over_to_the_next_bar():
    t = LogTracker()
    feed(t, [tqdm_bar(i, 5, "preparing data") for i in range(6)])  # "prepar": never training
    assert t.global_step is None
    t2 = LogTracker()
    assert feed(t2, [tqdm_bar(i, 5, "warming") for i in range(6)]) == list(range(6))  # neutral: taken first
    assert feed(t2, [tqdm_bar(i, 40, "run") for i in range(1, 4)]) == [1, 2, 3]  # it ended: the next one starts
    assert (t2.global_step, t2.total) == (3, 40)
    t3 = LogTracker()
    feed(t3, [tqdm_bar(i, 5, "warming") for i in range(3)])
    assert feed(t3, [tqdm_bar(i, 40, "train") for i in range(1, 3)]) == [1, 2]  # a training word wins at once


# --- epoch-scoped counters ----------------------------------------------------------------------------
def test_a_bar_per_epoch_counted_from_one_is_made_global_with_its_total_from_the_description():
    t = LogTracker()
    lines = [tqdm_bar(i, 20, f"Epoch {e}/3") for e in (1, 2, 3) for i in range(21)]
    steps = feed(t, lines)
    assert t.format == "tqdm_epochs" and t.global_step == 60 and t.total == 60
    assert steps[:3] == [0, 1, 2] and 40 in steps and steps[-1] == 60 and steps == sorted(steps)


def test_lightnings_tqdm_bar_has_no_total_unless_the_config_says_how_many_epochs():
    lines = ["GPU available: False, used: False"] + [tqdm_bar(i, 40, f"Epoch {e}") for e in range(2) for i in range(41)]
    t = LogTracker()
    feed(t, lines)
    assert (t.format, t.global_step, t.total) == ("lightning_tqdm", 80, None)  # unknown, never 40
    plain = LogTracker()
    feed(plain, lines[1:])
    assert (plain.format, plain.global_step) == ("tqdm_epochs", 80)  # the same reading, without Lightning's banner
    told = LogTracker(settings=LogSettings(epochs=3))
    feed(told, lines)
    assert (told.global_step, told.total) == (80, 120)


def test_an_epochs_own_length_counts_when_the_last_epoch_is_shorter():
    s = EpochScope()
    assert [s.global_step(0, 100, 100), s.global_step(1, 100, 100), s.global_step(2, 30, 30)] == [100, 200, 230]
    assert s.total(3, 2, 30) == 230 and s.total(None, 2, 30) is None


def test_an_epoch_never_seen_takes_the_current_length():
    s = EpochScope()
    assert s.global_step(4, 5, 10) == 45  # attached in epoch 4 of a log read from its tail


RICH = "Epoch {e}/{last} ━━━━━━━━━━━━━━━╸━━━━━━━━━━━ {n}/{per} 0:00:03 • 0:00:18 4.87it/s train_loss: {loss}"


def test_lightnings_rich_bar_with_max_steps_only_reads_the_steps_and_the_total_where_it_can_be_known():
    t = LogTracker()
    feed(t, [RICH.format(e=0, last=-2, n=n, per=100, loss=1.5) for n in range(1, 16)])
    assert (t.format, t.global_step, t.total) == ("lightning_rich", 15, None)  # min(batches, max_steps): which?
    assert t.last_metrics["train_loss"] == (15, 1.5)
    feed(t, [RICH.format(e=0, last=-2, n=100, per=100, loss=1.2), RICH.format(e=1, last=-2, n=1, per=100, loss=1.1)])
    assert (t.global_step, t.total) == (101, None)  # a second epoch: 100 was the epoch's length, not the run's
    feed(t, [RICH.format(e=1, last=-2, n=100, per=100, loss=1.0), RICH.format(e=2, last=-2, n=1, per=50, loss=0.9)])
    assert (t.global_step, t.total) == (201, 250)  # the last epoch is the steps left


def test_a_user_pattern_with_an_epoch_group_makes_a_timm_counter_global():
    pat = r"Train: (?P<epoch>\d+) \[\s*(?P<step>\d+)/(?P<steps_per_epoch>\d+) .*Loss: (?P<loss>[\d.]+)"
    line = "Train: {e} [{i:>4d}/22 ({p:>3.0f}%)]  Loss: 2.{i:03d} (2.100)  Time: 0.100s,  320.00/s  (0.105s,  304.76/s)"
    t = LogTracker(compile_patterns([pat]), LogSettings(epochs=3))
    feed(t, [line.format(e=e, i=i, p=100 * (i + 1) / 22) for e in range(3) for i in range(22)])
    assert t.format == "pattern 1" and t.global_step == 2 * 22 + 21 and t.total == 66
    with pytest.raises(ValueError, match="no \\(\\?P<steps_per_epoch>"):
        compile_patterns([r"Train: (?P<epoch>\d+) \[\s*(?P<step>\d+)"])


# --- the HF Trainer with no bar (disable_tqdm=True) ------------------------------------------------------
def test_hf_log_dicts_without_a_bar_are_steps_and_evaluation_and_summary_dicts_are_not():
    dicts = [f"{{'loss': '{2 - i / 10:.4g}', 'grad_norm': '0.5', 'learning_rate': '1e-4', 'epoch': '{i / 30:.4g}'}}"
             for i in range(1, 31)]
    lines = [*dicts[:10], "{'eval_loss': '1.5', 'eval_runtime': '0.1', 'epoch': '0.3333'}", *dicts[10:],
             "{'train_runtime': '3.0', 'train_samples_per_second': '80', 'train_loss': '1.2', 'epoch': '1'}"]
    t = LogTracker()
    steps = feed(t, lines)
    assert t.format == "hf_logdict" and steps == list(range(2, 31)) and t.global_step == 30
    assert t.last_metrics["loss"][0] == 30 and t.last_metrics["eval_loss"] == (10, 1.5)
    assert [s for s, _ in t.step_times] == list(range(3, 31))  # the first step is the shape's, untimed
    every5 = LogTracker(settings=LogSettings(logging_steps=5, max_steps=150))
    assert feed(every5, dicts)[-1] == 150 and every5.total == 150


def test_log_settings_are_whole_numbers_from_one():
    assert log_settings({"max_steps": 300, "epochs": 3}) == LogSettings(300, 3, 1)
    for bad in ({"max_steps": 0}, {"epochs": "3"}, {"logging_steps": 1.5}, {"max_steps": True}):
        with pytest.raises(ValueError, match="must be a whole number from 1"):
            log_settings(bad)


# --- what the log last said ------------------------------------------------------------------------------
def test_the_last_text_is_the_bar_being_drawn_without_its_control_codes():
    bar = "\x1b[2K\x1b[35mEpoch 0/2\x1b[0m ━━━╸━━ 44/500 0:00:05 • 0:00:40 9.8it/s loss: 1.2\x07"
    assert last_text(["Using bf16", "Epoch 0/2 ━ 1/500"], bar) == "Epoch 0/2 ━━━╸━━ 44/500 0:00:05 • 0:00:40 9.8it/s loss: 1.2"
    assert last_text(["start", "  ", ""], None) == "start"
    assert last_text([], "   ") is None and len(last_text(["x" * 5000], None) or "") == 300


# --- the checklist tries each shape on the run's [log] examples before there is a log ------------------
@pytest.mark.parametrize("fmt, examples", [
    ("tqdm", [tqdm_bar(3, 50, "train", ", loss=1.23")]),
    ("tqdm_epochs", [tqdm_bar(3, 50, "Epoch 1/3")]),
    ("lightning_rich", [RICH.format(e=0, last=-2, n=15, per=100, loss=1.5)]),
    ("hf_logdict", ["{'loss': '5.545', 'grad_norm': '0.6058', 'learning_rate': '0', 'epoch': '0.06667'}",
                    "{'loss': '5.559', 'grad_norm': '0.6222', 'learning_rate': '0.0002', 'epoch': '0.1333'}"]),
])
def test_the_checklist_reads_each_shape_from_the_configs_examples(tmp_path, fmt, examples):
    import sys

    from stepwatch.launcher.config import config_from_flags
    from stepwatch.launcher.preflight import check_log_format

    cfg = config_from_flags([sys.executable, "t.py"], "r", str(tmp_path), str(tmp_path / "runs"))
    cfg.log = {"examples": examples}
    item = check_log_format(cfg)
    assert item.status == "pass" and f"read as {fmt} (step " in item.reason and item.detail["format"] == fmt, item
    cfg.log = {"examples": ["loading the data", "42 things done"]}  # the control: nothing a shape reads
    item = check_log_format(cfg)
    assert item.detail["format"] is None and "no recogniser matched its 2 example(s)" in item.reason, item


# --- several processes' bars in one log -------------------------------------------------------------------
def test_two_unprefixed_bars_are_two_streams_and_the_headline_never_merges_them():
    t = LogTracker()
    fast, slow, lines = 0, 0, []
    for i in range(60):  # one process twice as fast as the other, both drawing "train" bars unprefixed
        fast += 2
        lines.append(tqdm_bar(fast, 200, "train"))
        if i % 2 == 0:
            slow += 2
            lines.append(tqdm_bar(slow, 200, "train"))
    steps = feed(t, lines)
    assert t.streams is not None and t.streams.interleaved == 2
    assert steps == sorted(steps) and t.global_step == 120  # the first bar's counter alone
    assert len(t.step_times) <= 60


def test_a_restart_hands_over_once_the_old_bar_stops_and_a_finished_bar_at_once():
    t = LogTracker()
    feed(t, [tqdm_bar(i, 100, "train") for i in range(1, 51)])
    feed(t, [tqdm_bar(i, 100, "train") for i in range(1, 7)])  # a restart from 0: the old bar never moves again
    assert t.global_step == 6 and t.streams is not None and t.streams.interleaved == 0
    done = LogTracker()
    feed(done, [tqdm_bar(i, 10, "train") for i in range(1, 11)])
    assert feed(done, [tqdm_bar(1, 10, "train")]) == [1]  # a second train() after the first ended: followed at once


def test_rank_prefixes_that_appear_mid_run_make_rank_0s_bar_the_headline():
    t = LogTracker()
    lines = []
    for i in range(1, 11):  # rank 1 (faster) and rank 0 draw unprefixed bars into one log
        lines += [tqdm_bar(2 * i, 100, "train"), tqdm_bar(i, 100, "train")]
    feed(t, lines)
    assert t.global_step == 20  # the first stream (rank 1's, as it happened): nothing says which is rank 0's
    feed(t, ["[rank1]:" + tqdm_bar(22, 100, "train"), "[rank0]:" + tqdm_bar(11, 100, "train")])
    assert t.global_step == 11  # rank 0's own prefix: its stream is the headline
    feed(t, [tqdm_bar(24, 100, "train"), "[rank0]:" + tqdm_bar(12, 100, "train"), tqdm_bar(26, 100, "train")])
    assert t.global_step == 12  # for good: the unprefixed faster bar never takes it back


def test_a_rich_frame_whose_time_left_wrapped_to_the_next_row_is_read():
    """At 80 columns a three-digit counter pushes Rich's time remaining onto the second row (seen live:
    the step stuck at 219 for batches 100-119 of an epoch)."""
    t = LogTracker()
    feed(t, ["Epoch 0/-2 ━━━━━━━━━━━━━━━━━━ 120/120 0:00:06 • 0:00:00 18.84it/s loss: 0.004",
             "Epoch 1/-2 ━━━━━━━━━━━━━╺━━━ 99/120 0:00:05 • 0:00:02 18.84it/s loss: 0.003",
             "Epoch 1/-2 ━━━━━━━━━━━━━╺━━ 100/120 0:00:05 •        18.84it/s loss: 0.002"])
    assert t.global_step == 220 and t.last_metrics["loss"] == (220, 0.002)


# --- metrics behind rank prefixes, per rank -----------------------------------------------------------
def test_each_ranks_prefixed_metrics_are_its_own_and_reach_its_ranks_entry(tmp_path):
    from stepwatch.monitors.snapshot.ranks import RankSteps
    from stepwatch.monitors.watch.logsteps import RankLogTimers, encode_records

    timers = RankLogTimers()
    lines = [f"[default1]:{tqdm_bar(i, 30)}" for i in range(1, 4)]
    lines += ["[default1]:{'loss': '5.489', 'grad_norm': '0.4', 'learning_rate': '4e-05', 'epoch': '0.2'}",
              f"[default1]:{tqdm_bar(4, 30)}", "[default0]:{'loss': '9.0', 'epoch': '0.2'}"]
    out: list[dict] = []
    for i, ln in enumerate(lines):
        out += timers.feed_poll([Segment(ln, "\n", at_s=10.0 + i, poll_seq=i + 1)], None).get(1, [])
    logs = [r for r in out if r["kind"] == "log"]
    assert [r["logs"]["loss"] for r in logs] == [5.489] and logs[0]["rank"] == 1  # once, when it changed
    assert logs[0]["logs"]["learning_rate"] == 4e-05 and logs[0]["step"] == 3
    f = tmp_path / "logsteps.rank1.jsonl"
    f.write_bytes(encode_records(out))
    rs = RankSteps(f)
    rs.read()
    assert rs.summary()["metrics"]["loss"] == 5.489 and rs.summary()["last_step"] == 4  # rank 0's 9.0 is not rank 1's


def test_nested_epoch_and_iteration_bars_follow_the_inner_loop():
    """``for e in trange(3, desc="Epoch"): for b in tqdm(loader, desc="Iteration")`` (the older HF examples'
    loop): the outer bar's counter is epochs, the inner one's the steps; the control: the outer bar alone."""
    t = LogTracker()
    lines = [tqdm_bar(0, 3, "Epoch")] + [tqdm_bar(i, 50, "Iteration") for i in range(1, 11)]
    steps = feed(t, lines)
    assert steps == list(range(11)) and (t.bar_desc, t.total) == ("Iteration", 50)  # 0: the outer bar's first draw
    feed(t, [tqdm_bar(1, 3, "Epoch")])  # the outer bar moves on: never the step
    assert t.global_step == 10
    outer = LogTracker()
    assert feed(outer, [tqdm_bar(i, 3, "Epoch") for i in range(3)]) == [0, 1, 2]
