"""The Textual app, driven with Pilot against real run dirs and real processes."""

from __future__ import annotations


import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from rich.text import Text

from conftest import REPO_ROOT, git, make_repo, stepwatch, until, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.watchdog import ProcessRef, probe
from stepwatch.tui.app import StepwatchApp
from stepwatch.tui.screens.run import RunScreen

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"


def text(widget) -> str:
    """The plain text a Static shows."""
    c = widget.content if hasattr(widget, "content") else widget.render()
    return c.plain if isinstance(c, Text) else str(c)


def launch_tick(repo: Path, name: str = "r") -> Path:
    r = stepwatch("launch", "--no-tui", "--name", name, "--", sys.executable, "tick.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / name
    wait_until(lambda: b"tick 0" in (run_dir / "train.log").read_bytes(), 10, what="first tick")
    return run_dir


async def test_attach_live_then_kill_shows_banner_until_acknowledged(repo: Path):
    run_dir = launch_tick(repo)
    pid = read_json(run_dir / "run.json")["process"]["pid"]
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        header = app.screen.query_one("#header")
        await until(pilot, lambda: "RUNNING" in text(header), what="RUNNING in the header")
        assert f"pid {pid}" in text(header)
        banner = app.screen.query_one("#banner")
        assert not banner.display
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        await until(pilot, lambda: banner.display and "SIGKILL" in text(banner), 2.0, "the watchdog banner")
        assert time.monotonic() - t0 < 2.0
        assert "watchdog" in text(banner) and "KILLED SIGKILL" in text(header)
        await pilot.pause(1.5)  # later refreshes keep it up
        assert banner.display
        await pilot.press("a")
        await until(pilot, lambda: not banner.display, 2.0, "the banner to go on 'a'")
    acks = [json.loads(ln) for ln in (run_dir / "acks.jsonl").read_text().splitlines()]
    assert acks and acks[0]["alert_id"].startswith("a1-watchdog")
    # Reattach: the acknowledged alert does not come back.
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        header = app.screen.query_one("#header")
        await until(pilot, lambda: "KILLED SIGKILL" in text(header), what="the final state on reattach")
        await pilot.pause(0.3)
        assert not app.screen.query_one("#banner").display


def _open_fds_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                n += 1
        except OSError:
            pass
    return n


async def test_the_run_screen_reads_each_file_through_its_observer_only(repo: Path):
    """One reader per view: the log panel's lines come from the observer's view update, and the
    attached run screen holds one descriptor on train.log (the observer's), never a second."""
    run_dir = launch_tick(repo)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        log = app.screen.query_one("#log")
        await until(pilot, lambda: any("tick 1" in str(line.text) for line in log.lines), 10, "tick 1 in the log")
        assert _open_fds_on((run_dir / "train.log").resolve()) == 1
        assert _open_fds_on((run_dir / "events.jsonl").resolve()) <= 1
        screen = app.screen
        assert not [k for k, v in vars(screen).items() if type(v).__name__ in ("LogFollower", "EventReader")]
        # the log panel shows each line once, in order, as the observer delivered it
        shown = [str(line.text) for line in log.lines if str(line.text).startswith("tick ")]
        nums = [int(s.split()[1]) for s in shown]
        assert nums == sorted(set(nums)) and nums[0] == 0


async def test_acknowledging_where_acks_jsonl_cannot_be_written_holds_for_the_session(tmp_path: Path):
    """The snapshot's ``acknowledged`` flag is the one definition: where acks.jsonl cannot be
    written (here a directory stands in its place, which stops root too), the observer keeps the
    acknowledgement and every later snapshot still marks it."""
    run_dir = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(STATIC_RUN, run_dir)
    (run_dir / "acks.jsonl").mkdir()
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        banner = app.screen.query_one("#banner")
        await until(pilot, lambda: banner.display, 10, "the banner")
        await pilot.press("a")
        await until(pilot, lambda: not banner.display, 2.0, "the banner to go on 'a'")
        await pilot.pause(2.5)  # later refreshes: the alerts stay acknowledged
        assert not banner.display
        assert app.screen.snap["alerts"] and all(a["acknowledged"] for a in app.screen.snap["alerts"])
        assert app.screen.observer.session_acked == {a["id"] for a in app.screen.snap["alerts"]}
    assert (run_dir / "acks.jsonl").is_dir() and not any((run_dir / "acks.jsonl").iterdir())


async def test_quit_leaves_the_run_alive_and_says_so(repo: Path):
    run_dir = launch_tick(repo)
    ref = ProcessRef.from_json(read_json(run_dir / "run.json")["process"])
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "RUNNING" in text(app.screen.query_one("#header")), what="RUNNING")
        await pilot.press("q")
        await pilot.pause(0.2)
    assert "running" in app.exit_message and str(ref.pid) in app.exit_message
    assert probe(ref) == "alive"


