"""What the run is doing, from its log (ARCHITECTURE.md R18): evaluations and saves told from training in
the real captures, their intervals flagged so that no percentile counts them, and their own budgets for the
stall detector. Unit tier."""

from __future__ import annotations

import pytest

from conftest import FIXTURES_REAL
from stepwatch.monitors.detectors.stall import stall_state
from stepwatch.monitors.parsers.logformats import compile_patterns
from stepwatch.monitors.parsers.logtracker import LogSettings, LogTracker
from stepwatch.monitors.parsers.phases import PHASE_FLOOR_S, LogPhases, bar_phase, line_phase
from stepwatch.monitors.readers.textlog import LogFollower
from stepwatch.monitors.snapshot.phase import phase_part
from stepwatch.monitors.states import ENDED, EVALUATING, FINISHING, OK, SAVING, STALLED, STARTING, TRAINING
from stepwatch.monitors.watch.logsteps import LogStepTimer


@pytest.mark.parametrize("line, phase", [
    ("Saving model checkpoint to out/checkpoint-50", SAVING),
    ("saving checkpoint to out", SAVING),  # nanoGPT
    ("Saving current state to ckpt/step_100", SAVING),  # accelerate
    ("step 500: train loss 2.1, val loss 2.3", EVALUATING),  # nanoGPT's evaluation result
    ("Test: [   3/3]  Time: 0.000 (0.000)  Loss:   2.508 ( 2.530)", EVALUATING),  # timm
    ("***** Running Evaluation *****", EVALUATING),
    ("{'eval_loss': '1.5', 'eval_runtime': '0.1', 'epoch': '0.5'}", EVALUATING),
    ("Validation ━━━━━━━━━━━━━━━━━━╸━━ 9/10  0:00:00 • 0:00:01 1584.30it/s", EVALUATING),  # Lightning's Rich
    ("`Trainer.fit` stopped: `max_steps=100` reached.", FINISHING),
    ("{'train_runtime': '0.37', 'train_samples_per_second': '648.7', 'train_loss': '5.507', 'epoch': '2'}", FINISHING),
    ("Training completed. Do not forget to share your model on huggingface.co/models =)", FINISHING),  # HF Trainer
    ("training complete", FINISHING), ("Done training in 1:02:03", FINISHING), ("Training finished.", FINISHING),
    # the controls: training lines that name a metric of an evaluation, or a model, are no phase
    ("val_loss: 0.640", None),  # the second row of Lightning's Rich bar, redrawn while training
    ("iter 10: loss 2.0, time 16.12ms", None),
    ("{'loss': '5.545', 'grad_norm': '0.6058', 'learning_rate': '0', 'epoch': '0.06667'}", None),
    ("Loading the model from the hub", None),
    ("step 40: training is 40% done", None), ("resume training from step 40; completed steps: 40", None),
])
def test_a_line_says_which_phase_it_starts(line, phase):
    assert line_phase(line) == phase


def test_a_bar_that_is_not_trainings_says_evaluating_saving_or_nothing():
    assert bar_phase("Validation DataLoader 0", "") == EVALUATING
    assert bar_phase("", "") == EVALUATING  # the HF Trainer's evaluation bar: its training bar's description
    assert bar_phase("Writing model shards", "") == SAVING
    assert bar_phase("Map", "") is None and bar_phase("Downloading", "train") is None


def replay(name: str, tracker: LogTracker) -> tuple[LogTracker, list[dict]]:
    """The capture through a follower and the supervisor's step timer, a segment a poll, 0.1 s apart."""
    timer = LogStepTimer(tracker)
    f = LogFollower(FIXTURES_REAL / name, from_start=True)
    records = []
    for i, seg in enumerate(f.poll()):
        seg.at_s, seg.poll_seq = 1000.0 + i / 10, i + 1
        records += timer.feed_poll([seg], None)
    return tracker, records


