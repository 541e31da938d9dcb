"""The suite's guards on itself, registered by tests/conftest.py:

- **No process a test started outlives the session.** A leaked process is a real cost (one that ignored
  SIGINT and SIGTERM slept 600 s after every CI run) and hides a bug of the test or of the product (a stop must
  leave nothing of the run's tree). At the session's end every process created since the session began is
  listed and kept when something ties it to this session: it is in the session's own cgroup (pytest moves
  itself at configure time into a new cgroup of cgroup v1's controller-less ``name=systemd`` hierarchy where
  the machine has one, as CI's does: no resource changes, and every process it starts stays in it whatever
  setsid, double fork or reparenting it does), it descends from pytest, its environment carries
  this session's mark (``STEPWATCH_TEST_SESSION``, set here, inherited by everything a test starts that does
  not replace its environment), its cwd or command line is under the session's tmp dir, or it shares a
  session (setsid) born during the test run with one of those. Those still alive after a short grace fail
  the session, by pid, command line and the test's tmp dir, and are SIGKILLed so that nothing stays.
  Ties are read from /proc, not from what tests recorded, so a test that forgot to record a process cannot
  hide it. Under pytest-xdist each worker checks its own and the controller fails the session for them.
- **A unit test's call phase over 2 s of wall time fails it** (a system test is exempt): the unit tier is
  the loop a contributor runs on every change and must stay under a minute; a test that needs longer is
  end-to-end and belongs to the system tier. On a machine busier than its cores (the 1-minute load average
  over the CPU count, above 1: another job, a CI run beside the suite) the 2 s stretch by that factor, so
  that the guard names slow tests, not a busy machine; the failure says both figures.
- **The unit tier runs on pytest-xdist workers**, one per core (at most 4), when it is asked for as README and
  .ci/run spell it (``-m "not system"``, no file or test named, no ``-n``) and xdist is installed (the test extra
  brings it): its tests are in-process and independent. Everything else stays serial: the system tier's tests
  have wall-clock budgets that a second busy worker would eat. ``-n 0`` runs the unit tier serially.
- **The terminal summary prints the session's wall time and the machine's load**, so that a slow run on a
  busy machine reads as such.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

#: Set in os.environ at configure time: every process a test starts inherits it unless the test replaces
#: the environment (then its session or its cwd still ties it to the test run).
MARK_ENV = "STEPWATCH_TEST_SESSION"
#: How long the processes found at the session's end have to exit by themselves (a warden noticing its
#: supervisor's end, a process reaped a moment ago) before they count as left behind.
GRACE_S = 3.0
#: The longest call phase a unit test may take, in seconds of wall time.
UNIT_TEST_LIMIT_S = 2.0

_started = {"wall": time.time(), "mono": time.monotonic(), "load": os.getloadavg()}
_token = f"{os.getpid()}-{time.time_ns()}"
#: cgroup v1's hierarchy without controllers: a cgroup of it only groups processes (systemd's tracking).
TRACKING_HIERARCHY = Path("/sys/fs/cgroup/systemd")
_leaks: list[str] = []  # this process's findings and, in an xdist controller, its workers'
_worker_pids: set[int] = set()
_cgroup: dict[str, Path] = {}  # "own": this session's tracking cgroup, "was": where pytest was before


def _enter_tracking_cgroup() -> None:
    """Move pytest into a new cgroup of :data:`TRACKING_HIERARCHY`, where every process it starts stays; nothing
    when the machine has no such hierarchy (then the other ties still hold)."""
    try:
        rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":", 2)[1] == "name=systemd")
        was = TRACKING_HIERARCHY / rel.lstrip("/")
        own = was / f"stepwatch-tests-{_token}"
        own.mkdir()
        (own / "cgroup.procs").write_text(str(os.getpid()))
    except (OSError, StopIteration, IndexError):
        return
    _cgroup.update(own=own, was=was)


def _leave_tracking_cgroup() -> None:
    if "own" in _cgroup:
        try:
            (_cgroup["was"] / "cgroup.procs").write_text(str(os.getpid()))
            for d in sorted((d for d in _cgroup["own"].rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                d.rmdir()  # an inner session's, left by a crash: emptied above
            _cgroup["own"].rmdir()
        except OSError:
            pass


def _in_tracking_cgroup() -> set[int]:
    """The processes in this session's cgroup and in those below it (an inner pytest's, left by a crash)."""
    pids: set[int] = set()
    for procs in (_cgroup["own"].rglob("cgroup.procs") if "own" in _cgroup else ()):
        try:
            pids.update(int(x) for x in procs.read_text().split())
        except OSError:
            pass
    return pids


def pytest_configure(config: pytest.Config) -> None:
    _started.update(wall=time.time(), mono=time.monotonic(), load=os.getloadavg())
    os.environ[MARK_ENV] = _token
    _enter_tracking_cgroup()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    rep = yield
    if (call.when == "call" and rep.passed and item.get_closest_marker("system") is None
            and call.duration > UNIT_TEST_LIMIT_S):
        busy = os.getloadavg()[0] / (os.cpu_count() or 1)
        if call.duration > UNIT_TEST_LIMIT_S * max(1.0, busy):
            rep.outcome = "failed"
            rep.longrepr = (f"{item.nodeid} is a unit test and its call took {call.duration:.2f} s, over the unit "
                            f"tier's {UNIT_TEST_LIMIT_S:g} s per test (x {max(1.0, busy):.2f}, the load per CPU; "
                            "tests/session_guards.py): make it smaller with the same controls, or, if it is "
                            "end-to-end, move it to the system tier")
    return rep


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns numprocesses into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    opt = config.option
    if not hasattr(opt, "numprocesses") or hasattr(config, "workerinput"):
        return  # xdist not installed or disabled (-p no:xdist), or this is a worker
    if (opt.numprocesses is not None or opt.dist != "no" or opt.collectonly or opt.usepdb
            or (opt.markexpr or "").strip() != "not system" or config.args_source == pytest.Config.ArgsSource.ARGS):
        return
    cores = len(os.sched_getaffinity(0))
    if cores > 1:
        opt.numprocesses = min(cores, 4)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node: Any) -> None:
    """xdist's controller: a worker is pytest too, never a leak of the controller (it ends after this check)."""
    try:
        _worker_pids.add(int(node.gateway._rinfo().pid))  # execnet caches it: xdist's reporter asked already
    except Exception:  # noqa: BLE001 - an execnet without it: the grace covers a worker still exiting
        pass


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: a worker's leaks fail the controller's session."""
    _leaks.extend(getattr(node, "workeroutput", {}).get("stepwatch_leaks", []))


def _basetemp(config: pytest.Config) -> Path | None:
    """The session's tmp dir (tmp_path's parent) when a test made one."""
    factory = getattr(config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    return Path(base) if base is not None else None


def _tied_processes(base: Path | None) -> dict[int, tuple[psutil.Process, str]]:
    """Live processes created since the session began that something ties to it (see the module's doc),
    each with the tie."""
    me = psutil.Process()
    ours = {me.pid, *(p.pid for p in me.parents()), *_worker_pids}
    descendants = {p.pid for p in me.children(recursive=True)}
    grouped = _in_tracking_cgroup()
    since = _started["wall"] - 1.0  # create times are whole boot seconds plus ticks
    base_s = f"{base}/" if base is not None else None  # the slash: pytest-12 is not pytest-123
    found: dict[int, tuple[psutil.Process, str]] = {}
    young: dict[int, tuple[psutil.Process, int]] = {}
    old_sids: set[int] = set()
    for p in psutil.process_iter():
        try:
            with p.oneshot():
                sid = os.getsid(p.pid)
                if p.create_time() < since:
                    old_sids.add(sid)
                    continue
                if p.pid in ours or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                young[p.pid] = (p, sid)
                if p.pid in grouped:
                    found[p.pid] = (p, f"in the session's cgroup {_cgroup['own'].name}")
                    continue
                if p.pid in descendants:
                    found[p.pid] = (p, "a descendant of pytest")
                    continue
                try:
                    if p.environ().get(MARK_ENV) == _token:
                        found[p.pid] = (p, f"its environment carries this session's {MARK_ENV}")
                        continue
                except (psutil.AccessDenied, OSError):
                    pass
                if base_s and (f"{p.cwd()}/".startswith(base_s) or any(base_s in a for a in p.cmdline())):
                    found[p.pid] = (p, "its cwd or command line is under the session's tmp dir")
        except (psutil.Error, OSError):
            continue
    # a session born during the test run that holds one of those holds only what a test started
    sids = {young[pid][1] for pid in found} - old_sids - {os.getsid(0)}
    for p, sid in young.values():
        if p.pid not in found and sid in sids:
            found[p.pid] = (p, f"it is in session {sid}, which a test's process is in")
    return found


def _describe(p: psutil.Process, why: str, base: Path | None) -> str:
    try:
        cmd = " ".join(p.cmdline()).replace("\n", "\\n")[:200] or p.name()
        cwd = p.cwd()
    except (psutil.Error, OSError):
        cmd, cwd = "?", "?"
    test_dir = ""
    if base is not None:
        for s in (f"{cwd}/", cmd):
            if f"{base}/" in s:
                rest = s.split(f"{base}/", 1)[1].split("/")
                test_dir = f"; the test's tmp dir {base / rest[0]}" if rest and rest[0] else ""
                break
    return f"pid {p.pid} ({why}): {cmd}{test_dir}"


def check_no_process_left(config: pytest.Config) -> list[str]:
    """The processes tied to this session still alive after :data:`GRACE_S`, described; each is SIGKILLed."""
    base = _basetemp(config)
    deadline = time.monotonic() + GRACE_S
    while (found := _tied_processes(base)) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [_describe(p, why, base) for p, why in found.values()]
    for p, _ in found.values():
        try:
            p.send_signal(signal.SIGKILL)  # psutil checks the create time: never a reused pid
        except (psutil.Error, OSError):
            pass
    _leave_tracking_cgroup()
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    mine = check_no_process_left(config)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller reports and fails the session
        workeroutput["stepwatch_leaks"] = mine
        return
    _leaks.extend(mine)
    if _leaks and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    tr = terminalreporter
    if _leaks:
        tr.section("processes left behind", sep="=", red=True, bold=True)
        tr.line(f"{len(_leaks)} process(es) a test started still ran {GRACE_S:g} s after the last test "
                "(now SIGKILLed); the session fails (tests/session_guards.py):", red=True)
        for line in _leaks:
            tr.line(f"  {line}")
    wall = time.monotonic() - _started["mono"]
    start, end = _started["load"], os.getloadavg()
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(getattr(config, "option", None), "numprocesses",
                                                                      None)
    tr.write_line(f"session: {wall:.1f} s wall on {os.cpu_count()} CPUs"
                  + (f", {workers} xdist workers" if workers else "")
                  + f"; load average (1, 5, 15 min) at start {start[0]:.2f} {start[1]:.2f} {start[2]:.2f},"
                  + f" at end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")
