"""The log panel as an operator uses it: it follows the tail until scrolled up, and says
so; `/` search with n / N, `e` / `E` errors, `F` filter and `z` full screen work over the whole
train.log (100,000 lines here), not only the lines on screen. Pilot at 80x24."""

from __future__ import annotations

import math
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, make_repo, stepwatch, until, wait_until
from textual.widgets import Static

from stepwatch.tui.app import StepwatchApp
from stepwatch.tui.widgets.logpanel import LogPanel

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"
N_LINES = 100_000


def _big_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "big"
    shutil.copytree(STATIC_RUN, run_dir)
    lines = [f"step {i} loss {1.0 / i:.5f} data ok" for i in range(1, N_LINES + 1)]
    lines[10_000 - 1] = "step 10000 loss 0.1 the needle here"
    lines[50_000 - 1] = "Traceback (most recent call last):"
    lines[90_000 - 1] = "step 90000 loss 0.01 a NEEDLE again"
    (run_dir / "train.log").write_text("\n".join(lines) + "\n")
    return run_dir


def _launched(tmp_path: Path, name: str, source: str) -> Path:
    """``source`` as ``<name>.py`` in a fresh repo, launched headless as run ``name``; its run dir."""
    repo = make_repo(tmp_path / "repo", {f"{name}.py": source})
    r = stepwatch("launch", "--no-tui", "--name", name, "--", sys.executable, f"{name}.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    return repo / "runs" / name


def _panel(app) -> LogPanel:
    return app.screen.query_one("#log", LogPanel)


def _shown(app) -> list[str]:
    return [str(line.text) for line in _panel(app).lines]


async def _type(pilot, text: str) -> None:
    for ch in text:
        await pilot.press(ch)
    await pilot.press("enter")


async def test_search_errors_filter_follow_and_zoom_over_a_100k_line_log(tmp_path: Path):
    run_dir = _big_run(tmp_path)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = _panel(app)
        await until(pilot, lambda: any(f"step {N_LINES} " in s for s in _shown(app)), what="the tail")
        assert panel.mode == "tail" and "NOT FOLLOWING" not in str(panel.border_title)
        await pilot.press("slash")
        await _type(pilot, "needle")
        await until(pilot, lambda: panel.centre == 90_000, what="the newest match")
        title = str(panel.border_title)
        assert "'needle' at line 90,000 of 100,000 (2 matching lines)" in title and "NOT FOLLOWING" in title, title
        assert any(s.endswith("a NEEDLE again") and s.lstrip().startswith("90000 ") for s in _shown(app))
        await pilot.press("N")
        await until(pilot, lambda: panel.centre == 10_000, what="the previous match")
        await pilot.press("N")  # none before: it says so and stays
        await pilot.pause(0.3)
        assert panel.centre == 10_000
        await pilot.press("n")
        await until(pilot, lambda: panel.centre == 90_000, what="the next match")
        await pilot.press("E")  # the previous error or traceback from here
        await until(pilot, lambda: panel.centre == 50_000, what="the traceback")
        assert "error at line 50,000" in str(panel.border_title)
        await pilot.press("F")
        await _type(pilot, "needle")
        await until(pilot, lambda: "filter 'needle': 2 line(s)" in str(panel.border_title), what="the filter")
        assert [re.sub(r"^\s*\d+ ", "", s) for s in _shown(app)] == ["step 10000 loss 0.1 the needle here",
                                                                   "step 90000 loss 0.01 a NEEDLE again"]
        await pilot.press("z")
        await pilot.pause(0.1)
        assert not app.screen.query_one("#steps").display and not app.screen.query_one("#gpu").display
        await pilot.press("z")
        await pilot.pause(0.1)
        assert app.screen.query_one("#steps").display
        await pilot.press("f")
        await until(pilot, lambda: panel.mode == "tail" and any(f"step {N_LINES} " in s for s in _shown(app)),
                    what="following the tail again")
        assert "NOT FOLLOWING" not in str(panel.border_title) and not _shown(app)[-1][0].isspace()


WRITER_PY = r'''
import sys, time
for i in range(1, 100000):
    print(f"line {i}", flush=True)
    time.sleep(0.02)
'''


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_scrolled_up_the_panel_stays_put_says_so_and_end_follows_again(tmp_path: Path, size: tuple[int, int]):
    run_dir = _launched(tmp_path, "w", WRITER_PY)
    wait_until(lambda: b"line 150\n" in (run_dir / "train.log").read_bytes(), 20, what="150 lines")
    try:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=size) as pilot:
            panel = _panel(app)
            await until(pilot, lambda: len(_shown(app)) > 100, what="the log")
            panel.focus()
            await pilot.press("pageup")
            await pilot.press("pageup")
            await until(pilot, lambda: not panel.following, what="scrolled up: not following")
            y, shown = panel.scroll_y, _shown(app)
            await until(pilot, lambda: panel.held_count > 20, what="more lines arriving, held")
            assert panel.scroll_y == y and _shown(app) == shown  # where the operator put it, the same lines
            await until(pilot, lambda: "NOT FOLLOWING (f or End follows)" in str(panel.border_title), what="the title")
            await pilot.press("end")
            await until(pilot, lambda: panel.following and "NOT FOLLOWING" not in str(panel.border_title),
                        what="following again")
            m = len(_shown(app))
            await until(pilot, lambda: len(_shown(app)) > m + 5, what="new lines")
            await until(pilot, lambda: panel.scroll_y >= panel.max_scroll_y, what="the view at the newest line")
    finally:
        stepwatch("stop", str(run_dir), "--grace", "1", timeout=30)


