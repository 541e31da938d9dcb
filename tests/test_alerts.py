"""Alerts that need no live process: the recompile storm, and views that never run the [alerts] command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO_ROOT
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.tui.app import StepwatchApp

PID = 2_147_483_000  # above any pid_max: never alive


def write_run(run_dir: Path, steps: list[tuple[int, float, list[str]]], alerts_command: list[str] | None = None) -> None:
    run_dir.mkdir(parents=True)
    t0 = 1_780_000_000.0
    (run_dir / "run.json").write_text(json.dumps({
        "v": 1, "name": run_dir.name, "attempt": 1, "launched_at_unix": t0,
        "config": {"alerts": {"command": alerts_command}} if alerts_command else None,
        "process": {"pid": PID, "create_time": t0, "pgid": PID}, "supervisor": {"pid": PID - 1, "create_time": t0}}))
    t, lines = t0, []
    for step, dt, flags in steps:
        lines.append(json.dumps({"v": 1, "kind": "step", "t": t + dt, "step": step, "rank": 0, "dt": dt,
                                 "step_begin": t, "step_end": t + dt, "tokens": None, "padded_tokens": None,
                                 "flags": flags}))
        t += dt
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "exit.json").write_text(json.dumps({"returncode": 0, "signal": None, "ended_at_unix": t + 1,
                                                   "duration_s": t + 1 - t0}))


def steady(n: int, recompile_at: set[int]) -> list[tuple[int, float, list[str]]]:
    return [(i, 1.0 + 0.01 * (i % 7), (["first"] if i == 1 else []) + (["recompile"] if i in recompile_at else []))
            for i in range(1, n + 1)]


def kinds(run_dir: Path) -> list[str]:
    return [a["kind"] for a in RunObserver(run_dir).refresh()["alerts"]]


def test_recompile_storm_after_warmup_raises_an_alert(tmp_path: Path):
    run_dir = tmp_path / "storm"
    write_run(run_dir, steady(120, {60, 63, 66, 70, 75, 80}))
    snap = RunObserver(run_dir).refresh()
    storm = [a for a in snap["alerts"] if a["kind"] == "recompile_storm"]
    assert len(storm) == 1 and "recompile storm after warm-up" in storm[0]["message"]
    assert storm[0]["id"] == "a1-recompile_storm-60"


def test_a_few_recompiles_or_warmup_recompiles_are_no_storm(tmp_path: Path):
    few = tmp_path / "few"
    write_run(few, steady(120, {60, 90, 119}))
    assert "recompile_storm" not in kinds(few)
    spread = tmp_path / "spread"
    write_run(spread, steady(400, {30, 150, 270, 390, 399}))  # 5 recompiles, never 5 within 100 steps
    assert "recompile_storm" not in kinds(spread)


@pytest.mark.system
def test_a_view_never_runs_the_alerts_command_it_reads(tmp_path: Path):
    """A run dir whose run.json names an [alerts] command, its supervisor gone: the TUI, status
    and watch show the alerts and execute nothing (delivery is the run owner's supervisor's; the
    positive control, the supervisor running it, is in tests/test_supervisor_watch.py)."""
    out = tmp_path / "pings.txt"
    script = tmp_path / "ping.py"
    script.write_text("with open(%r, 'a') as f:\n    f.write('ran\\n')\n" % str(out))
    run_dir = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill", run_dir)
    rj = json.loads((run_dir / "run.json").read_text())
    rj["config"] = {"alerts": {"command": [sys.executable, str(script)]}}
    (run_dir / "run.json").write_text(json.dumps(rj))

    async def go() -> list[dict]:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(100, 30)) as pilot:
            deadline = time.monotonic() + 10
            while not app.screen.query_one("#banner").display and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.pause(2.5)  # more refreshes
            return app.screen.snap["alerts"]

    import asyncio

    alerts = asyncio.run(go())
    assert {a["kind"] for a in alerts} == {"recompile_limit", "fallback", "watchdog"}
    # the view says what became of the delivery: nothing recorded, never "delivered"
    assert all(a["delivered"] == {"command": {"outcome": None, "detail": "no delivery recorded"}} for a in alerts)
    for args in (["status", str(run_dir)], ["status", str(run_dir), "--json"], ["watch", str(run_dir), "--plain"]):
        subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", *args], capture_output=True, timeout=60)
    # a command any of them started has either written already or is still running: neither
    running = [pr.pid for pr in psutil.process_iter(["cmdline"]) if str(script) in (pr.info["cmdline"] or [])]
    assert not running and not out.exists()


@pytest.mark.system
def test_demo_without_torch_names_the_extra_and_exits_2(tmp_path: Path):
    code = ("import sys; sys.modules['torch'] = None; from stepwatch.tui.cli import main; "
            f"sys.exit(main(['demo', '--no-tui', '--runs-dir', {str(tmp_path)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "torch" in r.stderr and "stepwatch[train]" in r.stderr
    assert not (tmp_path / "demo").exists()


