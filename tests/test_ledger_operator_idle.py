"""The operator's own idle time before a hand relaunch is not the restart policy's gap (issue 44, point 5): the time
between an attempt's end and the next one's launch is ``restart_gap`` when the system started it (the policy, a Slurm
requeue: run.json ``resumed_from.by``) and ``operator_idle`` when the operator did (``stepwatch relaunch``: no
``resumed_from``, or ``by`` ``operator``); shown and exported like every account, and left out of goodput."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stepwatch.monitors.export.prometheus import text_of
from stepwatch.monitors.snapshot.ledger import ledger_part, past_attempts, run_ledger, started_by
from stepwatch.monitors.snapshot.model import null_snapshot
from stepwatch.monitors.states import LEDGER_PHASES, OPERATOR_IDLE, RESTART_GAP, STARTING, TRAINING
from stepwatch.tui.format import ledger_words
from stepwatch.tui.plain import status_lines

T0 = 1_800_000_000.0


def _attempt(no: int, launched: float, ended: float | None, training: float, by: str | None) -> Any:
    ph = dict.fromkeys(LEDGER_PHASES, 0.0)
    ph[STARTING], ph[TRAINING] = ((ended or launched) - launched - training), training
    return {"attempt": no, "launched_at_unix": launched, "ended_at_unix": ended,
            "wall_s": (ended or launched) - launched, "phases_s": ph, "last_step": 50, "step_p50_s": 0.5,
            "resumed_from_step": None, "after_attempt": None, "started_by": by, "lost_steps": None, "source": "record"}


def test_the_gap_before_a_hand_relaunch_is_the_operators_idle_time_not_a_restart_gap():
    # attempt 1 ends at +100; the operator relaunches it by hand an hour later
    led: Any = run_ledger([_attempt(1, T0, T0 + 100.0, 80.0, "operator"),
                           _attempt(2, T0 + 3700.0, T0 + 3800.0, 80.0, "operator")], T0 + 3800.0)
    assert led["phases_s"][OPERATOR_IDLE] == pytest.approx(3600.0) and led["phases_s"][RESTART_GAP] == 0.0
    assert sum(led["phases_s"].values()) == pytest.approx(led["wall_s"]) and led["wall_s"] == pytest.approx(3800.0)
    assert led["goodput"] == pytest.approx(160.0 / 200.0)  # the operator's hour is no cost of the run's


def test_the_policys_and_slurms_own_gap_stays_a_restart_gap_and_counts_in_goodput():
    for by in ("restart policy", "slurm requeue", None):  # None: an older record that does not say (as before)
        led: Any = run_ledger([_attempt(1, T0, T0 + 100.0, 80.0, "operator"),
                               _attempt(2, T0 + 130.0, T0 + 230.0, 80.0, by)], T0 + 230.0)
        assert led["phases_s"][RESTART_GAP] == pytest.approx(30.0) and led["phases_s"][OPERATOR_IDLE] == 0.0, by
        assert led["goodput"] == pytest.approx(160.0 / 230.0, abs=1e-4)


def test_who_started_an_attempt_is_read_from_run_json():
    assert started_by({}) == "operator"  # a launch or plain relaunch by hand records no resumed_from
    assert started_by({"resumed_from": None}) == "operator"
    assert started_by({"resumed_from": {"by": "operator", "checkpoint": "out/ckpt_200"}}) == "operator"
    assert started_by({"resumed_from": {"by": "restart policy"}}) == "restart policy"
    assert started_by({"resumed_from": {"step": 40}}) is None  # says nothing: not guessed
    assert started_by({"resumed_from": {"by": 3}}) is None


def _record(run_dir: Path, name: str, **over: Any) -> None:
    doc = {**_attempt(1, T0, T0 + 100.0, 80.0, "operator"), "v": 1, **over}
    (run_dir / name).write_text(json.dumps(doc))


def test_an_earlier_attempts_record_without_the_new_account_is_still_read(tmp_path: Path):
    old = dict.fromkeys(k for k in LEDGER_PHASES if k != OPERATOR_IDLE)
    _record(tmp_path, "ledger.20261204T000000Z.json", phases_s={**dict.fromkeys(old, 0.0), TRAINING: 80.0,
                                                                 STARTING: 20.0})
    got = past_attempts(tmp_path, os.getuid())
    assert len(got) == 1 and got[0]["phases_s"] is not None and got[0]["phases_s"][OPERATOR_IDLE] == 0.0
    assert got[0]["started_by"] == "operator"


def _snapshot_after_a_hand_relaunch(tmp_path: Path) -> Any:
    _record(tmp_path, "ledger.20261204T000000Z.json")
    snap: Any = null_snapshot()
    snap.update({"run": "r", "attempt": 2, "launched_at_unix": T0 + 700.0, "state": "running",
                 "phase": {"name": "training", "for_s": None, "source": None, "budget_s": None, "longest_s": {}}})
    snap["ledger"] = ledger_part(tmp_path, {"attempt": 2}, snap, None, None, T0 + 750.0)  # run.json: no resumed_from
    return snap


def test_status_and_prometheus_show_the_operators_idle_time_as_its_own_account(tmp_path: Path):
    snap = _snapshot_after_a_hand_relaunch(tmp_path)
    led = snap["ledger"]
    assert led["attempts"][-1]["started_by"] == "operator"
    assert led["phases_s"][OPERATOR_IDLE] == pytest.approx(600.0) and led["phases_s"][RESTART_GAP] == 0.0
    words = ledger_words(led)
    assert words is not None and "operator idle 0:10:00" in words and "restart gap" not in words, words
    assert any("operator idle 0:10:00" in ln for ln in status_lines(snap))
    text = text_of(snap).decode()  # type: ignore[arg-type]
    assert 'stepwatch_time_seconds_total{attempt="2",phase="operator_idle",run="r"} 600.0' in text, text
    assert 'stepwatch_time_seconds_total{attempt="2",phase="restart_gap",run="r"} 0.0' in text
