"""The watchdog's silent properties, through real processes (issue 21: the mutants that survived the
suite): a real zombie is a zombie, never alive; a live process of another user (kill -0 says EPERM)
is alive, never dead; a pid whose process started before OR after the recorded create time is reused;
the create-time tolerance is the documented 0.5 s, not more."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from conftest import wait_until
from stepwatch.monitors.watchdog import CREATE_TIME_TOLERANCE_S, ProcessRef, is_alive, probe


def test_a_real_zombie_child_reads_zombie_and_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        ref = ProcessRef(child.pid, psutil.Process(child.pid).create_time())
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 20, what="the child a zombie")
        assert probe(ref) == "zombie" and not is_alive(ref)  # kill -0 still succeeds on it
    finally:
        child.wait()
    assert probe(ref) == "dead"  # control: reaped, it is gone


def test_a_pid_started_before_or_after_the_record_is_reused_and_the_tolerance_is_half_a_second():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = psutil.Process(p.pid).create_time()
        assert probe(ProcessRef(p.pid, real)) == "alive"  # control: the very process
        assert probe(ProcessRef(p.pid, real + 5)) == "reused"  # the process is OLDER than the record
        assert probe(ProcessRef(p.pid, real - 5)) == "reused"  # ... or newer
        assert CREATE_TIME_TOLERANCE_S == 0.5
        assert probe(ProcessRef(p.pid, real + 0.3)) == probe(ProcessRef(p.pid, real - 0.3)) == "alive"
        assert probe(ProcessRef(p.pid, real + 0.8)) == probe(ProcessRef(p.pid, real - 0.8)) == "reused"
    finally:
        p.kill()
        p.wait()


def _probe_as(uid: int, pid: int, ctime: float) -> tuple[str, str]:
    """Fork, become ``uid`` (a real unprivileged process: kill -0 of root's process then fails with
    EPERM), and report (what os.kill(pid, 0) said, probe()'s verdict) through a pipe."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never returns into pytest
        try:
            os.setgid(65534)
            os.setuid(uid)
            try:
                os.kill(pid, 0)
                said = "ok"
            except PermissionError:
                said = "EPERM"
            except ProcessLookupError:
                said = "ESRCH"
            os.write(w, json.dumps([said, probe(ProcessRef(pid, ctime))]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(child, 0)
    said, verdict = json.loads(out)
    return said, verdict


def test_another_users_live_process_reads_alive_to_a_prober_that_may_not_signal_it():
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it probes as the unprivileged user 'nobody' (uid 65534)")
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # root's process
    try:
        ctime = psutil.Process(mine.pid).create_time()
        assert _probe_as(65534, mine.pid, ctime) == ("EPERM", "alive")  # refused kill -0 is no death
        assert _probe_as(65534, mine.pid, ctime + 5)[1] == "reused"  # its create time is still checked
    finally:
        mine.kill()
        mine.wait()
    assert _probe_as(65534, mine.pid, ctime) == ("ESRCH", "dead")  # control: the same prober sees it gone
