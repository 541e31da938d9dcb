"""The header, ``status`` and the restart line say what the restart policy is doing, in the tense of the attempt on
screen (issue 44, point 5): ``RESTARTING in N s (attempt 2 from ckpt_200)`` during the back-off (not ``UNKNOWN pid
-``), ``attempt 2: restarted by the policy after attempt 1 died (SIGKILL) · resumed from ckpt_200`` for the whole next
attempt, the decision itself once the policy said STOP. In-process: snapshots built from ``null_snapshot()``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from stepwatch.monitors.snapshot.alerts import headline_of
from stepwatch.monitors.snapshot.model import null_snapshot
from stepwatch.monitors.snapshot.restart import restart_part
from stepwatch.tui.format import restart_words, state_word
from stepwatch.tui.plain import status_lines
from stepwatch.tui.widgets.header import header_text

T = 1_700_000_000.0
CKPT = "/home/u/proj/out/ckpt_200"


def _words(snap: Any, now: float) -> str:
    words = restart_words(snap, now)
    assert words is not None
    return words


def _decision(**over: Any) -> Any:
    rs = {"verdict": "RESTART", "mode": "enforce", "cause": "killed_by_signal", "reason": "a crash: restart",
          "evidence": "killed by SIGKILL from outside at step 231", "checkpoint": CKPT, "checkpoint_step": 200,
          "attempt": 1, "lost_steps": 31, "words": f"restarting in 30 s from {CKPT}: a crash: killed by SIGKILL",
          "starts_at_unix": T + 30.0, "outcome": None, "outcome_words": "", "started_attempt": None}
    return {**rs, **over}


def _ended_attempt(**restart: Any) -> Any:
    """Attempt 1, killed by SIGKILL; its supervisor alive, in the policy's back-off."""
    snap: Any = null_snapshot()
    snap.update(run="r", attempt=1, state="exited", pid=812, signal="SIGKILL", returncode=None, supervisor_alive=True,
                launched_at_unix=T - 600.0, restart=_decision(**restart))
    snap["ended"] = {"ended_at": None, "ended_at_unix": T - 2.0, "duration_s": 598.0, "stop_requested": False,
                     "error": None, "write_errors": None, "log_lost_bytes": None, "log_lost_reason": None}
    return snap


def test_the_back_off_reads_restarting_in_n_seconds_counting_down_in_the_header_status_and_the_home_list():
    snap = _ended_attempt()
    assert state_word(snap, T) == "RESTARTING in 30 s (attempt 2 from ckpt_200)"
    assert state_word(snap, T + 17.4) == "RESTARTING in 13 s (attempt 2 from ckpt_200)"  # counting down
    assert state_word(snap, T + 31.0) == "RESTARTING now (attempt 2 from ckpt_200)"  # the back-off over, not started
    header = header_text(snap, T + 17.4).plain
    assert " RESTARTING in 13 s (attempt 2 from ckpt_200) " in header and "UNKNOWN" not in header, header
    snap["restart"]["checkpoint"] = None
    assert state_word(snap, T) == "RESTARTING in 30 s (attempt 2 from scratch)"


def test_status_first_line_says_the_headers_restarting_words():
    snap = _ended_attempt(starts_at_unix=time.time() + 3600.4)
    first = status_lines(snap)[0]
    assert first.startswith("r attempt 1: exited, pid 812 (") and first.endswith(
        " · RESTARTING in 3601 s (attempt 2 from ckpt_200)"), first
    assert state_word(snap) in first


def test_the_restart_line_during_the_back_off_says_what_happened_and_what_comes():
    snap = _ended_attempt()
    assert restart_words(snap, T + 18.0) == ("restarting: attempt 1 died (SIGKILL), attempt 2 starts in 12 s "
                                             "from ckpt_200")
    snap["restart"].update(cause="save_crash", evidence="killed by SIGKILL while a checkpoint was being written",
                           checkpoint=None)
    assert restart_words(snap, T + 18.0) == ("restarting: attempt 1 died (save crash, SIGKILL), attempt 2 starts in "
                                             "12 s from scratch")
    snap["restart"].update(starts_at_unix=time.time() + 3600.4)
    assert "  restarting: attempt 1 died (save crash, SIGKILL), attempt 2 starts in 3601 s from scratch" in status_lines(snap)


def test_the_launch_window_of_the_next_attempt_reads_restarting_now_not_unknown():
    """The new attempt's run.json is written, its process not yet recorded, the outcome not yet in restart.json."""
    snap = _ended_attempt()
    snap.update(attempt=2, state="unknown", pid=None, signal=None, ended=None, supervisor_alive=False)
    assert state_word(snap, T + 40.0) == "RESTARTING now (attempt 2 from ckpt_200)"
    assert restart_words(snap, T + 40.0) == ("restarting: attempt 1 died (SIGKILL), attempt 2 is being launched "
                                             "from ckpt_200")


