"""Issue 31's variants as the real programs printed them (tests/fixtures/real/, the 2026-12-03 captures;
their README says how each was made): each capture read by the log follower, the tracker and the
supervisor's step timer, as a run's train.log is. Unit tier: files only."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import FIXTURES_REAL
from stepwatch.monitors.parsers.logformats import compile_patterns
from stepwatch.monitors.parsers.logtracker import LogSettings, LogTracker, log_hint
from stepwatch.monitors.parsers.traceback import last_text
from stepwatch.monitors.readers.textlog import LogFollower
from stepwatch.monitors.watch.logsteps import LogStepTimer


def read(name: str, tracker: LogTracker | None = None) -> tuple[LogTracker, list[int], LogFollower]:
    """The capture through a follower, segment by segment, each its own poll a second apart: the tracker,
    every step it moved to, and the follower (its last lines and unfinished tail)."""
    t = tracker or LogTracker()
    f = LogFollower(FIXTURES_REAL / name, from_start=True)
    steps: list[int] = []
    for i, seg in enumerate(f.poll()):
        seg.at_s, seg.poll_seq = 1000.0 + i, i + 1
        steps += [a.step for a in t.feed(seg)]
    if (tail := f.partial_segment) is not None:
        steps += [a.step for a in t.feed(tail)]
    return t, steps, f


def text(name: str) -> str:
    return (FIXTURES_REAL / name).read_bytes().decode("utf-8", "replace")  # \r kept (read_text makes it \n)


def test_a_plain_loops_train_bar_gives_its_steps_and_its_postfix_loss():
    t, steps, _ = read("tqdm_desc_postfix.log")
    last_loss = float(re.findall(r"100/100 \[[^\]]*loss=([\d.]+)\]", text("tqdm_desc_postfix.log"))[-1])
    assert (t.format, t.global_step, t.total) == ("tqdm", 100, 100) and steps == sorted(steps)
    assert t.last_metrics["loss"] == (100, last_loss)


def test_a_bar_per_epoch_is_one_global_counter_and_its_total_comes_from_the_config():
    t, steps, _ = read("tqdm_epochs.log")
    assert (t.format, t.global_step, t.total) == ("tqdm_epochs", 120, None) and steps == sorted(steps)
    told, _, _ = read("tqdm_epochs.log", LogTracker(settings=LogSettings(epochs=3)))
    assert (told.global_step, told.total) == (120, 120)


def test_two_processes_bars_in_one_log_are_two_streams_and_the_headline_counts_one_of_them():
    t, steps, _ = read("tqdm_two_procs.log")
    log = text("tqdm_two_procs.log")
    assert len(set(re.findall(r"train: +\d+%\|[^|]*\| (\d+)/300", log))) > 300 * 0.3  # both bars are in it
    assert t.streams is not None and t.streams.interleaved == 2
    assert steps == sorted(steps) and t.global_step == 300  # never back and forth between the two
    timer = LogStepTimer()
    f = LogFollower(FIXTURES_REAL / "tqdm_two_procs.log", from_start=True)
    records = [r for i, seg in enumerate(f.poll()) for r in timer.feed_poll([_at(seg, i)], None)]
    counted = [r["step"] for r in records]
    assert len(counted) <= 300 and len(counted) == len(set(counted)), len(counted)


def _at(seg, i):
    seg.at_s, seg.poll_seq = 1000.0 + i, i + 1
    return seg


def test_a_run_killed_mid_bar_leaves_its_bar_as_the_last_text_without_control_codes():
    t, _, f = read("tqdm_sigkill.log")
    raw = text("tqdm_sigkill.log")
    assert "\n" not in raw  # the bar never ended its line
    last = last_text(list(f.last_lines), f.current_partial) or ""
    assert last == raw.rsplit("\r", 1)[-1].strip() and last.startswith("train:  58%|") and "\r" not in last
    assert t.global_step == 58


def test_lightnings_rich_bar_with_max_steps_only_is_read_to_its_end_with_the_total_where_known():
    """Epoch 0's bar total is min(its batches, max_steps): 40 batches of a 100-step run read as the run's total made
    step 40 the end, the first validation "finishing" and the ETA seconds where a minute was left (issue 44). The
    total is known once a last, shorter epoch shows the steps left; before, it is unknown, never a made-up end."""
    totals, phases = {}, set()
    t = LogTracker()
    f = LogFollower(FIXTURES_REAL / "lightning_rich_max_steps.log", from_start=True)
    for i, seg in enumerate(f.poll()):
        for a in t.feed(_at(seg, i)):
            totals[a.step] = t.total
        if t.global_step == 40:
            phases.add(t.phases.name)
    assert "Epoch 0/-2" in text("lightning_rich_max_steps.log") and t.format == "lightning_rich"
    assert (t.global_step, t.total) == (100, 100)
    assert totals[20] is None and totals[60] is None and totals[100] == 100  # epochs 0, 1: unknown; the last: known
    assert "evaluating" in phases and "finishing" not in phases, phases  # the first validation, at step 40
    mid, _, _ = read("lightning_rich_max_steps_midepoch.log")
    assert (mid.global_step, mid.total) == (60, None)  # 60 of 100 batches: as likely the epoch's as the run's
    assert log_hint(t, False) is None  # the bar is in the log: no hint says it is not


def test_lightnings_tqdm_bar_with_max_steps_reads_every_step_and_takes_the_total_from_the_config():
    t, steps, _ = read("lightning_tqdm_max_steps.log")
    assert (t.format, t.global_step, t.total) == ("lightning_tqdm", 100, None) and steps == sorted(steps)
    assert "max_steps" not in t.last_metrics  # "`Trainer.fit` stopped: `max_steps=100`" glued to the bar is no metric
    told, _, _ = read("lightning_tqdm_max_steps.log", LogTracker(settings=LogSettings(max_steps=100)))
    assert told.total == 100


def test_the_hf_trainer_with_no_bar_counts_its_log_dicts():
    t, steps, _ = read("hf_trainer_no_tqdm.log")
    dicts = re.findall(r"\{'loss': '([\d.]+)'", text("hf_trainer_no_tqdm.log"))
    assert len(dicts) == 30 and (t.format, t.global_step) == ("hf_logdict", 30)
    assert steps == list(range(2, 31)) and t.last_metrics["loss"] == (30, float(dicts[-1]))


def _dicts_as_read(settings: LogSettings | None = None, path: Path = FIXTURES_REAL / "torchrun_tee_dicts.log",
                   ) -> list[tuple[int | None, float, float]]:
    """(loss step, loss, learning rate) after each of rank 0's training dicts of the torchrun --tee capture."""
    t = LogTracker(settings=settings)
    got = []
    for i, seg in enumerate(LogFollower(path, from_start=True).poll()):
        seg.at_s, seg.poll_seq = 1000.0 + i, i + 1
        t.feed(seg)
        if seg.text.startswith("[default0]:{'loss'"):
            got.append((t.last_metrics["loss"][0], t.last_metrics["loss"][1], t.last_metrics["learning_rate"][1]))
    assert t.format == "tqdm" and t.global_step == 30
    return got


