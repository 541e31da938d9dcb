"""The watchdog's silent properties, through real processes: a real
zombie is a zombie, never alive; a live process of another user (kill -0 says EPERM)
is alive, never dead; a pid whose process started before OR after the recorded create time is reused;
the create-time tolerance is the documented 0.5 s, not more."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import wait_until
from stepwatch.monitors.watchdog import (CREATE_TIME_TOLERANCE_S, PID_MAX, ProcessRef, is_alive, probe, self_test,
                                        wait_for_exit)


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
        assert probe(ProcessRef(p.pid, real + 0.5)) == probe(ProcessRef(p.pid, real - 0.5)) == "alive"  # within: inclusive
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


# --- run.json's record, the wait for a death, the preflight's self-test (the rest of the file) ------


@pytest.mark.parametrize("record, expected", [
    ({"pid": 4242, "create_time": 1700000000.25}, ProcessRef(4242, 1700000000.25)),
    ({"pid": 4242, "create_time": 1700000000}, ProcessRef(4242, 1700000000)),  # a whole-second time
    ({"pid": 4242}, ProcessRef(4242, None)),  # the time unknown: the pid alone
    ({"pid": 2147483647, "create_time": None}, ProcessRef(2147483647, None)),  # pid_t's largest, 2**31 - 1
    ({"pid": 1, "create_time": 1.0}, ProcessRef(1, 1.0)),  # the smallest pid that names one process
    ({"pid": 4242, "create_time": float("nan")}, ProcessRef(4242, None)),  # a hostile time is unknown
    ({"pid": 4242, "create_time": float("inf")}, ProcessRef(4242, None)),
    ({"pid": 4242, "create_time": "1700000000"}, ProcessRef(4242, None)),
    ({"pid": 4242, "create_time": True}, ProcessRef(4242, None)),  # a bool is no time
    ({"pid": 0, "create_time": 1.0}, None),  # kill(0) would signal the caller's whole group
    ({"pid": -1, "create_time": 1.0}, None),  # kill(-1) would signal every process it may
    ({"pid": 2147483648}, None),  # beyond pid_t
    ({"pid": True}, None),  # a bool is an int to Python, never a pid
    ({"pid": 42.0}, None),
    ({"pid": "42"}, None),
    ({"create_time": 1.0}, None),
    (None, None),
    ([4242, 1.0], None),
])
def test_a_recorded_process_is_read_as_a_pid_in_range_and_a_finite_create_time_or_not_at_all(record, expected):
    ref = ProcessRef.from_json(record)
    assert ref == expected
    if ref is not None:
        assert type(ref.pid) is int


def test_a_captured_process_is_a_frozen_value_and_probing_never_signals_it():
    import dataclasses

    ref = ProcessRef(4242, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.pid = 1  # a record read once is never changed behind its reader's back
    assert {ref, ProcessRef(4242, 1.0)} == {ref}  # a value: hashable, equal by content
    with pytest.raises(dataclasses.FrozenInstanceError):
        self_test(limit_s=5.0).ok = False
    p = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                          "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):\n"
                          "    signal.signal(s, lambda n, f: print('got', n, flush=True))\n"
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        ref = ProcessRef.of_pid(p.pid)
        assert [probe(ref) for _ in range(5)] == ["alive"] * 5 and is_alive(ref)
        assert wait_for_exit(ref, timeout_s=0.2, poll_s=0.05) is False
        time.sleep(0.2)
        assert p.poll() is None  # kill -0 is no signal: nothing arrived, nothing died
    finally:
        p.kill()
        out = p.communicate()[0]
    assert "got" not in out, out


def test_a_process_captured_now_carries_its_own_create_time_and_a_missing_one_raises():
    ref = ProcessRef.of_pid(os.getpid())
    assert ref.pid == os.getpid() and ref.create_time == psutil.Process().create_time()
    assert probe(ref) == "alive" and is_alive(ref)
    assert not is_alive(None)  # nothing captured is never alive
    assert probe(ProcessRef(PID_MAX, None)) == "dead"  # above any pid_max: kill -0 says ESRCH
    with pytest.raises(psutil.NoSuchProcess):
        ProcessRef.of_pid(PID_MAX)


def _sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "poll-only"])
def test_waiting_for_a_death_returns_when_it_happens_and_not_before(pidfd, monkeypatch):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)  # an old kernel's path: the probe alone
    p = _sleeper(60)
    try:
        ref = ProcessRef.of_pid(p.pid)
        t0 = time.monotonic()
        assert wait_for_exit(ref, timeout_s=0.4, poll_s=0.05) is False  # alive all along: a timeout
        waited = time.monotonic() - t0
        assert 0.35 <= waited < 0.8, waited  # it waited the time asked, not less, not much more
        threading.Timer(0.3, p.kill).start()
        t0 = time.monotonic()
        assert wait_for_exit(ref, timeout_s=20, poll_s=0.05) is True
        assert 0.25 <= time.monotonic() - t0 < 5.0  # returned at the death, not at the timeout
    finally:
        p.kill()
        p.wait()
    t0 = time.monotonic()
    assert wait_for_exit(ref, timeout_s=None, poll_s=5) is True  # already gone: at once, not after a poll
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "poll-only"])
def test_a_timeout_shorter_than_the_poll_is_kept_and_the_wait_sleeps(pidfd, monkeypatch):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    p = _sleeper(60)
    try:
        ref = ProcessRef.of_pid(p.pid)
        t0, cpu0 = time.monotonic(), time.process_time()
        assert wait_for_exit(ref, timeout_s=0.5, poll_s=5) is False
        waited, cpu = time.monotonic() - t0, time.process_time() - cpu0
        assert 0.45 <= waited < 0.9, waited  # the timeout, not the 5 s poll, not a rounded-up second
        assert cpu < 0.2, cpu  # it slept: no busy loop of probes
        t0 = time.monotonic()
        assert wait_for_exit(ref, timeout_s=0.3) is False  # the default poll: the timeout still holds
        assert 0.25 <= time.monotonic() - t0 < 0.8
        threading.Timer(0.1, p.kill).start()
        t0 = time.monotonic()
        assert wait_for_exit(ref) is True  # the default poll (0.5 s) or the pidfd: noticed within a second
        assert time.monotonic() - t0 < 1.0
    finally:
        p.kill()
        p.wait()


def test_a_pidfd_notices_a_death_long_before_the_next_poll():
    if not hasattr(os, "pidfd_open"):
        pytest.fail("this kernel/python has no os.pidfd_open (Linux >= 5.3, Python >= 3.9)")
    p = _sleeper(60)
    try:
        ref = ProcessRef.of_pid(p.pid)
        threading.Thread(target=p.wait, daemon=True).start()  # reaped as the supervisor reaps
        threading.Timer(0.2, p.kill).start()
        t0 = time.monotonic()
        assert wait_for_exit(ref, timeout_s=None, poll_s=30) is True  # the poll alone would take 30 s
        assert time.monotonic() - t0 < 5.0
    finally:
        p.kill()
        p.wait()


def test_waiting_on_a_zombie_or_a_reused_pid_returns_at_once():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        ref = ProcessRef(child.pid, psutil.Process(child.pid).create_time())
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 20, what="a zombie")
        t0 = time.monotonic()
        assert wait_for_exit(ref, timeout_s=10, poll_s=5) is True  # exited: gone, though unreaped
        assert time.monotonic() - t0 < 1.0
    finally:
        child.wait()
    me = ProcessRef.of_pid(os.getpid())
    assert wait_for_exit(ProcessRef(me.pid, me.create_time - 100), timeout_s=10, poll_s=5) is True


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "poll-only"])
def test_the_self_test_passes_on_a_working_watchdog_and_says_how_fast(pidfd, monkeypatch):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)  # its own 50 ms poll then notices the death
    r = self_test(limit_s=5.0)
    assert r.ok is True and r.noticed_after_s is not None and 0 < r.noticed_after_s < 0.5, r
    said = float(re.fullmatch(r"alive read alive; SIGKILL noticed after ([\d.]+) ms", r.detail).group(1))
    assert said == pytest.approx(r.noticed_after_s * 1000, abs=0.06), r  # the detail says the same figure


def test_the_self_test_fails_when_no_process_can_start_or_the_watchdog_is_blind(monkeypatch):
    import stepwatch.monitors.watchdog as wd

    def no_fork(*a, **k):
        raise OSError(11, "Resource temporarily unavailable")

    with monkeypatch.context() as m:
        m.setattr(wd.subprocess, "Popen", no_fork)
        r = self_test()
    assert (r.ok, r.noticed_after_s) == (False, None) and "could not start a throwaway process" in r.detail
    with monkeypatch.context() as m:  # a watchdog that reads every process dead
        m.setattr(wd, "probe", lambda ref: "dead")
        t0 = time.monotonic()
        r = self_test()
    assert r.ok is False and "read a live process" in r.detail and "as not alive" in r.detail
    assert time.monotonic() - t0 < 5.0  # its throwaway (a 60 s sleep) was killed, not waited for
    with monkeypatch.context() as m:  # a watchdog that never notices a death
        m.setattr(wd, "probe", lambda ref: "alive")
        t0 = time.monotonic()
        r = self_test(limit_s=0.3)
    assert r.ok is False and r.noticed_after_s is None and "still read pid" in r.detail
    assert "0.3 s after SIGKILL" in r.detail and time.monotonic() - t0 < 5.0
    with monkeypatch.context() as m:
        m.setattr(wd, "probe", lambda ref: "alive")
        r = self_test()  # the preflight's default limit: 2 s
    assert r.ok is False and "2.0 s after SIGKILL" in r.detail
