"""The run screen inside a real tmux (TERM=tmux-256color) at 80x24 and 160x45, read back with
``tmux capture-pane`` as the operator's terminal shows it: the header, the whole banner
keys, the versions, the footer's keys; a fact cut at the edge ends in an ellipsis; the confirm
dialog's keys are in reverse video (a colour-only mark vanished under tmux-256color); ``d`` shows
every alert whole."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO_ROOT, stepwatch

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"
#: Characters of the plots (sparklines, the log title's rule): a row of them may fill the width.
PLOT_CHARS = set("▁▂▃▄▅▆▇█ ─·")


class TmuxPane:
    """``stepwatch attach RUN`` in a detached tmux session of its own server (socket in tmp)."""

    def __init__(self, tmp: Path, run_dir: Path, width: int, height: int):
        tmux = shutil.which("tmux")
        if tmux is None:
            why = "tmux is not installed (apt-get install tmux; .ci/run installs it)"
            if os.environ.get("CI"):
                pytest.fail(f"CI must run this in a real tmux: {why}")
            pytest.skip(why)
        self.base = [tmux, "-S", str(tmp / "tmux.sock"), "-f", "/dev/null"]
        # COLUMNS/LINES exported as a login shell may leave them: the pane's own size must win.
        cmd = (f"env TERM=tmux-256color LANG=C.UTF-8 COLUMNS=80 LINES=24 {sys.executable} -m stepwatch.tui.cli attach {run_dir}"
               f" --runs-dir {run_dir.parent}; sleep 60")
        subprocess.run([*self.base, "new-session", "-d", "-s", "sw", "-x", str(width), "-y", str(height), cmd],
                       check=True, timeout=10)
        self.width, self.height = width, height

    def text(self, escapes: bool = False) -> str:
        r = subprocess.run([*self.base, "capture-pane", "-p", "-t", "sw", *(["-e"] if escapes else [])],
                           capture_output=True, text=True, timeout=10)
        return r.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "sw", *keys], check=True, timeout=10)

    def wait_for(self, cond, timeout_s: float = 20.0, what: str = "the screen") -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            shown = self.text()
            if cond(shown):
                return shown
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s} s waiting for {what}; the pane:\n{shown}")
            time.sleep(0.1)

    def close(self) -> None:
        """Kill the tmux server (its ptys close, as when tmux or sshd dies) and require the app to end
        with it: an app that outlives its terminal is an orphan holding the run dir."""
        r = subprocess.run([*self.base, "list-panes", "-t", "sw", "-F", "#{pane_pid}"], capture_output=True, text=True,
                           timeout=10)
        apps = []
        for pid in r.stdout.split():
            try:
                apps += psutil.Process(int(pid)).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10)
        gone, alive = psutil.wait_procs(apps, timeout=8)
        for p in alive:
            p.kill()
        assert not alive, f"the app outlived its tmux server: {[p.pid for p in alive]}"


@pytest.fixture
def pane_at(tmp_path: Path):
    panes: list[TmuxPane] = []

    def start(width: int, height: int) -> tuple[TmuxPane, Path]:
        run_dir = tmp_path / "runs" / "ended-sigkill"
        shutil.copytree(STATIC_RUN, run_dir)
        panes.append(TmuxPane(tmp_path, run_dir, width, height))
        return panes[-1], run_dir

    yield start
    for p in panes:
        p.close()


def _reverse_video_runs(row: str) -> list[str]:
    """The texts a row of ``capture-pane -e`` shows in reverse video (SGR 7 until 27 or a reset)."""
    runs, on = [], False
    for i, part in enumerate(re.split(r"\x1b\[([0-9;]*)m", row)):
        if i % 2:  # an SGR's parameters
            codes = part.split(";") if part else ["0"]
            on = (on or "7" in codes) and not ({"0", "27"} & set(codes) and "7" not in codes)
        elif on and part:
            runs.append(part)
    return runs


@pytest.mark.parametrize("width,height", [(80, 24), (160, 45)])
def test_the_run_screen_in_tmux_shows_every_key_and_fact_whole_or_marked_cut(pane_at, width: int, height: int):
    pane, run_dir = pane_at(width, height)
    keys = ("r relaunch", "x stop", "a ack", "q quit", "l launch", "? help")
    # the log panel's title row drawn (not "log train.log" of the identity line, shown earlier) and the footer
    shown = pane.wait_for(lambda s: any(r.startswith("─train.log") for r in s.splitlines())
                          and all(k in s.splitlines()[-1] for k in keys),
                          what="the run screen with its log panel and every footer key on its last row")
    rows = shown.splitlines()
    assert rows[0].startswith(" ended-sigkill #1  KILLED SIGKILL  pid 2147483000"), rows[0]
    assert "ETA -" in rows[0]
    assert rows[1].startswith(" [a] acknowledge · [d] details · ALERT "), rows[1]
    assert "attention flex_attention (as requested)  torch 2.13.0+cpu  transformers 5.24.0" in shown
    assert "commit 35a4e8e00000 clean at launch  branch main  attempt 1  log train.log" in shown
    assert "unique graphs unknown" in shown  # not reported is not a dash
    assert len(rows) == height and len(next(r for r in rows if r.startswith("─train.log"))) == width  # drawn to the pane
    top = rows[:next(i for i, r in enumerate(rows) if r.startswith("─train.log"))]
    facts = top[next(i for i, r in enumerate(top) if r.startswith("n=")):]  # below the banner, which wraps
    for r in (r.rstrip() for r in facts):
        # A fact as wide as the screen is marked cut; a plot row may fill the width.
        assert len(r) < width or r.endswith("…") or set(r) <= PLOT_CHARS, r
    assert any(r.rstrip().endswith("…") for r in facts)  # the fallback's evidence is longer than 160 columns


@pytest.mark.parametrize("width,height", [(80, 24), (160, 45)])
def test_in_tmux_the_confirm_keys_are_in_reverse_video_and_d_shows_every_alert_whole(pane_at, width: int,
                                                                                      height: int):
    pane, run_dir = pane_at(width, height)
    pane.wait_for(lambda s: "? help" in s, what="the run screen")
    pane.keys("r")
    shown = pane.wait_for(lambda s: "yes (Enter)" in s, what="the relaunch confirmation")
    assert "Relaunch ended-sigkill?" in shown and "no (Esc)" in shown
    esc = pane.text(escapes=True)
    row = next(r for r in esc.splitlines() if "yes (Enter)" in r)
    reversed_keys = _reverse_video_runs(row)
    assert [k.strip() for k in reversed_keys][:2] == ["y", "n"], repr(row)
    assert not any("yes" in k for k in reversed_keys)  # control: only the keys, not the words, are reversed
    pane.keys("n")
    pane.wait_for(lambda s: "yes (Enter)" not in s, what="the dialog to close on n")
    pane.keys("d")
    r = stepwatch("status", str(run_dir), "--json")
    alerts = json.loads(r.stdout)["alerts"]
    assert len(alerts) >= 3, alerts
    shown = pane.wait_for(lambda s: "Esc closes" in s, what="the alert details")
    # the dialog's text: what lies between its left and right borders, row after row
    inner = [m.group(1) for m in (re.search(r"█(.*)█", r) for r in shown.splitlines()) if m]
    flat = " ".join(" ".join(inner).split())
    for a in alerts:
        assert " ".join(a["message"].split()[-3:]) in flat, (a["kind"], flat)
