"""Hostile run dirs: every view opens each one of tests/fixtures/hostile_runs.py's corpus without
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

from conftest import hostile_runs, stepwatch
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.tui.safe import SafeWriter, safe_text, visible

#: a raw control byte in what a headless command printed (newline and tab are layout)
ESCAPES, PAYLOADS = hostile_runs().ESCAPES, hostile_runs().PAYLOADS
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    return hostile_runs().make_hostile_runs(tmp_path / "runs", tmp_path / "outside")


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


HEADLESS = [("status",), ("status", "--json"), ("watch", "--plain"), ("watch", "--json"), ("export",)]


@pytest.mark.system
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


@pytest.mark.system
def test_the_escapes_run_shows_its_text_visibly_in_status(corpus: dict[str, Path]):
    r = stepwatch("status", str(corpus["escapes"]))
    assert "␛]52;c;" in r.stdout and "RuntimeError: boom [/x]" in r.stdout, r.stdout


async def _open_in_tui(run_dir: Path) -> tuple[str, str]:
    from stepwatch.tui.app import StepwatchApp

    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and getattr(app.screen, "snap", {"run_dir": None})["run_dir"] is None:
            await pilot.pause(0.05)
        await pilot.pause(1.2)  # a second refresh
        screen = app.screen
        banner = str(screen.query_one("#banner").render()) if screen.query("#banner") else ""
        log = "\n".join(str(line.text) for line in screen.query_one("#log").lines) if screen.query("#log") else ""
        assert app.is_running, f"{run_dir.name}: the app ended"
        return banner, log


@pytest.mark.system
def test_the_tui_opens_every_hostile_run(corpus: dict[str, Path]):
    for name, run_dir in corpus.items():
        banner, log = asyncio.run(_open_in_tui(run_dir))
        if name in ("markup", "escapes"):
            assert "boom [/x]" in banner or "recorded" in banner, (name, banner)
            assert "lr=[1e-05]" in log or "saving to [/data/ckpt-4]" in log, (name, log[-500:])
        if name == "escapes":
            assert "␛" in log and "\x1b" not in log and "\x1b" not in banner


@pytest.mark.system
def test_no_payload_reaches_the_terminal_of_a_real_attach(corpus: dict[str, Path]):
    from test_tui_pty import PtyApp

    app = PtyApp(corpus["escapes"])
    try:
        assert app.pump(lambda: b"RuntimeError" in app.out, 15), app.out[-2000:]
        app.pump(None, 1.5)
        for p in PAYLOADS:
            assert p not in app.out, p
        os.write(app.master, b"q")
        assert app.pump(lambda: app.proc.poll() is not None, 10)
    finally:
        app.close()


def _pty_shows_no_payload(app, what: str, ready: bytes) -> None:
    try:
        assert app.pump(lambda: ready in app.out or app.proc.poll() is not None, 15), (what, app.out[-2000:])
        if ready not in app.out:  # refused before drawing (a FIFO run.json is no run): said so, plainly
            app.pump(None, 0.3)
            assert app.proc.returncode == 2 and b"not a regular file" in app.out, (what, app.out[-1000:])
            assert not RAW_CONTROL.search(app.out.decode("utf-8", "replace").replace("\r", "")), what
            return
        app.pump(None, 1.5)  # a refresh or two
        assert app.proc.poll() is None, (what, "the app ended", app.out[-2000:])
        for p in PAYLOADS:
            assert p not in app.out, (what, p)
        assert b"textual/" not in app.out and b"stepwatch/tui/" not in app.out, what  # no crash report
        os.write(app.master, b"q")
        assert app.pump(lambda: app.proc.poll() is not None, 10), what
        assert app.proc.returncode == 0, (what, app.out[-1000:])
    finally:
        app.close()


@pytest.mark.slow
def test_every_hostile_run_in_a_real_terminal_and_the_home_list_of_all(corpus: dict[str, Path], tmp_path: Path):
    """Every dir of the corpus attached in a real pty, and the home list of the whole corpus: no
    crash, no payload byte reaches the terminal, q ends it."""
    from test_tui_pty import PtyApp

    for name, run_dir in corpus.items():
        _pty_shows_no_payload(PtyApp(run_dir), name, b"\x1b[?1049h")
    _pty_shows_no_payload(PtyApp(None, "--runs-dir", str(tmp_path / "runs"), home=True), "home", b"crafted-pids")


def test_acknowledging_never_writes_through_a_symlink(corpus: dict[str, Path], tmp_path: Path):
    run_dir = corpus["acks-symlink"]
    obs = RunObserver(run_dir)
    snap = obs.refresh()
    assert snap["alerts"], snap["alerts"]
    why = obs.acknowledge([a["id"] for a in snap["alerts"]])
    assert why and "acknowledged for this session only" in why
    assert (tmp_path / "outside" / "precious.txt").read_text() == "precious\n"
    assert all(a["acknowledged"] for a in obs.refresh()["alerts"])


@pytest.mark.system
def test_a_fifo_never_hangs_a_view(corpus: dict[str, Path]):
    """A FIFO in place of run.json, exit.json, acks.jsonl or events.jsonl: a bounded answer."""
    for name in ("fifo-run-json", "fifo-exit-json", "fifo-acks", "fifo-events"):
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(corpus[name]), "--json"],
                           capture_output=True, text=True, timeout=20)
        assert time.monotonic() - t0 < 15 and "Traceback" not in p.stderr, (name, p.stderr[-2000:])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a run dir to another uid (CI runs as root)")
def test_a_bare_attach_prefers_the_viewers_own_runs_over_another_users_bait(tmp_path: Path, capsys):
    import argparse

    _run_json, _write = hostile_runs()._run_json, hostile_runs()._write
    from stepwatch.tui.cli import _newest

    runs = tmp_path / "runs"
    mine = runs / "mine"
    mine.mkdir(parents=True)
    _write(mine, "run.json", _run_json("mine"))
    bait = runs / "bait"
    bait.mkdir()
    _write(bait, "run.json", _run_json("bait", launched_at_unix=1e300))  # "newest", and another user's
    for p in (bait, bait / "run.json"):
        os.chown(p, 12345, 12345)
    args = argparse.Namespace(runs_dir=str(runs))
    assert _newest(args) == mine
    # with none of the viewer's own, another user's run is picked and the viewer is told whose
    import shutil
    shutil.rmtree(mine)
    assert _newest(args) == bait
    err = capsys.readouterr().err
    assert "none of the runs" in err and "uid 12345" in err, err


@pytest.mark.system
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a second user (CI runs as root)")
def test_a_second_user_viewing_a_run_reads_it_writes_nothing_and_runs_nothing():
    """A real second user (uid 65534, nobody): a forked child drops to it and views root's run
    with the views' own code. Reads work; acknowledging cannot write (it holds for the session
    only); the run's [alerts] command is not run by the viewer."""
    import json as _json
    import shutil
    import tempfile

    from conftest import git, make_repo, wait_until
    from stepwatch.monitors.runfiles import read_json
    from stepwatch.tui.plain import status_lines

    base = Path(tempfile.mkdtemp(prefix="stepwatch-second-user-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        pings = base / "pings.txt"
        repo = make_repo(base / "harness", {
            "crash.py": "import sys\nprint('failing', flush=True)\nsys.exit(3)\n",
            "ping.py": "import os, sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(str(os.getuid()) + '\\n')\n"})
        (repo / "run.toml").write_text(f'name = "owned"\ncommand = ["{sys.executable}", "crash.py"]\n'
                                       f'[alerts]\ncommand = ["{sys.executable}", "{repo / "ping.py"}", "{pings}"]\n')
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "config")
        r = stepwatch("launch", "--no-tui", "run.toml", cwd=repo)
        assert r.returncode == 0, r.stderr
        run_dir = repo / "runs" / "owned"
        sup = read_json(wait_until(lambda: read_json(run_dir / "exit.json") and run_dir / "run.json", 20, what="the end"))
        wait_until(lambda: pings.exists(), 10, what="the owner's supervisor delivering")
        from stepwatch.monitors.watchdog import ProcessRef, probe
        wait_until(lambda: probe(ProcessRef.from_json(sup["supervisor"])) != "alive", 60, what="the supervisor's exit")
        for p in [base, *base.rglob("*")]:
            if p.is_dir():
                os.chmod(p, 0o755)
        before = pings.read_text()
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the second user
            try:
                os.close(rfd)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                obs = RunObserver(run_dir)
                snap = obs.refresh()
                lines = status_lines(snap)
                why = obs.acknowledge([a["id"] for a in snap["alerts"]])
                again = obs.refresh()
                out = {"state": snap["state"], "returncode": snap["returncode"], "alerts": [a["kind"] for a in snap["alerts"]],
                       "why": why, "acked": [a["acknowledged"] for a in again["alerts"]], "lines": len(lines),
                       "uid": os.getuid()}
                os.write(wfd, _json.dumps(out).encode())
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                os.write(wfd, _json.dumps({"error": repr(e)}).encode())
            finally:
                os._exit(0)
        os.close(wfd)
        data = b""
        while chunk := os.read(rfd, 65536):
            data += chunk
        os.waitpid(pid, 0)
        got = _json.loads(data)
        assert "error" not in got, got
        assert got["uid"] == 65534 and got["state"] == "exited" and got["returncode"] == 3
        assert got["alerts"] == ["watchdog"] and got["lines"] > 3
        assert got["why"] and "session only" in got["why"] and got["acked"] == [True]
        assert not (run_dir / "acks.jsonl").exists()
        assert pings.read_text() == before == "0\n"  # the owner's supervisor ran it, once; the viewer never
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _harness(tmp_path: Path) -> Path:
    from conftest import make_repo

    return make_repo(tmp_path / "harness", {"ok.py": "print('ok')\n"})


@pytest.mark.system
def test_a_launch_refuses_a_run_dir_that_is_a_symlink(tmp_path: Path):
    repo = _harness(tmp_path)
    (repo / "runs").mkdir()
    (tmp_path / "private").mkdir()
    os.symlink(tmp_path / "private", repo / "runs" / "r")
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "ok.py", cwd=repo)
    assert r.returncode == 1 and "is a symlink" in r.stderr, r.stderr
    assert list((tmp_path / "private").iterdir()) == []