def test_rank_prefixed_dicts_under_torchrun_tee_are_each_read_and_with_logging_steps_at_their_step():
    """torchrun tails stdout and stderr apart: 5 of the 10 dicts land glued to a bar frame (``…47.25it/s]
    [default0]:{'loss': …}``); each is read. The bar may be up to 6 steps off when a dict arrives, so the dict's
    own step comes from ``[log] logging_steps`` (HF logs at each multiple)."""
    raw = text("torchrun_tee_dicts.log")
    printed = [(float(a), float(b)) for a, b in re.findall(
        r"\[default0\]:\{'loss': '([\d.]+)', 'grad_norm': '[\d.]+', 'learning_rate': '([\d.e-]+)'", raw)]
    assert len(printed) == 10 and len(re.findall(r"it/s\]\[default0\]:\{'loss'", raw)) == 5
    by_bar = _dicts_as_read()
    assert [(v, lr) for _, v, lr in by_bar] == printed  # every dict read, glued or not
    assert all(s is not None and abs(s - 3 * (k + 1)) <= 6 for k, (s, _, _) in enumerate(by_bar)), by_bar
    own = _dicts_as_read(LogSettings(logging_steps=3))
    assert own == [(3 * (k + 1), v, lr) for k, (v, lr) in enumerate(printed)]


