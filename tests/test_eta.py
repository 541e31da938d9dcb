"""The ETA an operator plans by: the recent rate, the step in progress, STALLED when stuck.
A real run launched by stepwatch that slows 20x: the ETA follows within 10 steps."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.snapshot.eta import eta_part, rate_change
from stepwatch.monitors.snapshot.types import Eta, Stall

SLOWING_PY = r'''
import json, sys, time
t0 = time.perf_counter()
for step in range(1, 201):
    time.sleep(0.02 if step <= 40 else 0.4)   # 20x slower after step 40 (an eager fallback, a dying disk)
    t1 = time.perf_counter()
    print(json.dumps({"step": step, "max_steps": 200, "loss": 1.0, "dt_s": t1 - t0}), flush=True)
    t0 = t1
'''


def _status(run_dir: Path) -> dict:
    return json.loads(stepwatch("status", str(run_dir), "--json").stdout)


@pytest.mark.slow
def test_the_eta_follows_a_20x_slowdown_within_10_steps_and_says_stalled(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"slowing.py": SLOWING_PY})
    r = stepwatch("launch", "--no-tui", "--name", "slow", "--", sys.executable, "slowing.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "slow"
    fast = wait_until(lambda: 30 <= ((s := _status(run_dir))["step"]["global_step"] or 0) <= 40 and s, 30,
                      what="the fast steps")
    assert fast["eta"]["seconds_per_step"] == pytest.approx(0.02, rel=0.25), fast["eta"]
    snap = wait_until(lambda: ((s := _status(run_dir))["step"]["global_step"] or 0) >= 50 and s, 30,
                      what="10 slow steps")
    eta, gs = snap["eta"], snap["step"]["global_step"]
    assert eta["state"] == "ok" and eta["seconds_per_step"] == pytest.approx(0.4, rel=0.1), eta
    assert eta["remaining_steps"] == 200 - gs and eta["eta_s"] == pytest.approx((200 - gs) * 0.4, rel=0.1), eta
    assert abs(eta["end_at_unix"] - (time.time() + eta["eta_s"])) < 5.0  # wall clock: now + what is left
    text = stepwatch("status", str(run_dir)).stdout  # ~60 s left at 0.4 s a step, and when it ends
    assert re.search(r"ETA 0:0[01]:\d\d \(ends \d\d:\d\dZ\): \d+ steps at 0\.4\d\d s", text), text
    pid = read_json(run_dir / "run.json")["process"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        stalled = wait_until(lambda: (s := _status(run_dir))["eta"]["state"] == "stalled" and s, 30, what="the stall")
        assert stalled["stall"]["state"] == "stalled"
        assert "ETA STALLED" in stepwatch("status", str(run_dir)).stdout
    finally:
        os.kill(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGCONT)



# --- the rate's change point (unit tier: monitors/snapshot/eta.py) -----------------------------------

_NOT_STALLED: Stall = {"state": "ok", "reason": "", "current_step_elapsed_s": 0.0, "threshold_s": 3.0, "floor_s": 3.0,
                      "floor_source": "default"}


def _eta(dts: list[float], step: int) -> Eta:
    return eta_part(dts, 300, step, _NOT_STALLED, True, 1000.0)


def test_a_20x_slowdown_moves_the_eta_after_3_slow_steps_and_the_basis_says_so():
    fast = [0.02] * 59
    truth = (300 - 62) * 0.4
    assert _eta(fast + [0.4] * 2, 61)["seconds_per_step"] == pytest.approx(0.02)  # two: not yet a change
    eta = _eta(fast + [0.4] * 3, 62)
    assert eta["seconds_per_step"] == pytest.approx(0.4) and eta["eta_s"] == pytest.approx(truth, rel=0.10), eta
    assert "the rate changed 20x over the last 3 steps" in (eta["basis"] or ""), eta
    sped = _eta([0.4] * 20 + [0.02] * 3, 23)  # and back: a 20x speed-up too
    assert sped["seconds_per_step"] == pytest.approx(0.02)


def test_a_save_spike_or_a_mixed_run_is_no_change_of_rate():
    assert rate_change([0.02] * 20 + [5.0]) is None  # one save: the median of the window holds
    assert rate_change([0.02] * 20 + [5.0, 0.02, 0.4]) is None  # not all three the same way
    assert rate_change([0.02] * 3 + [0.4] * 3) is None  # too few steps before them to judge
    assert rate_change([0.02] * 8 + [0.05] * 3) == pytest.approx(2.5)  # the control: 2.5x is one
