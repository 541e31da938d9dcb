"""Liveness of a captured process: ``kill -0`` plus create_time, never a pattern (ARCHITECTURE.md R9).

The thing watched is always a pid captured at launch together with its create_time (psutil, unix
seconds). A pid is alive only when ``os.kill(pid, 0)`` succeeds (or fails with EPERM: the process
exists but belongs to another user), psutil reports the same create_time, and the process is not a
zombie. Where the kernel offers ``os.pidfd_open``, :func:`wait_for_exit` uses it for instant notice of
death (it fires for an unreaped child too); the ``kill -0`` poll stays the ground truth.

Nothing here reads a command line: a watchdog that pattern-matches argv can match itself.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TypeGuard

import psutil

from stepwatch.monitors.states import ALIVE, DEAD, REUSED, ZOMBIE, Verdict

#: Two create_time readings of one process agree within this many seconds. psutil derives
#: create_time from the boot time (whole seconds in /proc/stat) plus the start in clock ticks, so two
#: processes can disagree by a fraction of a second; a reused pid would have to wrap pid_max inside
#: this window, which no machine does.
CREATE_TIME_TOLERANCE_S = 0.5
#: The largest value a pid_t holds (Linux gives at most 2**22; a bigger one is simply dead).
PID_MAX = 2**31 - 1


@dataclass(frozen=True)
class ProcessRef:
    """A process captured at launch: ``pid`` and psutil ``create_time`` (unix seconds)."""

    pid: int
    create_time: float | None

    @classmethod
    def from_json(cls, obj: dict | None) -> ProcessRef | None:
        """Build from run.json's ``{"pid": .., "create_time": ..}``; None when the pid is missing."""
        if not isinstance(obj, dict):
            return None
        pid, ctime = obj.get("pid"), obj.get("create_time")
        # a pid read from a file is hostile: an int in pid_t's range, never 0 or
        # negative (os.kill would signal a whole group); a create time a finite number or unknown
        if type(pid) is not int or not 0 < pid <= PID_MAX:
            return None
        if not (ctime is None or (type(ctime) in (int, float) and math.isfinite(ctime))):
            ctime = None
        return cls(pid, ctime)

    @classmethod
    def of_pid(cls, pid: int) -> ProcessRef:
        """Capture ``pid`` now. Raises psutil.NoSuchProcess when it does not exist."""
        return cls(pid, psutil.Process(pid).create_time())


def probe(ref: ProcessRef) -> Verdict:
    """Return whether the captured process still exists.

    - ``dead``: ``kill -0`` says ESRCH.
    - ``reused``: the pid exists but its create_time differs (another process got the pid).
    - ``zombie``: exited, not yet reaped by its parent (``kill -0`` would still succeed).
    - ``alive``: otherwise. EPERM from ``kill -0`` counts as existing.
    """
    try:
        os.kill(ref.pid, 0)
    except ProcessLookupError:
        return DEAD
    except PermissionError:
        pass  # exists, belongs to another user
    except OSError as e:  # pragma: no cover - other errnos do not occur for signal 0
        if e.errno == errno.ESRCH:
            return DEAD
        raise
    try:
        p = psutil.Process(ref.pid)
        ctime = p.create_time()
        status = p.status()
    except psutil.NoSuchProcess:
        return DEAD
    except psutil.AccessDenied:
        return ALIVE
    if ref.create_time is not None and abs(ctime - ref.create_time) > CREATE_TIME_TOLERANCE_S:
        return REUSED
    if status == psutil.STATUS_ZOMBIE:
        return ZOMBIE
    return ALIVE


def is_alive(ref: ProcessRef | None) -> TypeGuard[ProcessRef]:
    """True only for a captured process that still runs (see :func:`probe`); None is not alive."""
    return ref is not None and probe(ref) == ALIVE


def held_stopped(ref: ProcessRef) -> str | None:
    """psutil's status of the captured process when the kernel holds it stopped (``stopped``: SIGSTOP, a
    job-control stop; ``tracing-stop``: a debugger, py-spy), else None (running, sleeping, gone, another's)."""
    try:
        p = psutil.Process(ref.pid)
        if ref.create_time is not None and abs(p.create_time() - ref.create_time) > CREATE_TIME_TOLERANCE_S:
            return None
        status = p.status()
    except (psutil.Error, OSError):
        return None
    return status if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) else None


def wait_for_exit(ref: ProcessRef, timeout_s: float | None = None, poll_s: float = 0.5) -> bool:
    """Block until the captured process is no longer alive, or ``timeout_s`` passes.

    Uses a pidfd (readable the instant the process exits, reaped or not) where available, and the
    ``kill -0`` + create_time probe every ``poll_s`` seconds as the ground truth. Returns True when
    the process is gone, False on timeout.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(ref.pid)
        except OSError:
            fd = None
    try:
        if probe(ref) != ALIVE:
            return True
        poller = None
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
        while True:
            wait = poll_s
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return probe(ref) != ALIVE
            if poller is not None:
                poller.poll(max(0, int(wait * 1000)))
            else:
                time.sleep(max(0.0, wait))
            if probe(ref) != ALIVE:
                return True
    finally:
        if fd is not None:
            os.close(fd)


@dataclass(frozen=True)
class SelfTestResult:
    """Outcome of :func:`self_test`: ``ok`` and the seconds it took to notice the death."""

    ok: bool
    detail: str
    noticed_after_s: float | None


def self_test(limit_s: float = 2.0) -> SelfTestResult:
    """A watchdog is trusted only once it has been seen to fire: start a throwaway process, confirm the watchdog
    reads it alive, SIGKILL it, and confirm the watchdog reports it dead within ``limit_s`` seconds.

    The throwaway is a child of this process and is reaped by a thread, as the supervisor reaps the
    real run. Never raises; failures are in the result.
    """
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    except OSError as e:
        return SelfTestResult(False, f"could not start a throwaway process: {e}", None)
    try:
        ref = ProcessRef.of_pid(proc.pid)
        if probe(ref) != ALIVE:
            return SelfTestResult(False, f"watchdog read a live process (pid {proc.pid}) as not alive", None)
        import threading

        threading.Thread(target=proc.wait, daemon=True).start()
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        gone = wait_for_exit(ref, timeout_s=limit_s, poll_s=0.05)
        dt = time.monotonic() - t0
        if not gone:
            return SelfTestResult(False, f"watchdog still read pid {proc.pid} alive {limit_s:.1f} s after SIGKILL", None)
        return SelfTestResult(True, f"alive read alive; SIGKILL noticed after {dt * 1000:.1f} ms", dt)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
