"""The suite's guards on itself (tests/session_guards.py), each shown failing an inner pytest session that runs
this suite's conftest: a process a test leaves behind fails the session and is killed, however it hid; a unit test
over 2 s fails, a system test of the same length does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import REPO_ROOT, wait_until

pytestmark = pytest.mark.system  # each case is a whole pytest session in a subprocess

LEAKS = {
    # a child in a session of its own that ignores INT and TERM, as the stubborn worker of tests/test_launcher.py
    "a setsid child": '''
import signal, subprocess, sys
def test_it():
    p = subprocess.Popen([sys.executable, "-c", "import os, signal, time\\n"
                          "signal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                          f"open({PIDFILE!r}, 'w').write(str(os.getpid()))\\n"
                          "time.sleep(600)\\n"], start_new_session=True)
''',
    # a daemon: double fork and setsid, no environment, cwd /, nothing of the test's tmp dir: only the cgroup holds it
    "a daemon without a trace": '''
import subprocess, sys
def test_it():
    subprocess.run([sys.executable, "-c", "import os, time\\n"
                    "if os.fork(): os._exit(0)\\n"
                    "os.setsid()\\n"
                    "if os.fork(): os._exit(0)\\n"
                    f"open({PIDFILE!r}, 'w').write(str(os.getpid()))\\n"
                    "time.sleep(600)\\n"], env={}, cwd="/", check=True)
''',
}

CLEAN = '''
import os, subprocess, sys, time
import pytest

def over_the_limit():  # 2 s, stretched by the load per CPU as the guard stretches it, and a margin
    time.sleep(2.0 * max(1.0, os.getloadavg()[0] / os.cpu_count()) * 1.3 + 0.3)

def test_a_child_that_ends_with_the_test():
    subprocess.run([sys.executable, "-c", "print('done')"], check=True)

def test_a_unit_test_over_2_s():
    over_the_limit()

@pytest.mark.system
def test_a_system_test_over_2_s():
    over_the_limit()

def test_a_unit_test_of_0_1_s():
    time.sleep(0.1)
'''


def inner_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``source`` as a test file in a pytest session of its own, with this suite's conftest and guards."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "test_inner.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "tests"))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "--rootdir", str(inner), *args, str(inner / "test_inner.py")], cwd=inner, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("leak, args", [(leak, ()) for leak in LEAKS] + [("a setsid child", ("-n", "2"))],
                         ids=[*LEAKS, "a setsid child, on an xdist worker"])
def test_a_process_left_behind_fails_the_session_by_pid_and_is_killed(tmp_path: Path, leak: str,
                                                                      args: tuple[str, ...]):
    pidfile = tmp_path / "leaked.pid"  # outside the inner session's tmp dir
    r = inner_pytest(tmp_path, f"PIDFILE = {str(pidfile)!r}\n" + LEAKS[leak] + "\n\ndef test_another():\n    pass\n",
                     *args)
    out = r.stdout + r.stderr
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 5, what="the leaked pid"))
    assert r.returncode == 1 and "2 passed" in out, out[-3000:]  # the tests passed: the session failed
    assert "processes left behind" in out and f"pid {pid} " in out, out[-3000:]
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 5,
               what=f"the leaked pid {pid} to be killed")


def test_a_session_whose_processes_end_passes_and_only_a_slow_unit_test_fails(tmp_path: Path):
    r = inner_pytest(tmp_path, CLEAN)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "1 failed, 3 passed" in out, out[-3000:]
    assert "FAILED test_inner.py::test_a_unit_test_over_2_s" in out, out[-3000:]
    assert "is a unit test and its call took " in out and "over the unit tier's 2 s per test" in out, out[-3000:]
    assert "processes left behind" not in out, out[-3000:]
    assert "s wall on" in out and "load average (1, 5, 15 min) at start" in out, out[-3000:]
