"""The real app in a real pseudo-terminal: hostile input bytes, quitting, and a hangup (a dropped SSH session)."""

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

    def __init__(self, run_dir: Path | None, *args: str, home: bool = False, **env_extra: str):
        """``attach [RUN_DIR] ARGS``; with ``home``, ``stepwatch ARGS`` (the home list)."""
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", LANG="C.UTF-8")
        env.pop("COLORTERM", None)
        env.pop("NO_COLOR", None)
        env.update(env_extra)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepwatch.tui.cli", *([] if home else ["attach"]), *([str(run_dir)] if run_dir else []),
             *args], stdin=slave, stdout=slave, stderr=slave,
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


def _write_big_cold_run(run_dir: Path, steps: int) -> None:
    """An ended run with ``steps`` step events and no saved state: its first read folds every line
    (about 5 s for a million on this machine's cores)."""
    from stepwatch.monitors.runfiles import write_json_atomic

    run_dir.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    t0 = 1_780_000_000.0
    with open(run_dir / "events.jsonl", "w") as f:
        f.write('{"v":1,"kind":"run_start","t":%r,"step":null,"rank":0,"world_size":1}\n' % t0)
        for lo in range(1, steps + 1, 100_000):
            f.write("".join('{"v":1,"kind":"step","t":%r,"step":%d,"rank":0,"dt":0.5,"step_begin":%r,"step_end":%r,'
                            '"flags":[]}\n' % (t0 + s / 2, s, t0 + s / 2 - 0.5, t0 + s / 2)
                            for s in range(lo, min(lo + 100_000, steps + 1))))
    (run_dir / "train.log").write_text("step 1\n")
    gone = {"pid": dead.pid, "create_time": 1.0}
    write_json_atomic(run_dir / "run.json", {"v": 1, "name": run_dir.name, "attempt": 1, "argv": ["python"],
                                             "cwd": str(run_dir), "launched_at_unix": t0, "supervisor": gone,
                                             "process": {**gone, "pgid": dead.pid}})
    write_json_atomic(run_dir / "exit.json", {"returncode": 0, "ended_at_unix": t0 + steps, "duration_s": steps})


@pytest.fixture(scope="module")
def big_cold_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("big") / "runs" / "big"
    _write_big_cold_run(run_dir, 1_000_000)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("how", ["q", "SIGHUP", "SIGTERM", "SIGINT", "home q", "bare attach q"])
def test_leaving_during_a_cold_attach_of_a_big_run_ends_the_process_within_a_second(big_cold_run: Path, how: str):
    """Quit (q, on the run screen or the home list), a hangup, SIGTERM or SIGINT while a worker is
    still folding a million events: the process is gone within a second, the terminal restored
    (alternate screen left, mouse reporting off, cursor shown) and the reason printed."""
    app = (PtyApp(None, "--runs-dir", str(big_cold_run.parent), home=how.startswith("home"))
           if how in ("home q", "bare attach q") else PtyApp(big_cold_run))
    try:
        assert app.pump(lambda: b"\x1b[?1049h" in app.out and len(app.out) > 1500, 15), app.out[-500:]
        app.pump(timeout_s=0.5)  # the first read is under way (it takes seconds)
        t0 = time.monotonic()
        if how.endswith("q"):
            os.write(app.master, b"q")
        else:
            os.killpg(app.proc.pid, getattr(signal, how))
        assert app.pump(lambda: app.proc.poll() is not None, 15), "the app kept running"
        took_s = time.monotonic() - t0
        app.pump(timeout_s=0.2)
        assert took_s < 1.0, f"{how}: the process took {took_s:.2f} s to end"
        assert app.proc.returncode == 0
        tail = app.out[-3000:]
        assert b"\x1b[?1049l" in tail and b"\x1b[?1000l" in tail and b"\x1b[?25h" in tail, tail[-300:]
        if how.startswith("SIG"):
            assert b"the run is untouched" in tail
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


@pytest.mark.parametrize("how", ["master closed", "unread then SIGHUP"])
def test_a_terminal_that_goes_away_ends_the_app_within_seconds(static_run: Path, how: str):
    """tmux's kill-server or an sshd that dies closes the pty's master (the kernel hangs up the
    session; every write then fails); a stalled link stops reading first (the app's writes fill the
    pty and block), then hangs up. Either way the app must end, not linger as an orphan."""
    app = PtyApp(static_run)
    try:
        assert app.pump(lambda: b"ended-sigkill" in app.out), app.out[-500:]
        if how == "master closed":
            os.close(app.master)
            app.master = os.open(os.devnull, os.O_RDONLY)  # for close()
        else:
            for _ in range(200):  # keys that redraw, never read back: the pty's buffer fills
                try:
                    os.write(app.master, b"\t")
                except OSError:
                    break
            time.sleep(1.0)
            os.killpg(app.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 8
        while app.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.proc.poll() is not None, f"the app outlived its terminal ({how})"
    finally:
        app.close()