async def test_relaunch_key_rotates_and_log_shows_only_the_new_attempt(repo: Path):
    (repo / "once.py").write_text("import os\nprint('attempt', os.environ['STEPWATCH_ATTEMPT'], flush=True)\n")
    git(repo, "add", "once.py")
    git(repo, "commit", "-qm", "once")
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "once.py", cwd=repo)
    assert r.returncode == 0
    run_dir = repo / "runs" / "r"
    wait_until(lambda: read_json(run_dir / "exit.json"), 10, what="first attempt to end")
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        log = app.screen.query_one("#log")
        await until(pilot, lambda: any("attempt 1" in str(line.text) for line in log.lines), what="attempt 1 in the log")
        await pilot.press("r")
        await pilot.press("r")  # a second press in quick succession acts once
        await until(pilot, lambda: type(app.screen).__name__ == "Confirm", what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: type(app.screen).__name__ == "PreflightScreen", what="the checklist")
        await until(pilot, lambda: app.screen.checklist is not None, 30, "the checklist to finish")
        assert "working tree committed" in text(app.screen.query_one("#pf-items"))
        shown = " ".join(text(w) for w in app.screen.query("Static"))
        assert f"command: {shlex.join([sys.executable, 'once.py'])}" in shown and "config unchanged" in shown
        await pilot.press("enter")
        await until(pilot, lambda: (read_json(run_dir / "run.json") or {}).get("attempt") == 2, 15, "attempt 2")
        await until(pilot, lambda: any("attempt 2" in str(line.text) for line in log.lines), 10, "attempt 2 in the log")
        assert not any("attempt 1" in str(line.text) for line in log.lines)
    assert len(list(run_dir.glob("train.*.log"))) == 1  # one rotation: the key acted once


