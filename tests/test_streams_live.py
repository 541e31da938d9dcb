"""Two processes each drawing a 300-step bar, unprefixed, into one train.log (a script whose bar is not
gated by rank, launched twice): the supervisor counts one of them for the run, never their merge, and says
that two interleave. System tier: the real capture script (tools/capture_fixtures/tqdm_two_procs.py) under
a real supervisor, compared with each process's own clock."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from test_tmux import TmuxPane
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.stats.nearest_rank import nearest_rank

CAPTURE = Path(__file__).resolve().parents[1] / "tools" / "capture_fixtures"
SLEEPS_S = (0.04, 0.07)  # the two processes' steps: far enough apart that a p50 says which bar it timed


def own_p50(clock: Path) -> float:
    """The nearest-rank median of a process's own step times (its first step left out)."""
    t = [float(x) for x in clock.read_text().split()]
    return nearest_rank(sorted(b - a for a, b in zip(t[1:], t[2:])), 50)


@pytest.mark.slow
def test_two_processes_bars_in_one_log_count_one_process_and_say_two_interleave(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"tqdm_two_procs.py": (CAPTURE / "tqdm_two_procs.py").read_text(),
                                         "tqdm_loop.py": (CAPTURE / "tqdm_loop.py").read_text()})
    clock = tmp_path / "clock"
    r = stepwatch("launch", "--no-tui", "--name", "two", "--", sys.executable, "tqdm_two_procs.py", "--steps", "300",
                  "--sleeps", *map(str, SLEEPS_S), "--clock", str(clock), cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "two"
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 90, interval_s=0.5, what="both processes to end")
    assert ex["returncode"] == 0, ex
    def ended_snapshot() -> dict | None:
        s = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
        return s if s["supervisor_alive"] is False else None

    snap = wait_until(ended_snapshot, 60, what="the supervisor's last record")
    records = [json.loads(ln) for ln in (run_dir / "logsteps.jsonl").read_text().splitlines()]
    counted = [r["step"] for r in records]
    assert len(counted) <= 300 and len(counted) == len(set(counted)), len(counted)  # 336 before: both bars fed one
    assert snap["log"]["streams"] == 2 and snap["step"]["global_step"] == 300, (snap["log"], snap["step"])
    p50 = snap["step_seconds"]["p50"]
    own = [own_p50(Path(f"{clock}_proc{i}.txt")) for i in range(2)]
    assert any(p50 == pytest.approx(o, rel=0.05) for o in own), (p50, own)  # one process's own, not a blend
    text = stepwatch("status", str(run_dir)).stdout
    assert "2 processes' bars interleave in the log: the step follows the first" in text, text
    pane = TmuxPane(tmp_path, run_dir, 80, 24)  # the operator's 80x24 screen says so too, whole
    try:
        note = "NOTE: 2 processes' bars interleave in the log: the step follows the first"
        screen = pane.wait_for(lambda s: "step 300/300" in s and note in s, 30, "the 80x24 screen")
    finally:
        pane.close()
    assert all(len(ln) <= 80 for ln in screen.splitlines()), screen