def test_lightnings_validation_passes_are_evaluations_and_the_steps_after_them_no_step_time():
    t, records = replay("lightning_tqdm.log", LogTracker(settings=LogSettings(epochs=3)))
    assert t.phases.count.get(EVALUATING) == 2  # after epochs 0 and 1 (the third runs after the last step)
    flagged = [r["step"] for r in records if "eval" in r["flags"]]
    assert flagged and all(s in range(41, 45) or s in range(81, 85) for s in flagged), flagged
    assert t.phases.name == FINISHING  # the last step of the last epoch, then its validation and the end
    unknown, _ = replay("lightning_tqdm.log", LogTracker())  # how many epochs is unknown: no step is known last
    assert unknown.phases.count.get(EVALUATING) == 3 and unknown.phases.name == EVALUATING


def test_nanogpts_evaluations_are_phases_and_its_iter_times_are_kept():
    t, records = replay("nanogpt_cpu.log", LogTracker())
    assert t.phases.count.get(EVALUATING) == 2  # step 20 and 40; step 0's is before training
    flagged = [r["step"] for r in records if "eval" in r["flags"]]
    assert flagged == [20, 40], flagged  # nanoGPT evaluates at iter 20 before it trains and prints iter 20


def test_the_hf_trainers_checkpoint_bars_are_saves():
    t, _ = replay("hf_trainer_printer_callback.log", LogTracker())
    assert t.phases.count.get(SAVING), t.phases.count


def test_timms_test_lines_through_a_user_pattern_are_evaluations():
    pat = r"Train: (?P<epoch>\d+) \[\s*(?P<step>\d+)/(?P<steps_per_epoch>\d+) .*Loss: (?P<loss>[\d.]+)"
    t, records = replay("timm_shaped.log", LogTracker(compile_patterns([pat])))
    assert t.phases.count.get(EVALUATING) == 3 and any("eval" in r["flags"] for r in records)  # after each epoch


def test_a_phase_learns_its_longest_and_its_budget_is_three_times_that_with_a_floor():
    ph = LogPhases()
    ph.saw(SAVING, 1.0)
    assert ph.name == STARTING  # nothing interrupts training before it began
    ph.stepped(2.0, False)
    ph.saw(SAVING, 10.0)
    assert (ph.name, ph.budget_s()) == (SAVING, PHASE_FLOOR_S)
    assert ph.take_flags() == []  # the save's interval ends at the next step: its flag waits for it
    ph.stepped(210.0, False)  # a 200 s save
    assert ph.name == TRAINING and ph.longest_s == {SAVING: 200.0} and ph.budget_s(SAVING) == 600.0
    assert ph.take_flags() == ["save"] and ph.take_flags() == []
    assert ph.budget_s() is None  # training: the step budget's


def test_a_view_that_reads_the_log_at_once_learns_the_saves_length_from_the_supervisors_records(tmp_path):
    """``status`` reads the whole log in one go, so every save it sees lasts 0 s; the supervisor's records of the
    steps whose intervals held a save say how long it took, and the budget follows (3x, with the floor)."""
    import json

    from stepwatch.monitors.fold.events import EventsFold
    from stepwatch.monitors.readers.jsonl import EventReader
    from stepwatch.monitors.snapshot.phase import learn_phase_lengths

    f = tmp_path / "logsteps.jsonl"
    recs = [{"v": 1, "kind": "step", "t": 100.0 + i, "step": i, "rank": 0, "dt": dt, "flags": flags}
            for i, dt, flags in [(1, 0.1, ["first"]), (2, 0.1, []), (3, 250.0, ["save"]), (4, 0.1, []), (7, 95.0, ["first"]),
                                 (5, 120.0, ["eval", "save"]), (6, 90.0, ["eval"])]]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    fold = EventsFold()
    fold.fold(EventReader(f))
    assert fold.phase_longest_s == {"save": 250.0, "eval": 120.0}
    ph = LogPhases()  # the control: nothing learned from the log read at once
    assert ph.budget_s(SAVING) == PHASE_FLOOR_S
    learn_phase_lengths(ph, fold.phase_longest_s)
    assert ph.longest_s == {SAVING: 250.0, EVALUATING: 120.0}
    assert ph.budget_s(SAVING) == 750.0 and ph.budget_s(EVALUATING) == 360.0


