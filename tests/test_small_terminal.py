"""At 80x24 (a common SSH terminal) the app is usable (issue 44, point 5): every dialog's action keys are on screen
whatever its body holds (the launch/relaunch checklist of ~40 rows, the help, an alert's whole text, a confirmation
quoting a long decision), the body scrolls to its last word, and the run screen keeps one GPU summary line. Pilot at
80x24 on the recorded run dir tests/fixtures/runs/ended-sigkill (and, for a checklist that passes, a real launched
run)."""

from __future__ import annotations

import html
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO_ROOT, git, stepwatch, until, wait_until
from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording
from stepwatch.monitors.gpu.sampler import GpuSampler
from stepwatch.monitors.runfiles import read_json
from stepwatch.tui.app import StepwatchApp
from stepwatch.tui.screens.modals import HELP, AlertDetails, Choose, Confirm, Help, PreflightScreen, Prompt

pytestmark = pytest.mark.system  # real app sessions of a few seconds each (and a real launch)

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"
SIZE = (80, 24)
#: A decision or question longer than 24 rows at 80 columns.
LONG_QUESTION = "Relaunch the run? " + " ".join(f"reason{i:03d}" for i in range(400)) + " LAST-WORDS-OF-THE-QUESTION"


def _copy(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(STATIC_RUN, run_dir)
    return run_dir


def _words(app: StepwatchApp) -> str:
    """What the screen shows now (the top screen over the ones below it), its words joined by single spaces."""
    shot = html.unescape(app.export_screenshot()).replace("\xa0", " ")
    return " ".join(re.sub(r"<[^>]+>", "\n", shot).split())


def _rows(app: StepwatchApp) -> list[str]:
    """The screen's rows as drawn now (the top screen over the ones below), as ``tmux capture-pane`` shows them."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def _dialog_words(app: StepwatchApp) -> str:
    """What the top dialog's box shows now inside its borders (the screen's rows cut to its content region), its
    words joined by single spaces: a line wrapped in the box reads whole."""
    rows = _rows(app)
    box = app.screen.query_one(".dialog").content_region
    return " ".join(" ".join(r[box.x:box.right] for r in rows[box.y:box.bottom]).split())


def _on_screen(app: StepwatchApp, selector: str) -> Any:
    """The widget ``selector`` of the top screen, drawn whole inside the 80x24 screen (else the test fails)."""
    w = app.screen.query_one(selector)
    r, screen = w.region, app.screen.region
    assert w.display and r.height >= 1 and screen.contains_region(r), (selector, r, screen)
    return w


async def _settled(pilot, app: StepwatchApp) -> None:
    await until(pilot, lambda: app.screen.query_one("#banner").display, what="the run screen with its banner")
    app.clear_notifications()  # toasts time out; the dialogs are under test


async def _scroll_to_the_end(pilot, app: StepwatchApp) -> None:
    body = app.screen.query_one(".dialog-body")  # tui/screens/modals.py DialogBody
    for _ in range(60):  # PgDn, as the operator would, until the body's end
        if body.scroll_y >= body.max_scroll_y:
            break
        await pilot.press("pagedown")
        await pilot.pause(0.02)
    await pilot.pause(0.1)
    assert body.max_scroll_y > 0 and body.scroll_y == body.max_scroll_y


async def test_at_80x24_the_relaunch_checklist_keeps_its_keys_and_reason_on_screen_and_scrolls_to_its_last_item(
        tmp_path: Path):
    run_dir = _copy(tmp_path)  # its cwd /srv/harness does not exist here: items fail, a reason is asked for
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=SIZE) as pilot:
        await _settled(pilot, app)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the relaunch confirmation")
        await pilot.pause(0.1)
        _on_screen(app, "#confirm-keys")
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, PreflightScreen), what="the checklist")
        screen: Any = app.screen
        await until(pilot, lambda: screen.checklist is not None, 30, "the checklist to finish")
        await pilot.pause(0.2)
        assert screen.checklist.failed
        hint = _on_screen(app, "#pf-hint")
        assert "Type a reason and Enter to launch anyway, Esc to cancel." in str(hint.render())
        _on_screen(app, "#pf-reason")
        assert "Esc to cancel" in _dialog_words(app)
        items = screen.checklist.items
        last = f"{items[-1].title}: {items[-1].reason}"
        assert " ".join(last.split()[-4:]) not in _dialog_words(app)  # the list is longer than the screen ...
        await _scroll_to_the_end(pilot, app)
        assert " ".join(last.split()[-4:]) in _dialog_words(app)  # ... and its last item is reached
        _on_screen(app, "#pf-hint")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, PreflightScreen), what="Esc to cancel")


async def test_at_80x24_a_passing_relaunch_checklist_shows_enter_launches_esc_cancels(repo: Path):
    (repo / "once.py").write_text("print('attempt done', flush=True)\n")
    git(repo, "add", "once.py")
    git(repo, "commit", "-qm", "once")
    assert stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "once.py", cwd=repo).returncode == 0
    run_dir = repo / "runs" / "r"
    wait_until(lambda: read_json(run_dir / "exit.json"), 10, what="the attempt to end")
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=SIZE) as pilot:
        run_screen: Any = app.screen
        await until(pilot, lambda: run_screen.snap["ended"] is not None, what="the run screen, the run ended")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the relaunch confirmation")
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, PreflightScreen), what="the checklist")
        screen: Any = app.screen
        await until(pilot, lambda: screen.checklist is not None, 30, "the checklist to finish")
        await pilot.pause(0.2)
        assert not screen.checklist.failed
        assert "All checks passed. Enter launches, Esc cancels." in str(_on_screen(app, "#pf-hint").render())
        assert "Enter launches, Esc cancels" in _dialog_words(app)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, PreflightScreen), what="Esc to cancel")
    run = read_json(run_dir / "run.json")
    assert run is not None and run["attempt"] == 1  # cancelled: nothing launched


async def test_at_80x24_the_help_scrolls_to_its_last_line_with_its_close_keys_on_screen(tmp_path: Path):
    run_dir = _copy(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=SIZE) as pilot:
        await _settled(pilot, app)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help), what="the help")
        await pilot.pause(0.2)
        assert "Esc closes" in _dialog_words(app)  # before any scrolling
        assert "Esc closes" in str(_on_screen(app, "#help-keys").render())
        last = " ".join(HELP.strip().splitlines()[-1].split())  # "? this help (Esc closes)"
        assert last not in _dialog_words(app)
        await _scroll_to_the_end(pilot, app)
        assert last in _dialog_words(app)
        _on_screen(app, "#help-keys")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, Help), what="Esc to close")


async def test_at_80x24_the_alert_details_keep_their_keys_on_screen_and_scroll_to_the_last_word(tmp_path: Path):
    """The fixture's long fallback alert (its evidence is cut on the banner) beside one whose text and py-spy stack
    fill several screens: the details open with their keys on screen and scroll to the last words of each."""
    run_dir = _copy(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=SIZE) as pilot:
        await _settled(pilot, app)
        screen: Any = app.screen
        fallback = next(a for a in screen.snap["alerts"] if a["kind"] == "fallback")
        assert len(fallback["message"]) > 400
        huge: Any = dict(fallback, id="huge", kind="stall", message=" ".join(f"evidence{i:04d}" for i in range(700))
                    + " THE-HUGE-ALERT-ENDS-HERE", stack="\n".join(f"Thread 1 (idle): frame_{i} (train.py:{i})"
                                                                    for i in range(40)))
        app.push_screen(AlertDetails([huge, fallback]))  # the newest (the fallback) first, as `d` shows them
        await until(pilot, lambda: isinstance(app.screen, AlertDetails), what="the details")
        await pilot.pause(0.2)
        assert "Esc closes" in _dialog_words(app)  # before any scrolling
        assert "Esc closes" in str(_on_screen(app, "#alert-keys").render())
        assert "THE-HUGE-ALERT-ENDS-HERE" not in _dialog_words(app)
        await pilot.press("end")
        await until(pilot, lambda: (b := app.screen.query_one("#alert-details")).scroll_y == b.max_scroll_y > 0,
                    what="the details' end")
        await pilot.pause(0.1)
        words = _dialog_words(app)
        assert "frame_39" in words  # the last alert's last lines: its stack's innermost frame ...
        shown = str(app.screen.query_one("#alert-details").query_one("Static").render())
        assert "THE-HUGE-ALERT-ENDS-HERE" in " ".join(shown.split())  # ... its whole text held, and reached:
        await pilot.press("home")
        await pilot.pause(0.1)
        assert " ".join(fallback["message"].split()[-3:]) in _dialog_words(app)  # the fallback's last words
        for _ in range(40):  # PgDn until the huge message's last word shows
            if "THE-HUGE-ALERT-ENDS-HERE" in _dialog_words(app):
                break
            await pilot.press("pagedown")
            await pilot.pause(0.02)
        assert "THE-HUGE-ALERT-ENDS-HERE" in _dialog_words(app)
        _on_screen(app, "#alert-keys")


@pytest.mark.parametrize("kind", ["confirm", "choose", "prompt"])
async def test_at_80x24_a_long_question_scrolls_and_its_keys_stay_on_screen(tmp_path: Path, kind: str):
    """A stop or cancel-restart confirmation quotes the policy's decision, a relaunch choice the checkpoint's path:
    whatever its length, the answer keys are drawn and the question scrolls to its end."""
    run_dir = _copy(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    answers: list[Any] = []
    async with app.run_test(size=SIZE) as pilot:
        await _settled(pilot, app)
        dialog, keys, key = {
            "confirm": (Confirm(LONG_QUESTION), "#confirm-keys", "n"),
            "choose": (Choose(LONG_QUESTION, [("s", "from scratch"), ("c", "from ckpt_200")]), "#choose-keys", "c"),
            "prompt": (Prompt(LONG_QUESTION), "#prompt-input", "escape"),
        }[kind]
        app.push_screen(dialog, answers.append)
        await until(pilot, lambda: app.screen is dialog, what="the dialog")
        await pilot.pause(0.2)
        # at open: the question from its first word, and the answer keys (the prompt's input) below it
        assert _dialog_words(app).startswith("Relaunch the run? reason000")
        assert "LAST-WORDS-OF-THE-QUESTION" not in _dialog_words(app)
        _on_screen(app, keys)
        if kind == "prompt":
            assert "Esc cancels" in str(_on_screen(app, "#prompt-keys").render())
        await _scroll_to_the_end(pilot, app)
        assert "LAST-WORDS-OF-THE-QUESTION" in _dialog_words(app)
        _on_screen(app, keys)
        await pilot.press(key)
        await until(pilot, lambda: app.screen is not dialog, what="the key to answer")
    assert answers == [{"confirm": False, "choose": "c", "prompt": None}[kind]]


def _sample_gpu(run_dir: Path) -> None:
    """30 s of a replayed H100 in the run's gpu.jsonl (the GPU panel at its fullest)."""
    times = iter(range(1_780_000_000, 1_780_000_030))
    sampler = GpuSampler(run_dir, None, backend=RecordedBackend(
        bundled_recording("synthetic_h100_healthy_compute_bound.jsonl"), loop=False), clock=lambda: float(next(times)))
    for _ in range(30):
        sampler.tick()


