"""Shared test helpers: real git repos, the real CLI in a subprocess, waits with deadlines."""

from __future__ import annotations

import grp
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

#: The suite's guards on itself: no process left behind, a unit test over 2 s fails, wall time and load printed.
pytest_plugins = ["session_guards"]

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Real torch/transformers captures (tests/fixtures/real/README.md; re-capture: tools/capture_fixtures/capture.sh).
FIXTURES_REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def wait_until(cond: Callable[[], T | None], timeout_s: float = 10.0, interval_s: float = 0.02,
               what: str = "condition") -> T:
    """Poll ``cond`` until it returns a truthy value (returned, typed as ``cond`` returns it); fail
    the test after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


async def until(pilot, cond: Callable[[], T | None], timeout_s: float = 10.0, what: str = "condition") -> T:
    """:func:`wait_until` for a Textual app under Pilot: the app runs between the polls."""
    deadline = time.monotonic() + timeout_s
    while not (v := cond()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await pilot.pause(0.05)
    return v


def step_controls():
    """tests/fixtures/step_controls.py (the detector controls), loaded once by path."""
    return fixture_module("step_controls")


def hostile_runs():
    """tests/fixtures/hostile_runs.py: the builder of the hostile run-dir corpus."""
    return fixture_module("hostile_runs")


def fixture_module(stem: str):
    """``tests/fixtures/<stem>.py``, loaded once by path (the fixtures folder is no package)."""
    import importlib.util

    name = f"stepwatch_test_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "fixtures" / f"{stem}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` and return its stdout (raises on failure)."""
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A real git repo with one commit holding ``files`` and a .gitignore for runs/."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "test@example.com")
    git(path, "config", "user.name", "test")
    (path / ".gitignore").write_text("runs/\n")
    for name, text in (files or {}).items():
        p = path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def stepwatch(*args: str, cwd: Path | None = None, timeout: float = 60, env: dict | None = None,
              **kw) -> subprocess.CompletedProcess:
    """Run the real ``stepwatch`` CLI (``python -m stepwatch.tui.cli``) and capture its output."""
    e = dict(os.environ)
    e.pop("STEPWATCH_RUNS_DIR", None)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e, stdin=subprocess.DEVNULL, **kw)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A clean git repo holding a few tiny scripts a run can execute."""
    return make_repo(tmp_path / "harness", {
        "ok.py": "print('hello from the run')\n",
        "exit3.py": "import sys\nprint('about to fail')\nsys.exit(3)\n",
        "tick.py": "import time\nfor i in range(600):\n    print(f'tick {i}', flush=True)\n    time.sleep(1)\n",
        "crash.py": "print('step 1')\nraise RuntimeError('boom at step 2')\n",
        "sleep.py": "import time\ntime.sleep(600)\n",
    })


def _is_this_test_run(pid: int) -> bool:
    """``pid`` is pytest, its parent, or the id of pytest's process group (``setsid pytest``, a CI runner
    that makes pytest a group leader): SIGKILL to it, or killpg of it, would end the test run."""
    return pid in (os.getpid(), os.getppid(), os.getpgrp())  # killpg(pid) of pytest's own group


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's launches keep their owner's copies (launcher/trust.py) in a state dir of its own,
    inherited by every stepwatch it starts, not in the home of whoever runs the suite."""
    monkeypatch.setenv("STEPWATCH_STATE_DIR", str(tmp_path / ".stepwatch-state"))