def test_a_phase_is_stuck_only_past_its_budget_and_never_at_the_step_budget():
    summary = {"n": 50, "p99": 0.2}
    assert stall_state(0.0, 30.0, summary).state == STALLED  # the control: 30 s with no phase is a stall
    within = stall_state(0.0, 30.0, summary, SAVING, phase_budget_s=300.0)
    assert within.state == OK and "within its budget 300 s" in within.reason
    past = stall_state(0.0, 301.0, summary, SAVING, phase_budget_s=300.0)
    assert past.state == STALLED and past.threshold_s == 300.0 and "saving for 301.0 s > its budget 300 s" in past.reason
    assert stall_state(0.0, 3000.0, summary, "save").state == OK  # the emitter's phase: no budget, as before


def test_the_phase_part_prefers_the_emitters_phase_and_says_ended():
    ph = LogPhases()
    ph.stepped(100.0, False)
    assert phase_part(None, ph, False, 130.0) == {"name": TRAINING, "for_s": 30.0, "source": "log",
                                                  "budget_s": None, "longest_s": {}}
    assert phase_part("save", ph, False, 130.0)["name"] == SAVING
    assert phase_part("save", ph, True, 130.0)["name"] == ENDED
    assert phase_part(None, LogPhases(), False, 1.0)["source"] is None  # nothing read: no source claimed


def test_the_phase_is_exported_one_series_per_word_and_said_in_one_line():
    from prometheus_client import CollectorRegistry, generate_latest

    from stepwatch.monitors.export.prometheus import registry_for
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.tui.format import phase_words

    snap = null_snapshot()
    snap["run"], snap["phase"] = "r", {"name": SAVING, "for_s": 12.0, "source": "log", "budget_s": 300.0,
                                       "longest_s": {SAVING: 20.0}}
    text = generate_latest(registry_for(lambda: snap)).decode()
    assert 'stepwatch_phase{attempt="",phase="saving",run="r"} 1.0' in text or 'phase="saving"' in text
    got = {ln.split("phase=\"")[1].split("\"")[0]: ln.rsplit(" ", 1)[1] for ln in text.splitlines()
           if ln.startswith("stepwatch_phase{")}
    assert got == {"starting": "0.0", "training": "0.0", "evaluating": "0.0", "saving": "1.0", "finishing": "0.0",
                   "ended": "0.0"}, got
    assert "stepwatch_phase_budget_seconds" in text and isinstance(CollectorRegistry, type)
    assert phase_words(snap["phase"]) == "saving for 12 s (budget 300 s)"
    assert phase_words({**snap["phase"], "name": TRAINING, "for_s": 3723.0, "budget_s": None}) == "training for 1:02:03"
    assert phase_words(None) is None


def test_each_liveness_signal_is_exported_and_said_and_an_unknown_one_never_as_0():
    from prometheus_client import generate_latest

    from stepwatch.monitors.export.prometheus import registry_for
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.tui.format import liveness_words

    snap = null_snapshot()
    snap["run"] = "r"
    text = generate_latest(registry_for(lambda: snap)).decode()
    assert "stepwatch_liveness_seconds{" not in text  # the control: nothing known, no sample
    assert liveness_words(snap["liveness"]) is None
    snap["liveness"]["signals_s"] = {"cpu": 41.0, "output": 39.5, "step": None}
    text = generate_latest(registry_for(lambda: snap)).decode()
    got = {ln.split('signal="')[1].split('"')[0]: ln.rsplit(" ", 1)[1] for ln in text.splitlines()
           if ln.startswith("stepwatch_liveness_seconds{")}
    assert got == {"cpu": "41.0", "output": "39.5"}, got
    assert liveness_words(snap["liveness"]) == "CPU moved 41 s ago, output 40 s ago"


# --- busy but silent: a step past its budget whose processes compute is shown, not paged ---------------
def test_a_silent_step_whose_processes_compute_is_suspected_until_the_busy_budget():
    from stepwatch.monitors.detectors.stall import BUSY_FLOOR_S
    from stepwatch.monitors.snapshot.stepsource import busy_budget_s, busy_but_silent

    assert busy_budget_s(0.0) == BUSY_FLOOR_S == 60.0 and busy_budget_s(50.0) == 150.0  # 3x the longest save
    assert busy_but_silent(30.0, 0.01, 60.0) == {}  # the control: an idle tree stays stalled (stuck)
    sus = busy_but_silent(30.0, 1.0, 60.0)
    assert sus["state"] == "suspected" and "busy but silent: no step for 30.0 s" in sus["reason"]
    late = busy_but_silent(61.0, 1.0, 60.0)
    assert late["state"] == STALLED and late["threshold_s"] == 60.0 and "busy but silent for 61.0 s" in late["reason"]