GPU_LINE = re.compile(r"GPU0: (SM|kernel-active) \d+% · \d+/\d+ W · [\d.]+/[\d.]+ GiB")


@pytest.mark.parametrize("restart_line", [False, True], ids=["banner", "banner-and-restart-line"])
async def test_at_80x24_the_run_screen_shows_one_gpu_summary_line(tmp_path: Path, restart_line: bool):
    import json

    run_dir = _copy(tmp_path)
    _sample_gpu(run_dir)
    if restart_line:  # the most crowded top: the restart policy's decision and the banner
        (run_dir / "restart.json").write_text(json.dumps({"v": 1, "attempts": [], "decision": {
            "verdict": "RESTART", "mode": "observe", "cause": "killed_by_signal", "reason": "r", "evidence": "e",
            "checkpoint": "out/checkpoint-40", "checkpoint_step": 40, "attempt": 1, "lost_steps": 17,
            "words": "would restart from out/checkpoint-40 (observe mode: nothing started): killed by SIGKILL"}}))
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=SIZE) as pilot:
        await _settled(pilot, app)
        row = await until(pilot, lambda: next((r for r in _rows(app) if GPU_LINE.search(r)), None),
                          what="a GPU summary line on screen")
        assert len(_rows(app)) == 24 and row.startswith("RECORDED replay GPU0: "), row
        line = _on_screen(app, "#gpu-summary")
        text = str(line.render())
        assert GPU_LINE.search(text) and text.startswith("RECORDED replay GPU0:"), text  # the replay said in it
        assert line.region.height == 1
        if restart_line:
            assert _on_screen(app, "#restart").region.height >= 1
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(160, 50)) as pilot:  # the control: with room, the full per-device lines
        await _settled(pilot, app)
        await until(pilot, lambda: any(r.startswith("GPU0 ") and "kernel-active" in r for r in _rows(app)),
                    what="the full panel")
        assert not app.screen.query_one("#gpu-summary").region.height
        assert _on_screen(app, "#gpu-lines").region.height >= 2


