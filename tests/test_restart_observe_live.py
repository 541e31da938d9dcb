"""The restart policy in observe mode, live (issue 34): a real run that saves a checkpoint every 20 steps and is
SIGKILLed at step 60 while its third checkpoint is being written: restart.json records the end (a crash in the
middle of a save) and "would restart from ckpt_40" (never ckpt_60, cut short), 20 steps lost; the decision is paged
and `status` shows it; nothing is started. A run raising before its first step: STOP, configuration or code error.
System tier: real supervisors, the alert command."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, until, wait_until
from stepwatch.monitors.runfiles import read_json

SAVES_PY = r'''
import os, signal, time
from pathlib import Path
for i in range(1, 101):
    time.sleep(0.03)
    print(f"step {i}/100 loss {1 / i:.4f}", flush=True)
    if i % 20 == 0:
        d = Path(f"ckpt_{i}")
        d.mkdir()
        (d / "weights.bin").write_bytes(b"w" * 1000)
        if i == 60:
            os.kill(os.getpid(), signal.SIGKILL)  # killed while the save is being written: no DONE marker
        (d / "DONE").write_text("ok")
'''

EARLY_PY = r'''
raise ValueError("learning_rate must be positive, got -1.0")
'''

PAGE_PY = r'''
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
'''


def _config(tmp_path: Path, name: str, script: str) -> str:
    command = [sys.executable, str(tmp_path / "repo" / "page.py"), str(tmp_path / f"pages-{name}.jsonl")]
    return (f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "{script}"]\n[alerts]\n'
            f"command = {json.dumps(command)}\n[restart]\nmode = \"observe\"\ncheckpoints = \"ckpt_*\"\n"
            'complete_marker = "DONE"\n')


@pytest.mark.slow
def test_observe_mode_records_and_pages_what_it_would_do_and_starts_nothing(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"saves.py": SAVES_PY, "early.py": EARLY_PY, "page.py": PAGE_PY,
                                         ".gitignore": "ckpt_*\n",
                                         "saves.toml": _config(tmp_path, "saves", "saves.py"),
                                         "early.toml": _config(tmp_path, "early", "early.py")})
    for name in ("saves", "early"):
        r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo)
        assert r.returncode == 0, r.stderr
    rec = {n: wait_until(lambda n=n: read_json(repo / "runs" / n / "restart.json"), 60, what=f"{n}'s restart.json")
           for n in ("saves", "early")}
    d = rec["saves"]["decision"]
    print(json.dumps(rec, indent=1))
    assert (d["verdict"], d["mode"], d["cause"], d["checkpoint_step"], d["lost_steps"], d["attempt"]) == (
        "RESTART", "observe", "save_crash", 40, 20, 1), d
    assert d["checkpoint"].endswith("/ckpt_40")
    assert [(c["step"], c["complete"]) for c in rec["saves"]["checkpoints"]] == [(20, True), (40, True), (60, False)]
    assert d["words"].startswith("would restart from ") and "(observe mode: nothing started)" in d["words"]
    e = rec["early"]["decision"]
    assert (e["verdict"], e["cause"], e["reason"]) == ("STOP", "config_error", "configuration or code error"), e
    assert "ValueError: learning_rate must be positive, got -1.0" in e["evidence"]
    for name, verdict in (("saves", "would restart"), ("early", "would stop")):
        pages = wait_until(lambda n=name: [json.loads(x) for x in (tmp_path / f"pages-{n}.jsonl").read_text().splitlines()
                                           if '"restart"' in x] if (tmp_path / f"pages-{n}.jsonl").exists() else None,
                           30, what=f"{name}'s restart page")
        assert verdict in pages[0]["message"].split("\n")[1], pages
        words = stepwatch("status", str(repo / "runs" / name)).stdout
        assert f"restart (observe, after attempt 1): {'RESTART' if name == 'saves' else 'STOP'}: {verdict}" in words, words
        assert (read_json(repo / "runs" / name / "run.json") or {})["attempt"] == 1  # observe: nothing was started


RESUMES_PY = r'''
import os, signal, sys, time
from pathlib import Path
start = 0
if "--resume" in sys.argv:
    start = int(Path(sys.argv[sys.argv.index("--resume") + 1]).name.split("_")[1])
    print(f"resuming from step {start}", flush=True)
for i in range(start + 1, 101):
    time.sleep(0.03)
    print(f"step {i}/100 loss {1 / i:.4f}", flush=True)
    if i % 20 == 0:
        d = Path(f"ckpt_{i}")
        d.mkdir(exist_ok=True)
        (d / "DONE").write_text("ok")
    if i == 57 and start == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # the first attempt dies at step 57
'''


@pytest.mark.slow
def test_enforce_mode_resumes_a_killed_run_from_its_newest_complete_checkpoint_and_stops_when_it_completes(
        tmp_path: Path):
    config = (f'name = "res"\ncommand = [{json.dumps(sys.executable)}, "resumes.py"]\n[restart]\nmode = "enforce"\n'
              'backoff_s = 1\ncheckpoints = "ckpt_*"\ncomplete_marker = "DONE"\nresume = ["--resume", "{checkpoint}"]\n')
    repo = make_repo(tmp_path / "repo", {"resumes.py": RESUMES_PY, ".gitignore": "ckpt_*\n", "res.toml": config})
    assert stepwatch("launch", "--no-tui", "res.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "res"

    def ended_twice() -> dict | None:
        rec = read_json(run_dir / "restart.json")
        return rec if rec and len(rec.get("attempts") or []) == 2 else None

    rec = wait_until(ended_twice, 90, interval_s=0.5, what="two attempts ended")
    print(json.dumps(rec, indent=1))
    first, second = rec["attempts"]
    assert (first["cause"], first["step"], first["checkpoint_step"]) == ("killed_by_signal", 57, 40), first
    assert (second["cause"], second["step"]) == ("completed", 100), second
    assert rec["decision"]["verdict"] == "STOP" and rec["decision"]["reason"] == "the run completed"
    run = read_json(run_dir / "run.json") or {}
    assert run["attempt"] == 2 and run["argv"][-2:] == ["--resume", str(repo / "ckpt_40")], run["argv"]
    gap_s = run["launched_at_unix"] - first["ended_at_unix"]
    print(f"death to the new attempt's launch: {gap_s:.1f} s (back-off 1 s)")
    assert 1.0 <= gap_s < 30, gap_s
    log = (run_dir / "train.log").read_text().splitlines()
    assert log[0] == "resuming from step 40" and log[1].startswith("step 41/100"), log[:2]
    words = stepwatch("status", str(run_dir)).stdout
    assert "restart (enforce, after attempt 2): STOP: not restarting: the run completed" in words, words


SAME_PY = r'''
import time
for i in range(1, 101):
    time.sleep(0.02)
    print(f"step {i}/100 loss {1 / i:.4f}", flush=True)
    if i == 10:
        raise ValueError("bad batch at step 10")
'''


@pytest.mark.slow
def test_enforce_mode_stops_after_two_attempts_that_fail_the_same_way_at_the_same_step(tmp_path: Path):
    config = (f'name = "same"\ncommand = [{json.dumps(sys.executable)}, "same.py"]\n[restart]\nmode = "enforce"\n'
              "backoff_s = 0\n")
    repo = make_repo(tmp_path / "repo", {"same.py": SAME_PY, "same.toml": config})
    assert stepwatch("launch", "--no-tui", "same.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "same"

    def stopped() -> dict | None:
        rec = read_json(run_dir / "restart.json")
        return rec if rec and rec["decision"]["verdict"] == "STOP" else None

    rec = wait_until(stopped, 90, interval_s=0.5, what="the policy to stop")
    assert [(a["attempt"], a["cause"], a["step"]) for a in rec["attempts"]] == [(1, "exception", 10), (2, "exception", 10)]
    assert rec["decision"]["reason"] == "same cause, no progress: exception again at step 10 (attempt 1 reached step 10)"
    assert "ValueError: bad batch at step 10" in rec["decision"]["evidence"]
    assert (read_json(run_dir / "run.json") or {})["attempt"] == 2  # no third attempt


def _pending(tmp_path: Path) -> Path:
    """A run whose enforce policy decided RESTART and waits out a 60 s back-off."""
    config = (f'name = "cancel"\ncommand = [{json.dumps(sys.executable)}, "resumes.py"]\n[restart]\nmode = "enforce"\n'
              'backoff_s = 60\ncheckpoints = "ckpt_*"\ncomplete_marker = "DONE"\nresume = ["--resume", "{checkpoint}"]\n')
    repo = make_repo(tmp_path / "repo", {"resumes.py": RESUMES_PY, ".gitignore": "ckpt_*\n", "cancel.toml": config})
    assert stepwatch("launch", "--no-tui", "cancel.toml", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "cancel"
    wait_until(lambda: (read_json(run_dir / "restart.json") or {}).get("decision"), 60, what="the decision")
    return run_dir


def _cancelled(run_dir: Path) -> dict:
    def cancelled() -> dict | None:
        rec = (read_json(run_dir / "restart.json") or {}).get("decision")
        return rec if isinstance(rec, dict) and "not_started" in rec else None

    d = wait_until(cancelled, 15, what="the cancellation recorded")
    assert d["not_started"] == "the operator stopped the run during the back-off: no new attempt", d
    assert (read_json(run_dir / "run.json") or {})["attempt"] == 1
    return d


@pytest.mark.slow
def test_a_stop_during_the_back_off_cancels_the_pending_restart(tmp_path: Path):
    run_dir = _pending(tmp_path)
    # the back-off: status says what the header says (issue 44: the header read UNKNOWN pid -), counting down
    first, *rest = stepwatch("status", str(run_dir)).stdout.splitlines()
    assert re.search(r" · RESTARTING in \d+ s \(attempt 2 from ckpt_40\)$", first), first
    assert any(re.fullmatch(r"  restarting: attempt 1 died \(SIGKILL\), attempt 2 starts in \d+ s from ckpt_40", ln)
               for ln in rest), rest
    r = stepwatch("stop", str(run_dir))
    assert r.returncode == 0 and "its pending restart is cancelled" in r.stdout, (r.stdout, r.stderr)
    _cancelled(run_dir)
    words = stepwatch("status", str(run_dir)).stdout
    assert "RESTARTING" not in words and "the restart did not start: the operator stopped the run" in words, words


@pytest.mark.slow
async def test_x_on_the_run_screen_cancels_a_pending_restart_after_saying_which(tmp_path: Path):
    """The run has ended and its policy waits out the back-off: ``x`` asks, quoting the decision, and cancels it;
    ``n`` (the control) leaves it pending."""
    from stepwatch.tui.app import StepwatchApp  # noqa: PLC0415
    from stepwatch.tui.screens.modals import Confirm  # noqa: PLC0415

    run_dir = _pending(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(120, 40)) as pilot:
        from stepwatch.tui.widgets.header import RunHeader  # noqa: PLC0415

        header = app.screen.query_one(RunHeader)
        await until(pilot, lambda: "RESTARTING in " in str(header.render()), 5, "the header's RESTARTING")
        assert "(attempt 2 from ckpt_40)" in str(header.render()), str(header.render())
        for answer in ("n", "y"):
            await pilot.pause(0.5)
            await pilot.press("x")
            confirm = await until(pilot, lambda: app.screen if isinstance(app.screen, Confirm) else None, 5,
                                  "the confirm")
            q = confirm.question
            assert q.startswith("Cancel the pending restart of cancel? (restarting in 60 s from ") and "ckpt_" in q, q
            await pilot.press(answer)
            if answer == "n":
                await pilot.pause(0.5)
                assert "not_started" not in (read_json(run_dir / "restart.json") or {})["decision"]
        _cancelled(run_dir)
        await until(pilot, lambda: any("its pending restart is cancelled" in n.message for n in app._notifications), 5,
                    "the notification that the restart is cancelled")