@pytest.mark.system
def test_a_launch_refuses_a_runs_dir_anyone_may_write_without_the_sticky_bit(tmp_path: Path):
    repo = _harness(tmp_path)
    shared = tmp_path / "shared-runs"
    shared.mkdir()
    os.chmod(shared, 0o777)
    r = stepwatch("launch", "--no-tui", "--name", "r", "--runs-dir", str(shared), "--", sys.executable, "ok.py", cwd=repo)
    assert r.returncode == 1 and "no sticky bit" in r.stderr, r.stderr
    os.chmod(shared, 0o1777)  # /tmp-like: each user's entries are their own
    r = stepwatch("launch", "--no-tui", "--name", "r", "--runs-dir", str(shared), "--", sys.executable, "ok.py", cwd=repo)
    assert r.returncode == 0, r.stderr


@pytest.mark.system
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a run dir to another uid (CI runs as root)")
def test_a_launch_refuses_another_users_run_dir(tmp_path: Path):
    repo = _harness(tmp_path)
    theirs = repo / "runs" / "r"
    theirs.mkdir(parents=True)
    os.chown(theirs, 12345, 12345)
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "ok.py", cwd=repo)
    assert r.returncode == 1 and "belongs to uid 12345" in r.stderr, r.stderr
    assert list(theirs.iterdir()) == []


