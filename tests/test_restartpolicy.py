"""The restart policy's decision (launcher/restartpolicy.py), pure: causes a restart cannot help, the budget, a
crash loop and "same cause, no progress" STOP; anything else RESTARTs from the newest complete checkpoint, with
the steps it loses; the resume argument each trainer takes; the [restart] table's refusals."""

from __future__ import annotations

import pytest

from stepwatch.launcher.restartpolicy import (RESTART, STOP, AttemptEnd, RestartSettings, decide, restart_settings,
                                              resume_argv)

T0 = 1_780_000_000.0
ON = RestartSettings(mode="enforce", max_restarts=3, storm_attempts=3, storm_window_s=600)


def end(attempt: int, cause: str = "killed_by_signal", step: int | None = 57, cp: int | None = 40,
        at: float = T0) -> AttemptEnd:
    return AttemptEnd(attempt, cause, f"{cause} at step {step}", step, f"out/checkpoint-{cp}" if cp else None, cp, at)


def test_a_death_after_progress_restarts_from_the_newest_complete_checkpoint_and_counts_the_lost_steps():
    d = decide([], end(1), ON)
    assert (d.verdict, d.checkpoint, d.checkpoint_step, d.lost_steps) == (RESTART, "out/checkpoint-40", 40, 17)
    assert d.reason == "killed_by_signal: restart 1 of 3, from out/checkpoint-40"
    scratch = decide([], end(1, cp=None, step=12), ON)
    assert (scratch.verdict, scratch.checkpoint, scratch.lost_steps) == (RESTART, None, 12)
    assert scratch.reason.endswith("from scratch (no complete checkpoint)")


@pytest.mark.parametrize("cause, words", [("completed", "the run completed"), ("operator_stop", "stopped by the operator"),
                                          ("config_error", "configuration or code error")])
def test_a_cause_a_restart_cannot_help_stops_at_once(cause: str, words: str):
    d = decide([], end(1, cause), ON)
    assert (d.verdict, d.reason, d.checkpoint) == (STOP, words, None)


def test_the_same_cause_without_a_newer_step_or_checkpoint_stops_and_progress_restarts_again():
    first = end(1, "exception", step=10, cp=None, at=T0)
    again = decide([first], end(2, "exception", step=10, cp=None, at=T0 + 700), ON)
    assert again.verdict == STOP and again.reason.startswith("same cause, no progress: exception again at step 10")
    further = decide([first], end(2, "exception", step=30, cp=20, at=T0 + 700), ON)
    assert further.verdict == RESTART  # the control: it got further
    other = decide([first], end(2, "killed_by_signal", step=10, cp=None, at=T0 + 700), ON)
    assert other.verdict == RESTART  # the control: another cause


def test_the_budget_names_itself_and_a_crash_loop_stops():
    ends = [end(n, step=57 + 20 * n, cp=40 + 20 * n, at=T0 + 1000 * n) for n in (1, 2, 3)]
    assert [decide(ends[:i], ends[i], ON).verdict for i in range(2)] == [RESTART, RESTART]
    spent = decide(ends[:3], end(4, step=200, cp=180, at=T0 + 4000), ON)
    assert spent.verdict == STOP and spent.reason == "the restart budget is spent: 3 restart(s) of max_restarts 3"
    loop = [end(n, step=57 + 20 * n, cp=40 + 20 * n, at=T0 + 60 * n) for n in (1, 2)]
    storm = decide(loop, end(3, step=150, cp=140, at=T0 + 180), ON)
    assert storm.verdict == STOP and storm.reason.startswith("a crash loop: 3 ends within 600 s")


def test_the_resume_argument_of_each_trainer_replaces_an_earlier_one():
    argv = ["python", "run_clm.py", "--output_dir", "out", "--resume_from_checkpoint", "out/checkpoint-20"]
    assert resume_argv(argv, "hf", "out/checkpoint-40", 40) == [
        "python", "run_clm.py", "--output_dir", "out", "--resume_from_checkpoint", "out/checkpoint-40"]
    assert resume_argv(["python", "t.py", "--ckpt_path=a.ckpt"], "lightning", "b.ckpt", 9) == [
        "python", "t.py", "--ckpt_path", "b.ckpt"]
    assert resume_argv(["python", "t.py"], ("--init", "{checkpoint}", "--start", "{step}"), "c/7", 7) == [
        "python", "t.py", "--init", "c/7", "--start", "7"]
    assert resume_argv(["python", "t.py"], "hf", None, None) == ["python", "t.py"]  # no checkpoint: from scratch


def test_the_restart_table_and_its_refusals():
    s = restart_settings({"mode": "observe", "max_restarts": 2, "backoff_s": 5, "resume": ["--from", "{checkpoint}"],
                          "checkpoints": "ckpt_*", "complete_marker": "DONE"})
    assert (s.mode, s.max_restarts, s.backoff_s, s.resume, s.checkpoints) == ("observe", 2, 5.0, ("--from", "{checkpoint}"), "ckpt_*")
    assert restart_settings({}).mode == "off"  # a run config without [restart] never restarts anything
    for bad, words in (({"mode": "on"}, "mode must be"), ({"max_restarts": -1}, "max_restarts must be"),
                       ({"resume": ["--x"]}, "resume must be"), ({"checkpoints": "/abs/*"}, "checkpoints must be"),
                       ({"checkpoints": "../up/*"}, "checkpoints must be"), ({"backoff_s": "5"}, "backoff_s must be")):
        with pytest.raises(ValueError, match=words):
            restart_settings(bad)


def test_the_budget_counts_the_policys_own_restarts_and_no_progress_compares_with_the_attempt_before():
    # restart.json removed or replaced by another user: the supervisor's own count of restarts still holds
    assert decide([], end(4, step=200, cp=180), ON, restarts=3).reason == "the restart budget is spent: 3 restart(s) " \
                                                                          "of max_restarts 3"
    assert decide([], end(1), ON, restarts=0).reason.startswith("killed_by_signal: restart 1 of 3")
    # a manual relaunch between them: attempt 1's end is not the attempt before attempt 3
    old = end(1, "exception", step=10, cp=None, at=T0)
    assert decide([old], end(3, "exception", step=10, cp=None, at=T0 + 5000), ON, restarts=0).verdict == RESTART
    assert decide([], end(1, step=30, cp=40), ON).lost_steps == 0  # the bar behind the save: never negative


def test_a_decision_that_could_not_be_recorded_never_restarts(tmp_path):
    import threading

    from stepwatch.launcher.restartrun import enforce, log_tail

    record = {"recorded": False, "decision": {"mode": "enforce", "verdict": RESTART, "backoff_s": 0}}
    got = enforce(tmp_path, {"config": {}}, record, threading.Event(), lambda m: None)
    assert got is not None and got["decision"]["not_started"].startswith("restart.json could not be written")
    import os

    os.mkfifo(tmp_path / "train.log")  # a FIFO in the log's place: read as nothing, never waited on
    assert log_tail(tmp_path) == []


def test_a_restart_is_awaited_only_while_enforced_and_without_an_outcome():
    from stepwatch.monitors.states import RESTART_OUTCOMES, restart_awaited

    promised = {"mode": "enforce", "verdict": "RESTART", "attempt": 1}
    assert restart_awaited(promised)  # the positive control: a page said "restarting in N s"
    for outcome in RESTART_OUTCOMES:
        assert not restart_awaited({**promised, outcome: "x"}), outcome
    assert not restart_awaited({**promised, "mode": "observe"}) and not restart_awaited({**promised, "verdict": "STOP"})
    assert not restart_awaited(None) and not restart_awaited(["enforce", "RESTART"])
