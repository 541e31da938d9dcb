"""Hostile run dirs (issue 15): every view opens each one of tests/hostile_runs.py's corpus without
crashing, hanging, executing anything or letting a control byte reach the terminal; writes never
follow a symlink."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import stepwatch
from hostile_runs import ESCAPES, PAYLOADS, make_hostile_runs
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.tui.safe import SafeWriter, safe_text, visible

#: a raw control byte in what a headless command printed (newline and tab are layout)
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    return make_hostile_runs(tmp_path / "runs", tmp_path / "outside")


def test_visible_replaces_every_control_character_with_a_stand_in_of_the_same_length():
    s = "a" + ESCAPES + "\tb\nc\r"
    v = visible(s)
    assert not RAW_CONTROL.search(v) and "\n" not in v and "\t" in v and len(v) == len(s)
    assert "␛]52;" in v and "␍" in v
    assert visible(s, newlines=True).count("\n") == 1
    t = safe_text(safe_text("[bold]x[/]", "red"))
    assert t.plain == "[bold]x[/]" and t.style == "red"  # never parsed as markup


def test_safe_writer_passes_text_and_makes_control_visible(tmp_path: Path):
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        w = SafeWriter(f)
        w.write("ok\tline\n" + ESCAPES + "\n")
    text = out.read_text()
    assert text.startswith("ok\tline\n") and not RAW_CONTROL.search(text)


HEADLESS = [("status",), ("status", "--json"), ("watch", "--plain"), ("watch", "--json")]


def test_every_headless_view_opens_every_hostile_run(corpus: dict[str, Path], tmp_path: Path):
    for name, run_dir in corpus.items():
        for args in HEADLESS:
            r = stepwatch(args[0], str(run_dir), *args[1:], timeout=20)
            what = f"{name}: stepwatch {' '.join(args)}"
            assert r.returncode in (0, 1, 2), (what, r.returncode, r.stderr[-2000:])
            assert "Traceback" not in r.stderr, (what, r.stderr[-3000:])
            for stream in (r.stdout, r.stderr):
                assert not RAW_CONTROL.search(stream), (what, RAW_CONTROL.search(stream), stream[-500:])
    r = stepwatch("runs", "--runs-dir", str(tmp_path / "runs"), timeout=20)
    assert r.returncode == 0 and "Traceback" not in r.stderr and not RAW_CONTROL.search(r.stdout), r.stderr
    assert "[bold]run[/bold]" in r.stdout or "markup" in r.stdout
    assert not Path("/tmp/stepwatch-pwned").exists()  # no view ran the run's [alerts] command


def test_the_escapes_run_shows_its_text_visibly_in_status(corpus: dict[str, Path]):
    r = stepwatch("status", str(corpus["escapes"]))
    assert "␛]52;c;" in r.stdout and "RuntimeError: boom [/x]" in r.stdout, r.stdout


async def _open_in_tui(run_dir: Path) -> tuple[str, str]:
    from stepwatch.tui.app import StepwatchApp

    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not getattr(app.screen, "snap", None):
            await pilot.pause(0.05)
        await pilot.pause(1.2)  # a second refresh
        screen = app.screen
        banner = str(screen.query_one("#banner").render()) if screen.query("#banner") else ""
        log = "\n".join(str(line.text) for line in screen.query_one("#log").lines) if screen.query("#log") else ""
        assert app.is_running, f"{run_dir.name}: the app ended"
        return banner, log


def test_the_tui_opens_every_hostile_run(corpus: dict[str, Path]):
    for name, run_dir in corpus.items():
        banner, log = asyncio.run(_open_in_tui(run_dir))
        if name in ("markup", "escapes"):
            assert "boom [/x]" in banner or "recorded" in banner, (name, banner)
            assert "lr=[1e-05]" in log or "saving to [/data/ckpt-4]" in log, (name, log[-500:])
        if name == "escapes":
            assert "␛" in log and "\x1b" not in log and "\x1b" not in banner


def test_no_payload_reaches_the_terminal_of_a_real_attach(corpus: dict[str, Path]):
    from test_tui_pty import PtyApp

    app = PtyApp(corpus["escapes"])
    try:
        assert app.pump(lambda: "RuntimeError".encode() in app.out, 15), app.out[-2000:]
        app.pump(None, 1.5)
        for p in PAYLOADS:
            assert p not in app.out, p
        os.write(app.master, b"q")
        assert app.pump(lambda: app.proc.poll() is not None, 10)
    finally:
        app.close()


def test_acknowledging_never_writes_through_a_symlink(corpus: dict[str, Path], tmp_path: Path):
    run_dir = corpus["acks-symlink"]
    obs = RunObserver(run_dir)
    snap = obs.refresh()
    assert snap["alerts"], snap["alerts"]
    why = obs.acknowledge([a["id"] for a in snap["alerts"]])
    assert why and "acknowledged for this session only" in why
    assert (tmp_path / "outside" / "precious.txt").read_text() == "precious\n"
    assert all(a["acknowledged"] for a in obs.refresh()["alerts"])


def test_a_fifo_never_hangs_a_view(corpus: dict[str, Path]):
    """A FIFO in place of run.json, exit.json, acks.jsonl or events.jsonl: a bounded answer."""
    for name in ("fifo-run-json", "fifo-exit-json", "fifo-acks", "fifo-events"):
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(corpus[name]), "--json"],
                           capture_output=True, text=True, timeout=20)
        assert time.monotonic() - t0 < 15 and "Traceback" not in p.stderr, (name, p.stderr[-2000:])