@pytest.mark.system
def test_a_launch_never_opens_its_lock_through_a_symlink(tmp_path: Path):
    """A symlink put where the launch lock goes: the launch refuses, saying so, and the file the link
    names is neither created nor touched."""
    repo = _harness(tmp_path)
    (repo / "runs").mkdir()
    target = tmp_path / "elsewhere" / "root-created"
    target.parent.mkdir()
    os.symlink(target, repo / "runs" / ".r.launch.lock")
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "ok.py", cwd=repo)
    assert r.returncode == 1 and ".r.launch.lock is a symlink" in r.stderr, r.stderr
    assert not target.exists() and not (repo / "runs" / "r").exists()


def _lock_refusal(tmp_path: Path) -> str | None:
    """What entering the launch lock of run ``r`` under ``tmp_path/runs`` refused with, or None."""
    from stepwatch.launcher.config import RunConfig
    from stepwatch.launcher.launch import LaunchRefused, _launch_lock

    cfg = RunConfig(name="r", command=["true"], cwd=tmp_path, runs_dir=tmp_path / "runs")
    try:
        with _launch_lock(cfg):
            return None
    except LaunchRefused as e:
        return str(e)


def test_a_launch_lock_that_is_a_directory_or_no_regular_file_is_named_not_the_runs_dir(tmp_path: Path):
    """EISDIR opening ``.r.launch.lock`` said "cannot use the runs dir X: Is a directory", blaming the runs
    dir: the lock is named, and what it is. A FIFO opens (O_RDWR) but is refused on its descriptor."""
    lock = tmp_path / "runs" / ".r.launch.lock"
    lock.mkdir(parents=True)
    why = _lock_refusal(tmp_path)
    assert why is not None and why.startswith(f"REFUSING: the launch lock {lock} is a directory"), why
    assert "cannot use the runs dir" not in why
    lock.rmdir()
    os.mkfifo(lock)
    why = _lock_refusal(tmp_path)
    assert why is not None and f"the launch lock {lock} is not a regular file (mode p" in why, why
    lock.unlink()
    assert _lock_refusal(tmp_path) is None and lock.is_file()  # positive control: the user's own lock


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a lock file to another uid (CI runs as root)")
def test_a_launch_lock_of_another_user_is_refused_before_it_is_locked(tmp_path: Path, monkeypatch):
    """Root opens another user's lock file anyway, and that user could hold it and block every launch
    of the name: the descriptor's owner is checked (fstat) before flock. A non-root user's EACCES says
    the same from an lstat, never "cannot use the runs dir"."""
    import fcntl as fcntl_mod

    lock = tmp_path / "runs" / ".r.launch.lock"
    lock.parent.mkdir()
    lock.write_text("")
    os.chown(lock, 65534, 65534)
    locked: list[int] = []
    monkeypatch.setattr(fcntl_mod, "flock", lambda fd, op: locked.append(fd))
    why = _lock_refusal(tmp_path)
    assert why is not None and f"the launch lock {lock} belongs to uid 65534, not to you (uid 0)" in why, why
    assert locked == []  # refused before flock
    monkeypatch.undo()
    from stepwatch.launcher.launch import _lock_problem

    why = _lock_problem(lock, PermissionError(13, "Permission denied"))  # a non-root user's open: EACCES
    assert why is not None and "belongs to uid 65534" in why, why
    os.chown(lock, 0, 0)
    assert _lock_refusal(tmp_path) is None  # positive control: root's own lock