def test_a_save_announced_in_the_poll_of_the_step_before_it_flags_the_step_after_it():
    """``step 40`` and ``saving checkpoint …`` arrive in one read (printed back to back): the save's interval
    is step 41's, never step 40's (seen live)."""
    from stepwatch.monitors.readers.textlog import Segment

    timer = LogStepTimer(LogTracker())
    got = []
    for i, texts in enumerate([["step 38 loss 1.0"], ["step 39 loss 1.0"], ["step 40 loss 1.0", "saving checkpoint to x"],
                               ["step 41 loss 1.0"], ["step 42 loss 1.0"]]):
        got += timer.feed_poll([Segment(t, "\n", at_s=100.0 + i, poll_seq=i + 1) for t in texts], None)
    assert [(r["step"], r["flags"]) for r in got if r["step"] >= 40] == [(40, []), (41, ["save"]), (42, [])]


def test_an_evaluation_and_a_save_read_in_one_poll_with_two_timed_steps_flag_only_the_first():
    """nanoGPT prints its evaluation, ``saving checkpoint`` and then ``iter 500`` and ``iter 501`` back to back
    under load: each step carries its own time, so only iter 500's interval held them (seen live)."""
    from stepwatch.monitors.readers.textlog import Segment

    timer = LogStepTimer(LogTracker())
    got = []
    polls = [["iter 498: loss 2.0, time 15.00ms, mfu 1.00%"], ["iter 499: loss 2.0, time 15.00ms, mfu 1.00%"],
             ["step 500: train loss 2.1, val loss 2.3", "saving checkpoint to out",
              "iter 500: loss 2.0, time 3015.00ms, mfu 1.00%", "iter 501: loss 2.0, time 15.00ms, mfu 1.00%"],
             ["iter 502: loss 2.0, time 15.00ms, mfu 1.00%"]]
    for i, texts in enumerate(polls):
        got += timer.feed_poll([Segment(t, "\n", at_s=100.0 + i, poll_seq=i + 1) for t in texts], None)
    assert [(r["step"], sorted(r["flags"])) for r in got if r["step"] >= 499] == [
        (499, []), (500, ["eval", "save"]), (501, []), (502, [])]


# --- [stall]: the budgets' floors, per run ------------------------------------------------------------
def test_the_stall_table_sets_each_floor_and_a_bad_value_is_refused_naming_it(tmp_path):
    from stepwatch.launcher.config import ConfigError, load_config
    from stepwatch.monitors.detectors.stall import StallSettings, stall_settings_of
    from stepwatch.monitors.snapshot.stepsource import busy_budget_s

    got = stall_settings_of({"config": {"stall": {"step_floor_s": 30, "busy_floor_s": 900, "phase_floor_s": 1800.0}}})
    assert (got.step_floor_s, got.busy_floor_s, got.phase_floor_s) == (30.0, 900.0, 1800.0)
    assert got.step_floor_source() == "run config" and StallSettings().step_floor_source() == "default"
    assert stall_settings_of({}) == StallSettings() == stall_settings_of({"config": {"stall": {"busy_floor_s": -1}}})
    summary = {"n": 50, "p99": 0.2}
    assert stall_state(0.0, 10.0, summary).state == STALLED  # the control: the default floor (3 s)
    assert stall_state(0.0, 10.0, summary, floor_s=got.step_floor_s).state == OK
    assert busy_budget_s(100.0, got.busy_floor_s) == 900.0 and busy_budget_s(400.0, got.busy_floor_s) == 1200.0
    ph = LogPhases()
    ph.floor_s = got.phase_floor_s
    ph.stepped(1.0, False)
    ph.saw(SAVING, 2.0)
    assert ph.budget_s() == 1800.0
    cfg = tmp_path / "run.toml"
    for table, words in (("[stall]\nbusy_floor_s = 0\n", "busy_floor_s must be a number of seconds from 1"),
                         ("[stall]\nstep_floor = 30\n", "unknown key 'step_floor'"),
                         ("stall = 5\n", "[stall] must be a table")):
        cfg.write_text('name = "x"\ncommand = ["true"]\n' + table)
        with pytest.raises(ConfigError) as e:
            load_config(cfg)
        assert words in str(e.value), (table, str(e.value))


