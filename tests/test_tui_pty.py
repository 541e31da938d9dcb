"""The real app in a real pseudo-terminal: hostile input bytes, quitting, and a hangup (issue 6, Over SSH)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.watchdog import ProcessRef, probe

LEGACY_MOUSE = b"\x1b[M\xff\xff\xff\x1b[M \xc8\xc8\x1b[M#\x80\x80"  # X10 mouse, coordinates > 0x7F


class PtyApp:
    """``stepwatch attach RUN`` on a fresh 80x24 pty, its output collected."""

    def __init__(self, run_dir: Path, **env_extra: str):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", LANG="C.UTF-8")
        env.pop("COLORTERM", None)
        env.pop("NO_COLOR", None)
        env.update(env_extra)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepwatch.tui.cli", "attach", str(run_dir)], stdin=slave, stdout=slave, stderr=slave,
            env=env, close_fds=True, cwd=REPO_ROOT,
            preexec_fn=lambda: (os.setsid(), fcntl.ioctl(0, termios.TIOCSCTTY, 0)))
        os.close(slave)
        self.out = b""

    def pump(self, until=None, timeout_s: float = 10.0) -> bool:
        """Read the app's output until ``until()`` holds or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        eof = False
        while time.monotonic() < deadline:
            if until is not None and until():
                return True
            if eof:  # the app closed the terminal (EIO): it is exiting; keep checking until()
                time.sleep(0.02)
                continue
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:
                    eof = True
        return bool(until and until())

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


@pytest.fixture
def static_run(tmp_path: Path) -> Path:
    dst = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill", dst)
    return dst


def test_legacy_mouse_bytes_above_0x7f_do_not_crash_and_q_restores_the_terminal(static_run: Path):
    app = PtyApp(static_run)
    try:
        assert app.pump(lambda: b"ended-sigkill" in app.out), app.out[-500:]
        os.write(app.master, LEGACY_MOUSE)
        app.pump(timeout_s=1.5)
        assert app.proc.poll() is None, app.out[-800:]
        assert b"UnicodeDecodeError" not in app.out
        os.write(app.master, b"q")
        assert app.pump(lambda: app.proc.poll() is not None, 10), "the app did not quit on q"
        app.pump(timeout_s=0.3)
        assert app.proc.returncode == 0
        tail = app.out[-2000:]
        assert b"\x1b[?1049l" in tail  # left the alternate screen
        assert b"\x1b[?1000l" in tail  # mouse reporting off
        assert b"\x1b[?25h" in tail  # cursor shown again
    finally:
        app.close()


def test_hangup_ends_the_app_and_never_the_run(repo: Path):
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "tick.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    ref = ProcessRef.from_json(wait_until(lambda: (read_json(run_dir / "run.json") or {}).get("process"), 10))
    app = PtyApp(run_dir)
    try:
        assert app.pump(lambda: b"RUNNING" in app.out), app.out[-500:]
        os.killpg(app.proc.pid, signal.SIGHUP)  # what an SSH drop delivers to the terminal's session
        assert app.pump(lambda: app.proc.poll() is not None, 10), "the app kept running after SIGHUP"
        assert probe(ref) == "alive"
    finally:
        app.close()


def _hued_256_codes(out: bytes) -> set[int]:
    """256-colour codes (fg or bg) that are not a grey (grey ramp, or an r=g=b cube entry)."""
    def grey(c: int) -> bool:
        if c >= 232:
            return True
        if 16 <= c <= 231:
            c -= 16
            return c // 36 == c // 6 % 6 == c % 6
        return c in (0, 7, 8, 15)
    codes = {int(c) for c in re.findall(rb"[34]8;5;(\d+)", out)}
    return {c for c in codes if not grey(c)}


def test_no_color_is_honoured_and_a_16_colour_terminal_gets_no_256_colour_codes(static_run: Path):
    seen = {}
    for label, extra in (("default", {}), ("NO_COLOR", {"NO_COLOR": "1"}), ("xterm", {"TERM": "xterm"})):
        app = PtyApp(static_run, **extra)
        try:
            assert app.pump(lambda: b"ended-sigkill" in app.out), (label, app.out[-300:])
            app.pump(timeout_s=1.0)
            seen[label] = app.out
        finally:
            app.close()
    assert _hued_256_codes(seen["default"])  # the check can see colour at all
    assert _hued_256_codes(seen["NO_COLOR"]) == set()  # monochrome: greys only
    assert re.search(rb"[34]8;5;", seen["xterm"]) is None  # a plain xterm gets no 256-colour codes


def test_two_tuis_attached_and_the_alerts_command_runs_once_per_alert(tmp_path: Path):
    """Two operators attached to one run (two real `stepwatch attach` in ptys): the run dies, both
    screens show it, and the [alerts] command ran once, by the supervisor, not once per screen."""
    from conftest import git, make_repo

    out = tmp_path / "pings.txt"
    repo = make_repo(tmp_path / "harness", {
        "gate.py": "import os, sys, time\nprint('waiting', flush=True)\n"
                   "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\nsys.exit(3)\n",
        "ping.py": "import os, sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(os.environ['STEPWATCH_ALERT_ID'] + '\\n')\n"})
    go = tmp_path / "go"
    (repo / "run.toml").write_text(
        f'name = "two"\ncommand = ["{sys.executable}", "gate.py", "{go}"]\n'
        f'[alerts]\ncommand = ["{sys.executable}", "{repo / "ping.py"}", "{out}"]\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "config")
    r = stepwatch("launch", "--no-tui", "run.toml", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "two"
    apps = [PtyApp(run_dir), PtyApp(run_dir)]
    try:
        for app in apps:
            assert app.pump(lambda a=app: b"RUNNING" in a.out, 15), app.out[-2000:]
        go.touch()
        for app in apps:
            assert app.pump(lambda a=app: b"EXITED 3" in a.out, 15), app.out[-2000:]
        wait_until(lambda: out.exists(), 10, what="the alert command")
        # the supervisor has exited (it waits for its deliveries): nothing more can come
        sup = ProcessRef.from_json(read_json(run_dir / "run.json")["supervisor"])
        wait_until(lambda: probe(sup) != "alive", 20, what="the supervisor to exit")
        assert out.read_text().splitlines() == ["a1-watchdog-end"]
    finally:
        for app in apps:
            app.close()