def test_a_dict_that_arrives_before_any_bar_frame_still_counts_toward_the_next_dicts_step(tmp_path: Path):
    """Seen in CI under load: torchrun tailed rank 0's stdout ahead of its stderr, so the first dict came before the
    first bar frame; every later dict was then labelled one logging interval early (the last at 27 of 30). The real
    capture with its first dict moved ahead of the first bar frame reads each dict at its own step."""
    lines = text("torchrun_tee_dicts.log").split("\n")
    first_dict = next(i for i, ln in enumerate(lines) if ln.startswith("[default0]:{'loss'"))
    first_bar = next(i for i, ln in enumerate(lines) if ln.startswith("[default0]:") and "it/s]" in ln)
    assert first_bar < first_dict  # the capture as recorded: a bar frame first
    lines.insert(first_bar, lines.pop(first_dict))
    early = tmp_path / "tee_dict_first.log"
    early.write_text("\n".join(lines))
    own = _dicts_as_read(LogSettings(logging_steps=3), early)
    assert [s for s, _, _ in own] == [3 * (k + 1) for k in range(10)], own


def test_a_first_dict_read_while_the_bar_shows_steps_past_it_is_still_at_the_first_interval(tmp_path: Path):
    """Seen live: the first dict (step 3) tailed after the bar frame of step 5; the multiple nearest the bar (6)
    labelled every later dict one interval late (the last at 33 of 30). The real capture with its first dict moved
    after the first bar frame past step 4 reads each dict at its own step."""
    lines = text("torchrun_tee_dicts.log").split("\n")
    first_dict = next(i for i, ln in enumerate(lines) if ln.startswith("[default0]:{'loss'"))
    ahead = next(i for i, ln in enumerate(lines) if re.search(r"\| [5-9]/30 \[", ln))
    assert ahead > first_dict  # the capture as recorded: the dict before that frame
    lines.insert(ahead, lines.pop(first_dict))
    late = tmp_path / "tee_bar_ahead.log"
    late.write_text("\n".join(lines))
    own = _dicts_as_read(LogSettings(logging_steps=3), late)
    assert [s for s, _, _ in own] == [3 * (k + 1) for k in range(10)], own


def test_a_timm_shaped_counter_through_a_user_pattern_with_an_epoch_group_is_global():
    pat = r"Train: (?P<epoch>\d+) \[\s*(?P<step>\d+)/(?P<steps_per_epoch>\d+) .*Loss: (?P<loss>[\d.]+)"
    t, steps, _ = read("timm_shaped.log", LogTracker(compile_patterns([pat]), LogSettings(epochs=3)))
    assert t.format == "pattern 1" and t.global_step == 2 * 23 + 22 and t.total == 69
    assert steps == sorted(steps) and len(steps) == len(re.findall(r"^Train: ", text("timm_shaped.log"), re.M))


def test_the_captures_are_where_the_readme_says():
    readme = (FIXTURES_REAL / "README.md").read_text()
    for name in ("tqdm_desc_postfix.log", "tqdm_epochs.log", "tqdm_two_procs.log", "tqdm_sigkill.log",
                 "lightning_rich_max_steps.log", "lightning_tqdm_max_steps.log", "hf_trainer_no_tqdm.log",
                 "torchrun_tee_dicts.log", "timm_shaped.log"):
        assert f"`{name}`" in readme and (FIXTURES_REAL / name).is_file(), name