def test_an_idle_stall_is_dated_at_the_step_budget_and_a_busy_one_at_the_busy_budget():
    """The stall alert's ``at`` is when the condition began: the step's start plus the step budget for an idle
    silence (it was dated at the busy budget, 60 s late, whatever the CPU said), plus the busy budget for a busy one."""
    from stepwatch.monitors.snapshot.stepsource import StepSource, stall_part
    from stepwatch.monitors.stats.stepstats import StepStats

    stats = StepStats()
    for i in range(1, 31):
        stats.add(i, 0.1, [])
    src = StepSource(None, stats, "per_update", False)
    idle, idle_at = stall_part(src, 1000.0, 1070.0, None, False, 70.0, busy=(0.0, 60.0))
    assert idle["state"] == STALLED and idle_at == pytest.approx(1003.0), (idle, idle_at)  # the 3 s floor
    busy, busy_at = stall_part(src, 1000.0, 1070.0, None, False, 70.0, busy=(1.0, 60.0))
    assert busy["state"] == STALLED and busy_at == 1060.0, (busy, busy_at)



def test_a_phase_the_stacks_showed_holds_for_its_step_and_ends_when_the_run_steps_on():
    from stepwatch.monitors.parsers.phases import LogPhases
    from stepwatch.monitors.snapshot.phase import follow_stacks

    ph = LogPhases()
    ph.stepped(100.0, False)  # training
    ph.stacks_saw = ("saving", 7)  # the stacks of the step after step 7
    follow_stacks(ph, 8, 103.0)  # the run already stepped past it: nothing to say of the step in progress
    assert (ph.name, ph.source) == ("training", "log")
    ph.stacks_saw = ("saving", 8)
    follow_stacks(ph, 8, 103.0)
    assert (ph.name, ph.source, ph.since_s, ph.budget_s()) == ("saving", "stacks", 103.0, ph.floor_s)
    follow_stacks(ph, 8, 103.0)  # the next look, the same step: the save goes on
    assert ph.name == "saving"
    follow_stacks(ph, 9, 108.5)  # the run stepped on: the save lasted 5.5 s
    assert (ph.name, ph.source, ph.longest_s["saving"]) == ("training", "log", 5.5)


def test_a_runs_own_eval_and_save_lines_say_its_phase_before_the_known_programs_words():
    """``[log] eval_lines`` / ``save_lines`` (issue 44): a plain loop's own words for an evaluation or a save. Without
    them its ``running eval...`` is no phase (the control); with them the line starts one, and a save word wins."""
    from stepwatch.monitors.parsers.logtracker import log_settings

    def phase_after(settings: LogSettings, line: str) -> str:
        t = LogTracker([], settings)
        for i in range(1, 6):
            t.feed_text(f"step {i}/100 loss 0.5", at_s=float(i))
        t.feed_text(line, at_s=6.0)
        return t.phases.name

    own = log_settings({"eval_lines": ["running eval"], "save_lines": [r"^ckpt -> \S+"]})
    assert phase_after(LogSettings(), "running eval...") == TRAINING  # the control: no word of a known program
    assert phase_after(own, "running eval...") == EVALUATING
    assert phase_after(own, "ckpt -> out/step5.pt") == SAVING
    assert phase_after(own, "Saving model checkpoint to out/checkpoint-5") == SAVING  # the known words still count


@pytest.mark.parametrize("table, words", [
    ({"eval_lines": "running eval"}, "eval_lines must be a list of regular expressions"),
    ({"save_lines": ["(unclosed"]}, "save_lines pattern 1 '(unclosed' is not a regular expression"),
    ({"eval_lines": ["(a+)+\\1"]}, "eval_lines pattern 1 "),  # a backreference: RE2 refuses it (linear time)
])
def test_eval_and_save_lines_are_refused_at_load_naming_the_bad_one(table, words):
    from stepwatch.monitors.parsers.logtracker import log_settings

    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("+", r"\+")):
        log_settings(table)