async def test_double_l_opens_one_prompt(tmp_path: Path):
    app = StepwatchApp(None, tmp_path / "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("l", "l")
        await pilot.pause(0.2)
        prompts = [s for s in app.screen_stack if type(s).__name__ == "Prompt"]
        assert len(prompts) == 1


def _copy_static(tmp_path: Path) -> Path:
    dst = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(STATIC_RUN, dst)
    return dst


async def test_static_run_shows_fallback_stall_and_recompile_limit_in_words(tmp_path: Path):
    run_dir = _copy_static(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(120, 40)) as pilot:
        banner = app.screen.query_one("#banner")
        await until(pilot, lambda: banner.display, what="the banner")
        verdict = text(app.screen.query_one("#step-verdict"))
        assert "fallback FLAGGED" in verdict
        dyn = text(app.screen.query_one("#dyn-counts"))
        assert "limit hits 1" in dyn
        kinds = {a["kind"] for a in app.screen.snap["alerts"]}
        assert {"fallback", "recompile_limit", "watchdog"} <= kinds
        assert "recompile_limit" in text(banner) or "+2 more" in text(banner)


async def test_live_stall_reads_stalled_in_words(tmp_path: Path):
    repo = make_repo(tmp_path / "h", {"hang.py": (
        "import time\nfrom stepwatch.telemetry import StepTelemetry\ntel = StepTelemetry()\n"
        "for i in range(20):\n    time.sleep(0.02)\n    tel.step_end()\nprint('hanging', flush=True)\ntime.sleep(600)\n")})
    r = stepwatch("launch", "--no-tui", "--name", "h", "--", sys.executable, "hang.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "h"
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        verdict = app.screen.query_one("#step-verdict")
        await until(pilot, lambda: "STALLED" in text(verdict), 15, "STALLED in the step panel")
        banner = app.screen.query_one("#banner")
        assert "ALERT stall: alive but stuck" in text(banner)
        # A stop is a stop, and the alert it cured stays until the operator acknowledges it.
        assert stepwatch("stop", str(run_dir), "--grace", "2").returncode == 0
        header = app.screen.query_one("#header")
        await until(pilot, lambda: "STOPPED" in text(header), 15, "STOPPED in the header")
        await pilot.pause(1.5)  # more than one refresh after the stop
        assert "ALERT stall (cleared): alive but stuck" in text(banner) and banner.display
        await pilot.press("a")
        await until(pilot, lambda: not banner.display, 5, "the banner to go on a")
        assert "stopped as requested" in stepwatch("watch", str(run_dir)).stdout


def _running_copy(tmp_path: Path, name: str, supervisor_alive: bool) -> Path:
    """The static run made a running one: its training process is this test's (alive); its
    supervisor this test's too, or the fixture's pid that no process holds (gone)."""
    import psutil

    run_dir = _copy_static(tmp_path)
    run_dir = run_dir.rename(run_dir.with_name(name))
    (run_dir / "exit.json").unlink()
    run = read_json(run_dir / "run.json") or {}
    me = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "pgid": os.getpgid(0)}
    run["process"] = me
    if supervisor_alive:
        run["supervisor"] = me
    (run_dir / "run.json").write_text(json.dumps(run))
    sup = ProcessRef.from_json(run["supervisor"])
    assert sup is not None and probe(sup) == ("alive" if supervisor_alive else "dead")
    return run_dir


@pytest.mark.parametrize("supervisor_alive", [False, True], ids=["supervisor-gone", "supervisor-alive"])
async def test_a_running_run_whose_supervisor_is_gone_says_so_under_the_header(tmp_path: Path, supervisor_alive: bool):
    """``status`` warned that the supervisor is gone (``supervisor_alive`` false while the run runs);
    the run screen said nothing. It says it in a line under the header, as plain text; with a live
    supervisor (the control) the line is not there."""
    run_dir = _running_copy(tmp_path, "alive" if supervisor_alive else "gone", supervisor_alive)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        header, gone = app.screen.query_one("#header"), app.screen.query_one("#supervisor-gone")
        await until(pilot, lambda: "RUNNING" in text(header), what="RUNNING in the header")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.snap["supervisor_alive"] is supervisor_alive
        if supervisor_alive:
            assert not gone.display and text(gone) == ""
        else:
            assert gone.display and gone.region.height >= 1
            assert text(gone) == ("SUPERVISOR GONE (killed?): the run goes on, but no exit status will be recorded; "
                                  "its warden (if any) pages the alerts")


def test_layout_at_80x24_snapshot(snap_compare, tmp_path: Path):
    """Header, summary line and banner fit in 80x24 (snapshot of a finished run's screen)."""
    run_dir = _copy_static(tmp_path)

    async def settle(pilot):
        await until(pilot, lambda: pilot.app.screen.query_one("#banner").display, what="the banner")
        pilot.app.clear_notifications()  # toasts time out; the snapshot is of the panels
        await pilot.pause(0.3)

    app = StepwatchApp(run_dir, run_dir.parent)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


async def test_80x24_keeps_header_summary_and_banner_visible(tmp_path: Path):
    run_dir = _copy_static(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.query_one("#banner").display, what="the banner")
        await pilot.pause(0.2)
        for wid in ("#header", "#banner", "#step-line"):
            w = app.screen.query_one(wid)
            assert w.region.height >= 1 and w.region.y + w.region.height <= 24, wid
        assert "n=" in text(app.screen.query_one("#step-line"))


async def test_home_lists_runs_and_enter_attaches(tmp_path: Path):
    from stepwatch.monitors.snapshot.acks import acknowledge
    from stepwatch.monitors.snapshot.observer import snapshot

    run_dir = _copy_static(tmp_path)
    alerts = [a["id"] for a in snapshot(run_dir)["alerts"]]
    assert len(alerts) >= 2
    acknowledge(run_dir, alerts[:1])
    app = StepwatchApp(None, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 1, what="one run listed")
        assert str(table.get_row_at(0)[-1]) == str(len(alerts) - 1)  # the open alerts: one acknowledged
        await pilot.press("enter")
        await until(pilot, lambda: type(app.screen).__name__ == "RunScreen", what="the run screen")
        await until(pilot, lambda: "KILLED SIGKILL" in text(app.screen.query_one("#header")), what="the header")


async def test_home_reads_each_runs_events_once_across_refreshes(tmp_path: Path, monkeypatch):
    """The home list refreshes every REFRESH_S; each refresh must read only what a run's files
    gained, not the whole events.jsonl again (10 runs of 100,000 steps would cost ~10 s a refresh)."""
    import stepwatch.tui.screens.home as home

    monkeypatch.setattr(home, "REFRESH_S", 0.1)
    run_dir = _copy_static(tmp_path)
    events = run_dir / "events.jsonl"
    lines = events.read_text().splitlines()
    last = json.loads([ln for ln in lines if json.loads(ln).get("kind") == "step"][-1])
    app = StepwatchApp(None, run_dir.parent)
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 1, what="one run listed")
        obs = app.screen._observers[run_dir]
        more = [dict(last, step=last["step"] + k, t=last["t"] + k, step_end=last["step_end"] + k, flags=[])
                for k in range(1, 4)]
        with open(events, "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in more))
        want = f"{last['step'] + 3}/"
        await until(pilot, lambda: any(want in str(c) for c in table.get_row_at(0)), what="the appended steps listed")
        assert app.screen._observers[run_dir] is obs  # the same observer, refreshed
        assert obs.a.events.bytes_read == events.stat().st_size  # every byte read once


def test_cli_attach_unknown_run_is_a_usage_error(tmp_path: Path):
    r = stepwatch("attach", "nope", "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and "no run 'nope'" in r.stderr


