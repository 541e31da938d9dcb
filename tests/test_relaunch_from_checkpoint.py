"""A relaunch by hand from the newest complete checkpoint: ``r`` on the run screen offers "from scratch" or "from
ckpt_N", and ``stepwatch relaunch RUN --from-checkpoint`` resumes from it ([restart] resume says how); a run with no
complete checkpoint, or no resume rule, is refused with the reason. System tier: real runs, the CLI, the app."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.tui.app import StepwatchApp

pytestmark = pytest.mark.system

DIES_AT_65_PY = r'''
import sys, time
from pathlib import Path
start = int(Path(sys.argv[2]).name.split("_")[1]) if len(sys.argv) > 2 else 0
print(f"resumed from step {start}" if start else "from scratch", flush=True)
for i in range(start + 1, 101):
    time.sleep(0.01)
    print(f"step {i}/100", flush=True)
    if i % 20 == 0:
        Path(f"ckpt_{i}").mkdir(exist_ok=True)
        if i < 60:  # ckpt_60 is never finished: no DONE marker
            (Path(f"ckpt_{i}") / "DONE").write_text("ok")
    if i == 65:
        sys.exit(1)
'''


def _ended_run(tmp_path: Path, resume: bool = True) -> tuple[Path, Path]:
    config = (f'name = "r"\ncommand = [{json.dumps(sys.executable)}, "dies.py"]\n'
              + ('[restart]\ncheckpoints = "ckpt_*"\ncomplete_marker = "DONE"\nresume = ["--resume", "{checkpoint}"]\n'
                 if resume else ""))
    repo = make_repo(tmp_path / "repo", {"dies.py": DIES_AT_65_PY, ".gitignore": "ckpt_*\n", "r.toml": config})
    assert stepwatch("launch", "--no-tui", "r.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "r"
    wait_until(lambda: read_json(run_dir / "exit.json"), 30, what="the first attempt's end")
    return repo, run_dir


def test_relaunch_from_checkpoint_resumes_from_the_newest_complete_one_and_records_it_as_the_operators(tmp_path: Path):
    repo, run_dir = _ended_run(tmp_path)
    r = stepwatch("relaunch", "--no-tui", "--from-checkpoint", "r", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert f"resuming from {repo / 'ckpt_40'} (step 40)" in r.stdout  # ckpt_60 was never finished
    run = read_json(run_dir / "run.json") or {}
    assert run["attempt"] == 2 and run["argv"][-2:] == ["--resume", str(repo / "ckpt_40")], run["argv"]
    assert run["resumed_from"] == {"by": "operator", "restarts": 0, "after_attempt": 1,
                                   "checkpoint": str(repo / "ckpt_40"), "step": 40, "unsafe_checkpoint": None}
    wait_until(lambda: b"resumed from step 40" in (run_dir / "train.log").read_bytes(), 20, what="the resumed attempt")


def test_relaunch_from_checkpoint_refuses_a_run_with_no_resume_rule_and_a_plain_relaunch_starts_from_scratch(
        tmp_path: Path):
    repo, run_dir = _ended_run(tmp_path, resume=False)
    r = stepwatch("relaunch", "--no-tui", "--from-checkpoint", "r", cwd=repo)
    assert r.returncode != 0 and "has no complete checkpoint to resume from, or its config has no [restart] resume" in (
        r.stdout + r.stderr)
    assert (read_json(run_dir / "run.json") or {})["attempt"] == 1  # nothing was started
    assert stepwatch("relaunch", "--no-tui", "r", cwd=repo).returncode == 0  # the control: from scratch
    assert (read_json(run_dir / "run.json") or {}).get("resumed_from") is None


async def test_r_offers_from_scratch_or_from_the_newest_complete_checkpoint(tmp_path: Path):
    repo, run_dir = _ended_run(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        async def until(cond, what: str, timeout_s: float = 20.0):
            await wait_async(pilot, cond, timeout_s, what)

        await until(lambda: app.run_screen is not None and app.run_screen.snap.get("state") == "exited",
                    "the ended run on screen")
        await pilot.press("r")
        await until(lambda: type(app.screen).__name__ == "Choose", "the choice")
        shown = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "from scratch" in shown and "from ckpt_40" in shown and "(step 40)" in shown, shown
        await pilot.press("c")
        await until(lambda: type(app.screen).__name__ == "PreflightScreen", "the checklist")
        await until(lambda: getattr(app.screen, "checklist", None) is not None, "the checklist to finish", 30)
        shown = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert f"from {repo / 'ckpt_40'} (step 40)" in shown and "--resume" in shown, shown
        await pilot.press("enter")
        await until(lambda: (read_json(run_dir / "run.json") or {}).get("attempt") == 2, "attempt 2")
    run = read_json(run_dir / "run.json") or {}
    assert run["argv"][-2:] == ["--resume", str(repo / "ckpt_40")] and run["resumed_from"]["by"] == "operator"


async def wait_async(pilot, cond, timeout_s: float, what: str) -> None:
    import time  # noqa: PLC0415

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await pilot.pause(0.05)


async def test_r_from_a_checkpoint_whose_path_the_group_may_write_says_why_and_starts_nothing(tmp_path: Path):
    """The run screen's "from checkpoint" judges the checkpoint's whole path when it is chosen
    (launcher/checkpointpath.py): a project dir the group may write is named in the screen's error, the app goes on,
    and no attempt starts; the control is the test above (the same choice in a private dir resumes)."""
    repo, run_dir = _ended_run(tmp_path)
    tmp_path.chmod(0o775)  # the owner opens the dir above the project to the group: it can rename repo/ away
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_async(pilot, lambda: app.run_screen is not None and app.run_screen.snap.get("state") == "exited",
                         20, "the ended run on screen")
        await pilot.press("r")
        await wait_async(pilot, lambda: type(app.screen).__name__ == "Choose", 20, "the choice")
        await pilot.press("c")
        await wait_async(pilot, lambda: any("REFUSING to resume from" in str(n.message) for n in app._notifications),
                         20, "the refusal on screen")
        said = " ".join(str(n.message) for n in app._notifications)
        assert f"{tmp_path} is writable by group" in said and "the group can rename repo/ away" in said, said
        assert type(app.screen).__name__ != "PreflightScreen"
    assert (read_json(run_dir / "run.json") or {}).get("attempt") == 1