async def test_every_alerts_whole_text_and_its_acknowledge_key_are_on_screen_at_80x24(tmp_path: Path):
    import html

    from stepwatch.monitors.snapshot.alerts import alert, merge_alerts
    from stepwatch.tui.screens.modals import AlertDetails

    def listed(key: str, kind: str, message: str) -> dict:
        """An alert as the snapshot lists it (every key its type declares), not acknowledged."""
        return {**merge_alerts([alert({}, 1, kind, key, message, 1.7e9)], {}, {}, {}, [])[0], "acknowledged": False}

    run_dir = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(STATIC_RUN, run_dir)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.snap.get("alerts"), what="the alerts")
        alerts = list(app.screen.snap["alerts"])
        long_one = listed("x", "stuck_rank", "rank 3 (pid 81234) stopped stepping: its last step 1,204 ended 95 s "
                          "before rank 0's step 1,212 (threshold 31.2 s); its Python stack is in stepwatch status; "
                          "ranks by last step: 3 at step 1204 (pid 81234), 0 at step 1212 (pid 81230) END")
        # The kinds the fixture has not, each as long as it gets (the numbers at their widest), and a
        # message of one 2,000-character word (a path, a repr): cut by characters, never unmarked.
        synthetic = [
            listed(f"s-{kind}", kind, msg + " END") for kind, msg in (
                ("stall", "alive but stuck: no optimizer step for 86,400 s after step 1,234,567 (its steps take "
                          "12.3456 s at p99); its Python stack is in stepwatch status"),
                ("rank_death", "rank 7 (pid 4194304) was killed by SIGKILL at step 1,234,567 while the others "
                               "ran on; torchrun may restart the workers (2 restarts left)"),
                ("straggler", "rank 5 runs 3.4x slower than the median rank (p50 1.234 s against 0.363 s over "
                              "the last 200 steps); ranks by p50: 5 1.234 s, 2 0.401 s, 0 0.363 s"),
                ("nonfinite_loss", "the log's train/loss is not a number (NaN or inf) at step 1,234,567: the "
                                   "run has diverged; every step from here trains on garbage"),
                ("recompile_storm", "12 recompiles within the last 50 steps (steps 1,234,500..1,234,550): "
                                    "dynamo keeps recompiling; mark the changing dimension dynamic"),
                ("gpu", "GPU3 NVIDIA H100 80GB HBM3 held by the run's rank 3 is idle: kernel-active 0% at "
                        "71/700 W for the last 30 s while the run is running"),
                ("disk_full", "the run dir's file system is full (0 B of 3.5 TiB free): the supervisor could "
                              "not write alerts.jsonl, logsteps.jsonl; train.log is losing bytes"),
                ("one_word", "/" + "x" * 2000),
            )]
        assert {a["kind"] for a in alerts} >= {"fallback", "recompile_limit", "watchdog"}
        screen = app.screen
        banner = screen.query_one("#banner")

        def on_screen() -> str:
            shot = html.unescape(app.export_screenshot()).replace("\xa0", " ")
            return " ".join(re.sub(r"<[^>]+>", "\n", shot).split())

        def details_hold(shown: list[dict]) -> int:
            """The details' text holds each message whole, inside the screen; returns how far it scrolls."""
            box = app.screen.query_one("#alert-details")
            text = " ".join(str(box.query_one(Static).render()).split())
            assert all(" ".join(a["message"].split()) in text for a in shown)
            assert box.region.y >= 0 and box.region.bottom <= app.size.height, box.region
            return box.max_scroll_y

        await pilot.press("d")  # the key, on the real snapshot: every alert whole, the newest first
        await until(pilot, lambda: isinstance(app.screen, AlertDetails), 5, "the details")
        await pilot.pause(0.1)
        assert details_hold(alerts) == 0  # the three fit on one 80x24 screen, no scrolling
        await pilot.press("escape")
        await pilot.pause(0.1)
        screen._show_alerts = lambda snap: None  # from here only this test draws the banner
        cut = 0
        for al in [*alerts, long_one, *synthetic]:
            banner.show([al])
            await pilot.pause(0.1)
            words = on_screen()
            assert "[a] acknowledge · [d] details" in words, al["kind"]
            tail = " ".join(al["message"].split()[-3:])
            if tail not in words:  # cut on the banner (it says so): the whole text is one key away
                cut += 1
                assert " …" in words, al["kind"]
                app.push_screen(AlertDetails([al]))
                await pilot.pause(0.2)
                if details_hold([al]):  # longer than the screen (the 2,000-char word): End shows its end
                    assert al["kind"] == "one_word"
                    await pilot.press("end")
                    box = app.screen.query_one("#alert-details")
                    await until(pilot, lambda: box.scroll_y == box.max_scroll_y, 5, "the details' end")
                    assert "END" in on_screen()  # the message's last word, now on screen
                await pilot.press("escape")
                await pilot.pause(0.1)
        assert 0 < cut < len(alerts) + 1 + len(synthetic)  # the long fallback evidence is cut; the short ones whole