def test_a_symlink_in_the_runs_dir_is_never_listed_as_a_run(tmp_path: Path, monkeypatch, capsys):
    """``runs``, the home list and a bare ``attach`` (all monitors/rundirs.py list_runs): an entry
    that is a symlink, to a run dir elsewhere (another user's, say) or to nothing, is no run."""
    from stepwatch.monitors.rundirs import list_runs
    from stepwatch.tui.cli import _newest, main

    _run_json, _write = hostile_runs()._run_json, hostile_runs()._write
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    (runs / "mine").mkdir(parents=True)
    _write(runs / "mine", "run.json", _run_json("mine"))
    (elsewhere / "theirs").mkdir(parents=True)
    _write(elsewhere / "theirs", "run.json", _run_json("theirs", launched_at_unix=1e300))  # would sort first
    os.symlink(elsewhere / "theirs", runs / "link")
    os.symlink(elsewhere / "gone", runs / "dangling")
    assert list_runs(runs) == [runs / "mine"]
    import argparse
    assert _newest(argparse.Namespace(runs_dir=str(runs))) == runs / "mine"
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main() wraps both streams: put back what capsys set
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    assert main(["runs", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "mine" in out and "link" not in out and "theirs" not in out and "dangling" not in out, out
    os.unlink(runs / "link")
    (runs / "mine").rename(elsewhere / "mine")
    os.symlink(elsewhere / "mine", runs / "mine")  # even to the viewer's own run dir: not followed
    assert list_runs(runs) == []


def test_a_runs_dir_that_is_a_symlink_loop_or_a_link_to_nothing_is_one_line_not_a_traceback(
        tmp_path: Path, monkeypatch, capsys):
    """``ln -s runs5 runs5`` as the runs dir (Python 3.11's Path.resolve raises RuntimeError("Symlink
    loop")): launch, runs, status, preflight and the rest refuse in one line, exit 2. A symlink to
    nothing as the runs dir is refused too: a launch would create the directory the link names."""
    from stepwatch.tui.cli import main

    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main() wraps both streams: put back what capsys set
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    repo = _harness(tmp_path)
    monkeypatch.chdir(repo)
    loop, dangling, nowhere = repo / "runs5", repo / "dangling", tmp_path / "nowhere"
    os.symlink("runs5", loop)
    os.symlink(nowhere, dangling)
    cfg = repo / "run.toml"
    cfg.write_text('name = "r"\ncommand = ["python3", "ok.py"]\nruns_dir = "runs5"\n')
    launch = ["launch", "--no-tui", "--name", "r", "--", sys.executable, "ok.py"]
    for argv in (["runs"], ["status"], ["status", "r"], ["watch", "r"], ["stop", "r"], ["relaunch", "r"], ["attach"],
                 ["preflight", str(cfg)], launch):
        assert main([argv[0], "--runs-dir", "runs5", *argv[1:]]) == 2, argv
        out, err = capsys.readouterr()
        assert err.splitlines() == [f"stepwatch: the runs dir {loop} is a symlink loop: it names no directory. "
                                    "Give another with --runs-dir DIR (or runs_dir in the config)."], (argv, err)
    for argv in (["preflight", str(cfg)], ["launch", "--no-tui", str(cfg)]):  # the config's own runs_dir
        assert main(argv) == 2, argv
        assert f"{cfg}: the runs dir {loop} is a symlink loop" in capsys.readouterr().err, argv
    monkeypatch.setenv("STEPWATCH_RUNS_DIR", "runs5")
    assert main(["runs"]) == 2 and "is a symlink loop" in capsys.readouterr().err
    monkeypatch.delenv("STEPWATCH_RUNS_DIR")
    for argv in (launch, ["runs"]):
        assert main([argv[0], "--runs-dir", "dangling", *argv[1:]]) == 2, argv
        err = capsys.readouterr().err
        assert err.splitlines() == [f"stepwatch: the runs dir {dangling} is a symlink to {nowhere}, which does not exist: "
                                    "nothing is created where a link points. Create the target, remove the link, "
                                    "or give another with --runs-dir DIR."], (argv, err)
    assert main([launch[0], "--runs-dir", "dangling/deeper", *launch[1:]]) == 2
    assert f"({dangling} on its way) is a symlink to {nowhere}" in capsys.readouterr().err
    assert not nowhere.exists()
    assert main(["status", str(loop)]) == 2  # a RUN that is a loop: named, not resolved
    assert "no run" in capsys.readouterr().err


@pytest.mark.system
def test_the_cli_refuses_a_runs_dir_that_is_a_symlink_loop_or_dangles_without_a_traceback(tmp_path: Path):
    """The same through the real entry point (``python -m stepwatch.tui.cli``): no traceback."""
    repo = _harness(tmp_path)
    os.symlink("runs5", repo / "runs5")
    os.symlink(tmp_path / "nowhere", repo / "dangling")
    for rd, words in (("runs5", f"the runs dir {repo / 'runs5'} is a symlink loop"),
                      ("dangling", f"is a symlink to {tmp_path / 'nowhere'}, which does not exist")):
        for argv in (("launch", "--no-tui", "--runs-dir", rd, "--", sys.executable, "ok.py"),
                     ("runs", "--runs-dir", rd), ("status", "--runs-dir", rd)):
            r = stepwatch(*argv, cwd=repo)
            assert r.returncode == 2 and "Traceback" not in r.stderr and words in r.stderr, (argv, r.stderr)
            assert len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "nowhere").exists()


def test_a_line_nested_too_deep_in_acks_jsonl_is_skipped_not_a_crash(tmp_path: Path):
    """acks.jsonl (the one file views write, so any viewer with write access can add a line): a line
    nested 100,000 deep (json's RecursionError) is a corrupt line, not a view's traceback."""
    from stepwatch.monitors.snapshot.acks import read_acked

    _run_json, _write = hostile_runs()._run_json, hostile_runs()._write
    run_dir = tmp_path / "deep-acks"
    run_dir.mkdir()
    _write(run_dir, "run.json", _run_json("deep-acks"))
    _write(run_dir, "train.log", "x\n")
    (run_dir / "acks.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n" + '{"v": 1, "alert_id": "a1"}\n')
    assert read_acked(run_dir) == {"a1"}
    assert RunObserver(run_dir).refresh()["run"] == "deep-acks"


def test_runs_prints_one_row_per_run_whatever_its_run_json_holds(tmp_path: Path, monkeypatch, capsys):
    """``stepwatch runs``: a name with a line break prints one row (the break shown), and a launch
    time or attempt that is an object, not a string, is no crash of the column's format."""
    from stepwatch.tui.cli import main

    _run_json, _write = hostile_runs()._run_json, hostile_runs()._write
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    _write(runs / "a", "run.json", _run_json("a\nb  1 exited  1 FAKE ROW", launched_at="2026\r\nFAKE"))
    (runs / "b").mkdir()
    _write(runs / "b", "run.json", _run_json("b", attempt={"x": 1}, launched_at={"x": 1}))
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main() wraps both streams: put back what capsys set
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    assert main(["runs", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    rows = out.splitlines()
    assert len(rows) == 3 and rows[0].startswith("NAME"), out  # the header and one row per run
    assert any(r.startswith("a\u240ab  1 exited") and "2026\u240d\u240aFAKE" in r for r in rows), out