def test_in_tmux_at_80x24_every_dialogs_keys_show_and_the_gpu_has_its_line(tmp_path: Path):
    """The same in a real tmux pane of 80x24 (``stepwatch attach``), read back as the operator sees it."""
    from test_tmux import TmuxPane  # noqa: PLC0415

    run_dir = _copy(tmp_path)
    _sample_gpu(run_dir)
    pane = TmuxPane(tmp_path, run_dir, 80, 24)
    try:
        shown = pane.wait_for(lambda s: "? help" in s and GPU_LINE.search(s), what="the run screen with a GPU line")
        assert len(shown.splitlines()) == 24
        pane.keys("?")
        shown = pane.wait_for(lambda s: "Esc closes" in s, what="the help with its close keys")
        pane.keys("End")
        pane.wait_for(lambda s: "this help" in s and "Esc closes" in s, what="the help's last line")
        pane.keys("Escape")
        pane.wait_for(lambda s: "Esc closes" not in s, what="the help closed")
        pane.keys("d")
        shown = pane.wait_for(lambda s: "Esc closes" in s, what="the alert details' keys")
        assert "recompile_limit (" in shown  # the three alerts whole, the keys below them
        pane.keys("Escape")
        pane.wait_for(lambda s: "Esc closes" not in s, what="the details closed")
        pane.keys("r")
        pane.wait_for(lambda s: "yes (Enter)" in s, what="the relaunch confirmation")
        pane.keys("y")
        pane.wait_for(lambda s: "Type a reason and Enter" in s and "override reason" in s and "PgUp/PgDn scroll" in s,
                      30, what="the checklist's keys and reason field, the box saying that its body scrolls")
        pane.keys("Escape")
        pane.wait_for(lambda s: "override reason" not in s, what="Esc to cancel")
    finally:
        pane.close()