@pytest.fixture(autouse=True)
def _reap_runs(tmp_path: Path, request: pytest.FixtureRequest):
    """After each test, SIGKILL every process group a run in tmp_path recorded and that still lives (its warden and
    keeper too), and, after a system test, scancel the Slurm job a run recorded."""
    yield
    may_hold_jobs = request.node.get_closest_marker("system") is not None
    from stepwatch.monitors.runfiles import read_json
    from stepwatch.monitors.watchdog import ProcessRef, is_alive

    # the owner's copies (launcher/trust.py) too: they name the supervisor when a test's member replaced run.json
    for rj in [*tmp_path.rglob("run*.json"), *(tmp_path / ".stepwatch-state").rglob("*.json")]:
        try:
            run = read_json(rj)  # never blocks: the hostile corpus has a FIFO run.json
        except OSError:
            continue
        if not isinstance(run, dict):
            continue
        job = (run.get("scheduler") or {}).get("job_id") if isinstance(run.get("scheduler"), dict) else None
        # a Slurm run's job: it would hold the test cluster. A unit test submits none (a run dir it
        # made names a job id of its own invention, and scancel waits ~9 s for a missing controller)
        if may_hold_jobs and isinstance(job, str) and job.isdigit():
            try:
                subprocess.run(["scancel", job], capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                pass
        # the warden and the keeper first (launcher/wardens.py): once the supervisor is gone they would page its loss
        wardens = w if isinstance(w := run.get("wardens"), list) else []
        for ref in [ProcessRef.from_json(w) for w in wardens]:
            if ref and ref.create_time is not None and not _is_this_test_run(ref.pid) and is_alive(ref):
                try:
                    os.kill(ref.pid, signal.SIGKILL)
                except OSError:
                    pass
        for key in ("process", "supervisor"):
            ref = ProcessRef.from_json(run.get(key))
            if ref and _is_this_test_run(ref.pid):
                continue  # a test recorded pytest itself as a run's process: never signal the test run
            if ref and is_alive(ref):
                try:
                    os.killpg(ref.pid, signal.SIGKILL) if key == "process" else os.kill(ref.pid, signal.SIGKILL)
                except OSError:
                    pass


# ---------------------------------------------------------------- golden files (tests/golden/)
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/ from what the code gives now (review the diff before committing)")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``golden(relpath, text)``: compare ``text`` with tests/golden/<relpath> (a text diff on a
    mismatch); with ``--update-golden`` write it there instead."""
    update = request.config.getoption("--update-golden")

    def check(relpath: str, text: str) -> None:
        path = Path(__file__).resolve().parent / "golden" / relpath
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"{path} is missing: run pytest with --update-golden and review the new file"
        want = path.read_text()
        if text != want:
            import difflib

            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                                f"golden/{relpath}", "now", n=2))
            lines = diff.splitlines(True)
            more = f"... and {len(lines) - 80} more diff lines\n" if len(lines) > 80 else ""
            raise AssertionError(f"{relpath} differs from its golden file (pytest --update-golden rewrites it):\n"
                                 + "".join(lines[:80]) + more)

    return check


# ---------------------------------------------------------------- the two tiers (README: "Checks and the two tiers")
#: Test files whose every test drives real processes (the CLI in a subprocess, a launched run, a
#: supervisor), a pty, tmux, Slurm, Prometheus, real training or a wheel build, or waits on wall
#: time: the system tier, ``python -m pytest -q -m system``. Everything else is the unit tier,
#: ``python -m pytest -q -m "not system"``: in-process, no sleeps, under a minute on 2 cores (it may
#: call git to make a repo, or fork a probe, but never starts stepwatch itself). A mixed file marks
#: its own system tests with ``@pytest.mark.system``; a test marked ``slow`` is a system test too.
#: ``python -m pytest -q`` runs both.
SYSTEM_FILES = frozenset({
    "test_e2e.py", "test_full_disk.py", "test_identity_gate.py", "test_launcher.py", "test_logpanel.py",
    "test_prometheus.py", "test_ranks.py", "test_realvariants_live.py", "test_signals.py", "test_slurm.py",
    "test_supervisor_watch.py",
    "test_tmux.py", "test_tui.py", "test_tui_pty.py", "test_watch.py", "test_watchdog_identity.py",
})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SYSTEM_FILES or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.system)


#: A second Unix user whose only group is a team's (the shared runs dir's attacker; issue 30).
TEAM, MEMBER = "swteam", "swmember"
MEMBER_PY = "/usr/bin/python3"  # the member's own interpreter: the standard library is all it needs


#: The directories above the current test's tmp_path that the member must be able to traverse (set by ``shared``).
_MEMBER_PATHS: list[Path] = []


def as_member(member: tuple[int, int], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` (Python, the member's own interpreter) as the team's member, in the team's group only; it
    must succeed."""
    uid, gid = member
    for d in _MEMBER_PATHS:  # a pytest session started meanwhile (a checklist's suite) takes o+x off its basetemp
        try:
            d.chmod(d.stat().st_mode | 0o011)
        except OSError:
            pass

    def drop() -> None:
        os.setgroups([gid])
        os.setgid(gid)
        os.setuid(uid)

    r = subprocess.run([MEMBER_PY, "-c", code], preexec_fn=drop, capture_output=True, text=True, timeout=30,
                       cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return r


def wait_exit(run_dir: Path, timeout_s: float = 30) -> Any:
    """The run's exit.json, once it is there."""
    from stepwatch.monitors.runfiles import read_json

    return wait_until(lambda: read_json(run_dir / "exit.json"), timeout_s, what=f"exit.json in {run_dir}")


@pytest.fixture(scope="module")
def member() -> tuple[int, int]:
    """(uid, gid) of a second user whose only group is the team's (created once, as root)."""
    if os.geteuid() != 0:
        pytest.fail("these tests create a second Unix user: run them as root (CI does)")
    try:
        grp.getgrnam(TEAM)
    except KeyError:
        subprocess.run(["groupadd", TEAM], check=True)
    try:
        pwd.getpwnam(MEMBER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-N", "-g", TEAM, "-s", "/usr/sbin/nologin", MEMBER], check=True)
    return pwd.getpwnam(MEMBER).pw_uid, grp.getgrnam(TEAM).gr_gid


@pytest.fixture
def shared(tmp_path: Path, member: tuple[int, int]) -> Path:
    """The team's runs dir: setgid, sticky, group-writable, in a tmp_path the member may traverse (``as_member``
    makes sure of it again before each of the member's acts: an attack refused only because the member could not
    reach the file would be a pass that proves nothing)."""
    _MEMBER_PATHS.clear()
    for d in [tmp_path, *tmp_path.parents]:
        if d == Path("/tmp"):
            break
        _MEMBER_PATHS.append(d)
        d.chmod(d.stat().st_mode | 0o011)
    runs = tmp_path / "team-runs"
    runs.mkdir()
    os.chown(runs, 0, member[1])
    runs.chmod(0o3775)  # setgid + sticky: a launch refuses a group-writable runs dir without the sticky bit
    return runs
