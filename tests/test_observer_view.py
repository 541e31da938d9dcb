"""RunObserver.view_update: what a screen gets from the one reader of a run dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from stepwatch.monitors.snapshot.observer import VIEW_LOG_LINES, RunObserver

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"


def copy_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "ended-sigkill"
    shutil.copytree(STATIC_RUN, run_dir)
    return run_dir


def complete_lines(run_dir: Path) -> list[str]:
    """train.log's complete lines as the panel shows them: the text after each line's last \\r."""
    data = (run_dir / "train.log").read_text(errors="replace")
    return [ln.split("\r")[-1] for ln in data.split("\n")[:-1]]


def test_each_log_line_comes_once_in_order(tmp_path: Path):
    run_dir = copy_run(tmp_path)
    obs = RunObserver(run_dir)
    first = obs.view_update()
    assert first.log_lines == complete_lines(run_dir) and first.log_lines
    assert not first.log_reset and not first.attempt_changed
    assert obs.view_update().log_lines == []  # nothing new: nothing again
    with open(run_dir / "train.log", "a") as f:
        f.write("one more\nand a half")
    u = obs.view_update()
    assert u.log_lines == ["one more"] and u.log_partial == "and a half"


def test_more_lines_than_one_update_carries_start_the_panel_over(tmp_path: Path):
    run_dir = copy_run(tmp_path)
    obs = RunObserver(run_dir)
    obs.view_update()
    with open(run_dir / "train.log", "a") as f:
        f.write("".join(f"line {i}\n" for i in range(VIEW_LOG_LINES + 500)))
    u = obs.view_update()
    assert u.log_reset and len(u.log_lines) == VIEW_LOG_LINES
    assert u.log_lines[-1] == f"line {VIEW_LOG_LINES + 499}" and u.log_lines[0] == "line 500"
    assert not obs.view_update().log_reset  # said once


def test_a_new_attempt_is_said_once_and_starts_the_panel_over(tmp_path: Path):
    run_dir = copy_run(tmp_path)
    obs = RunObserver(run_dir)
    obs.view_update()
    run = json.loads((run_dir / "run.json").read_text())
    run["attempt"] = (run.get("attempt") or 1) + 1
    (run_dir / "run.json").write_text(json.dumps(run))
    (run_dir / "train.log").write_text("attempt two\n")
    u = obs.view_update()
    assert u.attempt_changed and u.log_reset and u.log_lines == ["attempt two"]
    assert u.snapshot["attempt"] == run["attempt"]
    again = obs.view_update()
    assert not again.attempt_changed and not again.log_reset


@pytest.mark.system
def test_without_the_supervisors_record_log_times_are_labelled_approximate(tmp_path: Path):
    """A run from an older stepwatch (no logsteps.jsonl): the view times the bar itself, between
    its own refreshes, and says the figures are approximate and the fallback not judged."""
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = tmp_path / "old"
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps({
            "v": 1, "name": "old", "attempt": 1, "launched_at_unix": time.time(),
            "process": {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "pgid": proc.pid},
            "supervisor": {"pid": None, "create_time": None}}))
        log = run_dir / "train.log"
        log.write_text("")
        obs = RunObserver(run_dir)
        for i in range(11):
            with open(log, "a") as f:
                f.write(f"\r {i * 10:3d}%|#         | {i}/10 [00:0{i}<00:01,  1.00it/s]")
            snap = obs.refresh()
            time.sleep(0.05)  # the view's refreshes are what times the steps here
        assert snap["step"]["timing"] == "approximate" and snap["step_seconds"]["n"] > 0, snap["step"]
        assert snap["fallback"]["state"] == "not judged" and "approximate" in snap["fallback"]["reason"]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("stall_table", "floor_s", "source"), [({}, 3.0, "default"),
                                                                 ({"step_floor_s": 30}, 30.0, "run config")])
def test_the_stall_part_says_its_budget_and_where_its_floor_came_from(tmp_path: Path, stall_table: dict, floor_s: float,
                                                                      source: str):
    """``[stall] step_floor_s`` the user set is in ``status --json``: the floor in use, its source, and the budget the
    step in progress is judged against (max(10 x p99, floor)); an ended run still says its floor."""
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = tmp_path / "live"
        run_dir.mkdir()
        now = time.time()
        run = {"v": 1, "name": "live", "attempt": 1, "launched_at_unix": now - 30, "config": {"stall": stall_table},
               "process": {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "pgid": proc.pid},
               "supervisor": {"pid": None, "create_time": None}}
        (run_dir / "run.json").write_text(json.dumps(run))
        t0 = now - 21 * 0.5
        steps = [{"v": 1, "kind": "step", "t": t0 + 0.5 * s, "step": s, "rank": 0, "dt": 0.5, "step_begin": t0 + 0.5 * (s - 1),
                  "step_end": t0 + 0.5 * s, "tokens": None, "padded_tokens": None, "flags": ["first"] if s == 1 else []}
                 for s in range(1, 21)]
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in steps))
        snap = RunObserver(run_dir).refresh()
        st = snap["stall"]
        assert snap["state"] == "running" and st["state"] == "ok", (snap["state"], st)
        assert (st["floor_s"], st["floor_source"]) == (floor_s, source)
        assert st["threshold_s"] == pytest.approx(max(10 * 0.5, floor_s))
    finally:
        proc.kill()
        proc.wait()
    (run_dir / "exit.json").write_text(json.dumps({"v": 1, "returncode": 0, "signal": None, "ended_at": "x",
                                                   "ended_at_unix": time.time(), "duration_s": 30.0,
                                                   "stop_requested": False, "error": None}))
    ended = RunObserver(run_dir).refresh()["stall"]
    assert ended["state"] == "not judged" and ended["threshold_s"] is None
    assert (ended["floor_s"], ended["floor_source"]) == (floor_s, source)
