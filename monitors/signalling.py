"""Signals to a run's processes: only to recorded identities of the run dir's owner.

Every signal stepwatch sends to a run (``stop``'s ladder, ``stop --survivors``, the supervisor's
SIGUSR1) goes through here: a process is signalled only when its pid *and* create time match a
record (run.json's command, procs.json's tree: :mod:`stepwatch.monitors.proctree`), it is alive, and
its real and effective uid are the run dir's owner. A single process gets its signal through a pidfd
opened before that check (a pid reused in between is never hit); a process group only while its
recorded leader leads it, and with the owner's own permissions (root drops to the owner's uid in a
child first). Init, the caller and its parent are never signalled.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from collections.abc import Callable

import psutil

from stepwatch.monitors.proctree import RecordedProcess, recorded_processes
from stepwatch.monitors.watchdog import ProcessRef, probe
from stepwatch.monitors.states import ALIVE


def owner_uid(run_dir: Path) -> int | None:
    """The uid owning the run dir (never following a symlink); None when it cannot be read."""
    try:
        return run_dir.lstat().st_uid
    except OSError:
        return None


def belongs_to(ref: ProcessRef, uid: int | None) -> bool:
    """The captured process is alive (pid and create time match) and its real uid is ``uid``."""
    return uid is not None and ref.create_time is not None and probe(ref) == ALIVE and belongs_to_uid(ref.pid, uid)


def signal_targets(run_dir: Path, procs_file: Path, exclude: set[int] | None = None) -> list[RecordedProcess]:
    """Recorded processes of ``procs_file`` that are alive now as recorded and belong to the run's
    owner (``run_dir``'s uid), less ``exclude``: the only processes stop and survivors may signal."""
    uid = owner_uid(run_dir)
    exclude = (exclude or set()) | never_signalled()
    return [p for p in recorded_processes(procs_file, uid) if p.ref.pid not in exclude and belongs_to(p.ref, uid)]


def never_signalled() -> set[int]:
    """Init, this process and its parent (the shell that runs stepwatch): never a run's."""
    return {1, os.getpid(), os.getppid()}


def belongs_to_uid(pid: int, uid: int) -> bool:
    """The process's real and effective uid are both ``uid`` (a setuid program run by the owner is
    not the owner's to signal)."""
    try:
        u = psutil.Process(pid).uids()
    except psutil.Error:
        return False
    return u.real == uid and u.effective == uid


def send_signal(ref: ProcessRef, sig: int, uid: int | None) -> bool:
    """Send ``sig`` to the captured process only if it is alive as captured (pid and create time)
    and belongs to ``uid``. A pidfd is opened before the check and the signal goes through it, so a
    pid reused between the check and the signal is never hit. Returns whether it was sent."""
    if uid is None or ref.create_time is None or ref.pid in never_signalled():
        return False
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(ref.pid)
        except OSError as e:
            if e.errno != errno.ENOSYS:
                return False  # gone (ESRCH), or out of descriptors: nothing is sent blind
            fd = None  # a kernel before 5.3: the checked kill below (a narrow reuse window)
    try:
        if probe(ref) != ALIVE or not belongs_to_uid(ref.pid, uid):
            return False
        try:
            if fd is not None:
                import signal as _signal  # noqa: PLC0415

                _signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(ref.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    finally:
        if fd is not None:
            os.close(fd)


def signal_group(leader: ProcessRef, sig: int, uid: int | None) -> bool:
    """``killpg`` the process group led by the captured ``leader`` (the training command: the
    supervisor starts it as its own group's leader), only while the leader is alive as captured,
    belongs to ``uid`` and still leads that group, never the caller's own group. Sent with the
    owner's uid (a child that dropped to it when the caller is root): the kernel then refuses every
    member the owner could not signal (one that ran a setuid program). Returns whether it was sent."""
    if uid is None or leader.pid in never_signalled() or not belongs_to(leader, uid):
        return False
    try:
        if os.getpgid(leader.pid) != leader.pid or os.getpgrp() == leader.pid:
            return False
    except OSError:
        return False
    return _as_uid(uid, lambda: os.killpg(leader.pid, sig))


def _as_uid(uid: int, act: Callable[[], None]) -> bool:
    """Run ``act`` with ``uid``'s permissions: here when this process is that uid, else in a forked
    child that drops to it first (root only). True when ``act`` raised nothing."""
    if os.geteuid() == uid:
        try:
            act()
            return True
        except (ProcessLookupError, PermissionError):
            return False
    pid = os.fork()
    if pid == 0:  # the child: setresuid, the signal, _exit; nothing else (the parent has threads)
        code = 1
        try:
            os.setgroups([])
            os.setresuid(uid, uid, uid)
            act()
            code = 0
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def in_group(pid: int, pgid: int) -> bool:
    """The process is (now) a member of process group ``pgid``."""
    try:
        return os.getpgid(pid) == pgid
    except OSError:
        return False