LOSS_PY = r'''
import math, time
for step in range(1, 100000):
    time.sleep(0.05)
    if step % 5 == 0:
        print(f"step {step} loss {3.0 / math.sqrt(step):.4f} lr 0.0003", flush=True)
    else:
        print(f"step {step} lr 0.0003", flush=True)
'''


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_run_logging_its_loss_every_5_steps_shows_the_loss_and_its_plot_within_a_refresh(tmp_path: Path,
                                                                                                 size: tuple[int, int]):
    from stepwatch.tui.widgets.steps import StepPanel

    run_dir = _launched(tmp_path, "loss", LOSS_PY)
    try:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=size) as pilot:
            screen = app.screen
            await until(pilot, lambda: screen.query_one("#loss-col").display, 20, "the loss plot")
            # a plot needs two points: wait for the second loss line (step 10) in the log, then time it
            await until(pilot, lambda: len(re.findall(r"step \d+ loss ", (run_dir / "train.log").read_text())) >= 2,
                        20, "two loss lines")
            printed = re.findall(r"step (\d+) loss ([\d.]+)", (run_dir / "train.log").read_text())
            step, loss = int(printed[-1][0]), float(printed[-1][1])
            t0 = time.monotonic()

            def shows() -> bool:
                line = str(screen.query_one("#throughput").render())
                m = re.search(r"loss ([\d.]+) .*\(step (\d+)\)", line)
                return bool(m) and int(m.group(2)) >= step

            await until(pilot, shows, 5, f"the loss of step {step} on screen")
            assert time.monotonic() - t0 < 2.5  # the view's refresh is 1 s
            axis = str(screen.query_one("#loss-axis").render())
            assert re.match(r"steps 5\.\.\d+, ", axis), axis
            assert len(screen.query_one("#loss-plot").data) >= 2 and max(screen.query_one("#loss-plot").data) == \
                pytest.approx(3.0 / 5 ** 0.5, abs=1e-3)  # the first, highest loss: step 5
            await pilot.press("g")
            await until(pilot, lambda: "(log)" in str(screen.query_one("#loss-title").render()), 5, "log scale")
            assert screen.query_one(StepPanel).log_scale
            assert max(screen.query_one("#loss-plot").data) == pytest.approx(math.log10(3.0 / 5 ** 0.5), abs=1e-3)
            assert loss > 0
    finally:
        stepwatch("stop", str(run_dir), "--grace", "1", timeout=30)


EMITTER_LOSS_PY = r'''
import math, time
from stepwatch.telemetry import StepTelemetry
tel = StepTelemetry(max_steps=100000)
for step in range(1, 100000):
    time.sleep(0.03)
    tel.step_end()
    if step % 5 == 0:
        loss = float("nan") if step == 60 else 3.0 / math.sqrt(step)
        tel.log({"loss": loss, "learning_rate": 3e-4, "grad_norm": 0.5}, step=step)
    if step == 60:
        print("step 60: the emitter logged a NaN loss", flush=True)
        time.sleep(600)
'''


async def test_an_emitter_only_run_shows_its_loss_plot_and_a_nan_loss_names_its_step(tmp_path: Path):
    """Nothing printed but the emitter's log events: the latest loss, the plot from the events, and
    the NaN loss of step 60 as an alert naming step 60."""
    run_dir = _launched(tmp_path, "emit", EMITTER_LOSS_PY)
    try:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            await until(pilot, lambda: screen.query_one("#loss-col").display, 20, "the loss plot from log events")
            def latest_loss() -> str | None:
                t = str(screen.query_one("#throughput").render())
                return t if re.search(r"loss \d\.\d+ .*\(step \d+\)", t) else None

            line = await until(pilot, latest_loss, 10, "the latest loss")
            assert "learning_rate 0.0003" in line and "grad_norm 0.5" in line, line
            banner = screen.query_one("#banner")
            await until(pilot, lambda: "nonfinite_loss" in str(banner.render()), 20, "the NaN loss alert")
            assert "at step 60" in " ".join(str(banner.render()).split())
            assert "loss NaN/inf" in str(screen.query_one("#throughput").render())
            series = screen.snap["metrics_series"]["loss"]
            assert series[0][0] == 5 and max(b[3] for b in series if b[3] is not None) == pytest.approx(3.0 / 5 ** 0.5)
    finally:
        stepwatch("stop", str(run_dir), "--grace", "1", timeout=30)
