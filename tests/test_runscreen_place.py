"""The run screen keeps its place at 80x24 (issue 33): a banner takes at most 3 lines and leaves at least 6 log
lines with its acknowledge key on screen; scrolled up, the log panel holds its exact lines while new ones arrive
(and says how many wait); End follows again; `w` wraps a long line; a finished run shows its log to the last line
after `z`; Ctrl-C says how to quit in the app's own keys, as plain text. Pilot on a finished run's files (the
files grow under it as a run's would); the live writer is the system tier's."""

from __future__ import annotations

import html
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO_ROOT, make_repo, stepwatch, until, wait_until
from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording
from stepwatch.monitors.gpu.sampler import GpuSampler
from stepwatch.tui.app import StepwatchApp
from stepwatch.tui.screens.run import RunScreen
from stepwatch.tui.widgets.logpanel import LogPanel

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"
LONG_LINE = "  File \"/" + "/".join(f"very_long_directory_name_{i}" for i in range(12)) + "/train.py\", line 7 END"


def _run(tmp_path: Path, n_lines: int = 5000, last: str | None = None) -> Path:
    run_dir = tmp_path / "runs" / "ended"
    shutil.copytree(STATIC_RUN, run_dir)
    lines = [f"tail {i:05d} loss {1.0 / i:.5f}" for i in range(1, n_lines + 1)] + ([last] if last else [])
    (run_dir / "train.log").write_text("\n".join(lines) + "\n")
    return run_dir


def _panel(app: StepwatchApp) -> LogPanel:
    return app.screen.query_one(LogPanel)


def _visible(panel: LogPanel) -> list[str]:
    """The log lines on screen now: the panel's rows from its scroll offset, as many as it shows."""
    y, x = round(panel.scroll_y), round(panel.scroll_x)
    rows, width = panel.scrollable_content_region.height, panel.scrollable_content_region.width
    return [panel.lines[i].text[x:x + width].rstrip() for i in range(y, min(len(panel.lines), y + rows))]


def _screen_text(app: StepwatchApp) -> str:
    shot = html.unescape(app.export_screenshot()).replace("\xa0", " ")
    return " ".join(re.sub(r"<[^>]+>", "\n", shot).split())


async def test_with_the_fallback_banner_at_80x24_six_log_lines_and_the_acknowledge_key_are_on_screen(tmp_path: Path):
    run_dir = _run(tmp_path)
    times = iter(range(1_780_000_000, 1_780_000_030))  # the GPU panel at its fullest: 30 s of a replayed H100
    sampler = GpuSampler(run_dir, None, backend=RecordedBackend(
        bundled_recording("synthetic_h100_healthy_compute_bound.jsonl"), loop=False), clock=lambda: float(next(times)))
    for _ in range(30):
        sampler.tick()
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        screen: Any = app.screen
        await until(pilot, lambda: screen.snap.get("alerts"), what="the alerts")
        fallback = next(a for a in screen.snap["alerts"] if a["kind"] == "fallback")
        assert len(fallback["message"]) > 400  # the long one: its evidence cut on the banner, whole behind `d`
        screen._show_alerts = lambda snap: None  # from here only this test draws the banner
        banner = screen.query_one("#banner")
        banner.show([fallback])
        screen._fit()
        panel = _panel(app)
        await until(pilot, lambda: _visible(panel) and _visible(panel)[-1] == "tail 05000 loss 0.00020", what="the tail")
        await pilot.pause(0.2)
        assert banner.display and 1 <= banner.region.height <= 3, banner.region
        assert screen.query_one("#gpu").region.height >= 2  # the replayed GPU is on screen too
        shown = _visible(panel)
        assert len(shown) >= 6 and all(s.startswith("tail ") for s in shown), shown
        words = _screen_text(app)
        assert "[a] acknowledge" in words and "ALERT fallback" in words
        assert panel.region.bottom <= app.size.height - 2  # above the unfinished line and the footer
        await pilot.press("a")  # acknowledged: the banner goes, the plots come back, the log still ends at its end
        await until(pilot, lambda: not banner.display, what="the banner gone")
        await pilot.pause(0.2)
        assert screen.query_one("StepPanel .plots").display
        assert len(_visible(panel)) >= 6 and _visible(panel)[-1] == "tail 05000 loss 0.00020"