def test_the_next_attempt_says_it_was_restarted_by_the_policy_for_its_whole_run():
    snap = _ended_attempt(outcome="started", started_attempt=2)
    snap.update(attempt=2, state="running", pid=901, signal=None, ended=None)
    assert state_word(snap, T + 500.0) == "RUNNING"
    want = "attempt 2: restarted by the policy after attempt 1 died (SIGKILL) · resumed from ckpt_200"
    assert restart_words(snap, T + 500.0) == want
    assert f"  {want}" in status_lines(snap)
    snap["restart"].update(checkpoint=None)
    assert _words(snap, T).endswith("died (SIGKILL) · started from scratch")
    snap["restart"].update(checkpoint=CKPT, outcome_words="the checkpoint was refused at exec: out is group-writable")
    assert _words(snap, T).endswith(" · started from scratch (the checkpoint was refused at exec: out is "
                                            "group-writable)")


def test_a_stop_and_an_observed_restart_keep_the_decisions_words_and_no_restarting_state():
    stop = _ended_attempt(verdict="STOP", cause="completed", evidence="exit code 0", checkpoint=None,
                          words="not restarting: the run completed", starts_at_unix=None)
    stop.update(attempt=2, signal=None, returncode=0)
    stop["restart"]["attempt"] = 2
    assert state_word(stop, T) == "EXITED 0"
    assert restart_words(stop, T) == ("RESTART POLICY (enforce, after attempt 2): STOP: not restarting: the run "
                                      "completed")
    assert "  restart (enforce, after attempt 2): STOP: not restarting: the run completed" in status_lines(stop)
    observed = _ended_attempt(mode="observe", starts_at_unix=None, words="would restart from out/ckpt_200 (observe "
                              "mode: nothing started): a crash: killed by SIGKILL")
    assert state_word(observed, T) == "KILLED SIGKILL"
    assert _words(observed, T).startswith("RESTART POLICY (observe, after attempt 1): RESTART: would restart")


def test_a_restart_that_did_not_start_or_whose_supervisor_is_gone_is_no_restarting_state():
    refused = _ended_attempt(outcome="not_started", outcome_words="LaunchRefused: the tree is dirty")
    assert state_word(refused, T) == "KILLED SIGKILL"
    assert _words(refused, T).endswith("; the restart did not start: LaunchRefused: the tree is dirty")
    orphaned = _ended_attempt()
    orphaned["supervisor_alive"] = False  # nothing is left to start it
    assert state_word(orphaned, T) == "KILLED SIGKILL"


def test_an_attempt_launched_by_hand_after_the_decision_does_not_claim_the_policy_started_it():
    snap = _ended_attempt(verdict="STOP", words="not restarting: a crash loop", starts_at_unix=None)
    snap.update(attempt=2, state="running", pid=950, signal=None, ended=None)
    assert restart_words(snap, T) == ("attempt 2: launched by hand after attempt 1 (the policy: STOP: not restarting: "
                                      "a crash loop)")


def test_a_pages_headline_during_the_back_off_is_the_screens_word():
    snap = _ended_attempt(starts_at_unix=time.time() + 3600.4)
    assert headline_of(snap, "h") == "h · r · RESTARTING in 3601 s (attempt 2 from ckpt_200) · step ?/?"


def test_restart_json_gives_when_the_next_attempt_is_due_and_what_the_restart_became(tmp_path: Path):
    dec = {"verdict": "RESTART", "mode": "enforce", "cause": "killed_by_signal", "reason": "r", "evidence": "e",
           "checkpoint": CKPT, "checkpoint_step": 200, "attempt": 1, "lost_steps": 31, "words": "w",
           "decided_at_unix": T, "backoff_s": 30}
    (tmp_path / "restart.json").write_text(json.dumps({"v": 1, "attempts": [], "decision": dec}))
    rs = restart_part(tmp_path)
    assert rs is not None and (rs["starts_at_unix"], rs["outcome"], rs["started_attempt"]) == (T + 30.0, None, None)
    dec["backoff_from_unix"] = T + 12  # the supervisor began the back-off after the decision's page went out
    (tmp_path / "restart.json").write_text(json.dumps({"v": 1, "attempts": [], "decision": dec}))
    rs = restart_part(tmp_path)
    assert rs is not None and rs["starts_at_unix"] == T + 42.0  # counted down from the back-off's real start
    dec.pop("backoff_from_unix")
    dec["started"] = {"attempt": 2, "pid": 9, "argv": [], "unsafe_checkpoint": None}
    (tmp_path / "restart.json").write_text(json.dumps({"v": 1, "attempts": [], "decision": dec}))
    rs = restart_part(tmp_path)
    assert rs is not None and (rs["outcome"], rs["started_attempt"], rs["outcome_words"]) == ("started", 2, "")
    dec.pop("started")
    dec.update(mode="observe", not_started="x", backoff_s=True)
    (tmp_path / "restart.json").write_text(json.dumps({"v": 1, "attempts": [], "decision": dec}))
    rs = restart_part(tmp_path)
    assert rs is not None and rs["starts_at_unix"] is None and (rs["outcome"], rs["outcome_words"]) == ("not_started", "x")