@pytest.mark.system  # a real app scrolled through 5,000 lines: 1.5-1.7 s a run, too near the unit tier's 2 s a test
async def test_scrolled_up_six_pages_the_panel_holds_its_exact_lines_while_the_log_grows_and_end_follows(tmp_path: Path):
    run_dir = _run(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    app.animation_level = "none"  # a page is scrolled at once, not over a quarter second: the lines are the same
    async with app.run_test(size=(80, 24)) as pilot:
        panel = _panel(app)
        await until(pilot, lambda: _visible(panel) and _visible(panel)[-1] == "tail 05000 loss 0.00020", what="the tail")
        panel.focus()
        for _ in range(6):
            await pilot.press("pageup")
        await until(pilot, lambda: not panel.following, what="scrolled up")
        await pilot.pause(0.2)
        before = _visible(panel)
        assert before and before[-1] != "tail 05000 loss 0.00020"
        with (run_dir / "train.log").open("a") as f:  # 2,000 new lines: more than the panel keeps (1,000)
            f.write("".join(f"new {i:05d}\n" for i in range(1, 2001)))
        screen = app.screen
        assert isinstance(screen, RunScreen)
        screen.poll_soon()  # read them now, not at the next 1 s refresh (tui/screens/run.py)
        await until(pilot, lambda: panel.held[-1:] == ["new 02000"], what="the new lines read and held")
        await pilot.pause(0.3)
        assert _visible(panel) == before  # the same lines, where the operator left them
        await until(pilot, lambda: re.search(r"NOT FOLLOWING \(f or End follows\) · [\d,]+ new lines",
                                             str(panel.border_title)), what="the title")
        await pilot.press("end")
        await until(pilot, lambda: panel.following and _visible(panel)[-1:] == ["new 02000"], what="following again")
        shown = _visible(panel)
        assert shown == [f"new {i:05d}" for i in range(2001 - len(shown), 2001)]  # the newest, none lost or doubled
        assert "NOT FOLLOWING" not in str(panel.border_title)


async def test_w_wraps_a_long_line_and_cuts_it_again(tmp_path: Path):
    run_dir = _run(tmp_path, 200, last=LONG_LINE)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = _panel(app)
        await until(pilot, lambda: any("very_long" in s for s in _visible(panel)), what="the long line")
        assert not any(s.endswith("END") for s in _visible(panel))  # cut at the edge
        await pilot.press("w")
        await until(pilot, lambda: _visible(panel)[-1:] == ["line 7 END"] or any(s.endswith("END") for s in _visible(panel)),
                    what="the long line wrapped to its end")
        assert "".join(s for s in _visible(panel)[-4:]).replace(" ", "").endswith(LONG_LINE.replace(" ", "")[-60:])
        assert panel.following and _visible(panel)[-1].endswith("END")
        await pilot.press("w")
        await until(pilot, lambda: not any(s.endswith("END") for s in _visible(panel)), what="cut again")


async def test_a_finished_run_shows_its_last_line_after_z_and_back(tmp_path: Path):
    run_dir = _run(tmp_path, 3000, last="the very last line of the run")
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = _panel(app)
        await until(pilot, lambda: _visible(panel)[-1:] == ["the very last line of the run"], what="the last line")
        for _ in range(2):
            await pilot.press("z")
            await pilot.pause(0.3)
            assert _visible(panel)[-1:] == ["the very last line of the run"], _visible(panel)


async def test_ctrl_c_says_how_to_quit_in_the_apps_own_keys_as_plain_text(tmp_path: Path):
    run_dir = _run(tmp_path, 10)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+c")
        await pilot.pause(0.3)
        toasts = [(n.title, n.message, n.markup) for n in app._notifications if n.title == "Quit?"]
        assert toasts == [("Quit?", "q quits stepwatch (the run keeps going; ctrl+q too)", False)], toasts
        assert app.is_running  # Ctrl-C quit nothing


WRITER_PY = r'''
import time
for i in range(1, 1000000):
    print(f"line {i:07d}", flush=True)
    time.sleep(0.005)
'''


@pytest.mark.slow
async def test_live_scrolled_up_six_pages_the_same_lines_stay_for_5_s_of_new_lines_and_end_follows(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"w.py": WRITER_PY})
    r = stepwatch("launch", "--no-tui", "--name", "w", "--", sys.executable, "w.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "w"
    wait_until(lambda: b"line 0001500\n" in (run_dir / "train.log").read_bytes(), 30, what="1,500 lines")
    try:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(80, 24)) as pilot:
            panel = _panel(app)
            await until(pilot, lambda: len(panel.lines) >= 1000, what="the panel full")
            panel.focus()
            for _ in range(6):
                await pilot.press("pageup")
            await until(pilot, lambda: not panel.following, what="scrolled up")
            before = _visible(panel)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:  # 5 s of new lines (about 1,000), checked as they arrive
                await pilot.pause(0.5)
                assert _visible(panel) == before, (before[:2], _visible(panel)[:2])
            assert panel.held_count >= 300
            await pilot.press("end")
            newest = (run_dir / "train.log").read_text().splitlines()[-1]
            await until(pilot, lambda: panel.following and _visible(panel)[-1] >= newest, what="following again")
    finally:
        stepwatch("stop", str(run_dir), "--grace", "1", timeout=30)


async def test_the_restart_policys_decision_shows_under_the_header_and_the_log_keeps_six_lines(tmp_path: Path):
    import json

    run_dir = _run(tmp_path)
    words = "would restart from out/checkpoint-40 (observe mode: nothing started): killed_by_signal: killed by SIGKILL"
    (run_dir / "restart.json").write_text(json.dumps({"v": 1, "attempts": [], "decision": {
        "verdict": "RESTART", "mode": "observe", "cause": "killed_by_signal", "reason": "r", "evidence": "e",
        "checkpoint": "out/checkpoint-40", "checkpoint_step": 40, "attempt": 1, "lost_steps": 17,
        "words": words + "\x1b[2J"}}))
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        screen: Any = app.screen
        line = screen.query_one("#restart")
        await until(pilot, lambda: line.display, what="the restart line")
        await pilot.pause(0.3)
        text = " ".join(str(line.render()).split())
        assert text.startswith("RESTART POLICY (observe, after attempt 1): RESTART: would restart from "), text
        assert "\x1b" not in text and "␛[2J" in text  # a file's bytes shown, never obeyed
        assert len(_visible(_panel(app))) >= 6 and screen.query_one("#banner").display
