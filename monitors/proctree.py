"""The process tree is the run: every process of an attempt, recorded by identity as it appears.

The supervisor (:class:`TreeRecorder`, a thread) records the training command and every process that
descends from it, or that runs in the supervisor's own session, with its identity (pid + psutil
create_time, unix seconds), its parent, its user, and its rank where its environment tells it
(``RANK``, ``LOCAL_RANK``: torchrun, accelerate; ``TORCHELASTIC_RESTART_COUNT`` /
``TORCHELASTIC_MAX_RESTARTS``: which restart of torchrun's worker group it belongs to). The record, ``procs.json``, is rewritten
(atomically) whenever a process appears or ends, and once more after the training command ended.
The supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a worker whose parent died is
re-parented to it instead of init and stays in the tree.

Stop and survivors use only this record (:func:`recorded_processes`; the signals themselves are
:mod:`stepwatch.monitors.signalling`'s): a
process is signalled only when its pid *and* create time are in the record of the run's own
supervisor, and it belongs to the run's owner. A group or session number alone, read from a file,
never selects a process; a pid reused since it was recorded is never touched.
"""

from __future__ import annotations

import ctypes
import math
import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import psutil

from stepwatch.monitors import fdreserve
from stepwatch.monitors.runfiles import PROCS_JSON, read_json, write_json_atomic
from stepwatch.monitors.watchdog import PID_MAX, ProcessRef

#: How often the supervisor looks for new or ended processes of the tree (seconds).
TREE_SAMPLE_S = 1.0
#: How often a Slurm run's tree asks ``scontrol listpids`` for the job's tasks on this node (s).
JOB_TASKS_EVERY_S = 2.0
#: At most this many processes are recorded per attempt (a fork bomb cannot grow the file forever).
MAX_RECORDED = 4096
PR_SET_CHILD_SUBREAPER = 36


#: Children the supervisor starts for itself (an alert command): never part of the run's tree.
#: Start them under ``HELPERS_LOCK`` and add their pid, so no look at the tree falls in between.
HELPERS_LOCK = threading.Lock()
HELPER_PIDS: set[int] = set()


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux prctl); False where refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False


def zombie_exit(pid: int) -> dict[str, Any] | None:
    """How an exited, not yet reaped process ended, from ``/proc/<pid>/stat``'s ``exit_code`` (field
    52, a wait status): ``{"returncode": n, "signal": None}`` or ``{"returncode": None, "signal":
    "SIGKILL"}``; None when it is no zombie (still running, or reaped: then nobody can know)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    if len(fields) < 50 or fields[0] != b"Z":
        return None
    try:
        status = int(fields[49])
    except ValueError:
        return None
    if status & 0x7F:
        try:
            name = signal.Signals(status & 0x7F).name
        except ValueError:
            name = f"signal {status & 0x7F}"
        return {"returncode": None, "signal": name}
    return {"returncode": (status >> 8) & 0xFF, "signal": None}


#: Environment keys read into each record: torchrun / accelerate's rank, and torch.distributed.elastic's
#: restart count of the worker group this process belongs to (0 for the first) and its limit.
RANK_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "restart_count": "TORCHELASTIC_RESTART_COUNT",
            "max_restarts": "TORCHELASTIC_MAX_RESTARTS"}
#: Seconds after it was first seen that a process recorded with no rank has its name and rank read again at each
#: look: one seen between its fork and its exec carries its parent's name and environment until the exec.
REREAD_S = 10.0


def _rank_of(p: psutil.Process) -> dict[str, int | None]:
    """``{rank, local_rank, restart_count, max_restarts}`` from the process's environment (as it was
    at its start); None where unset or unreadable."""
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        env = {}
    out: dict[str, int | None] = {}
    for field, key in RANK_ENV.items():
        v = env.get(key, "")
        out[field] = int(v) if v.isdigit() and len(v) < 7 else None
    return out


class TreeRecorder:
    """Records the tree of ``child_pid`` into ``run_dir/procs.json`` until ``done`` is set, then
    takes one last look (a worker left behind by the ended command is recorded before the supervisor
    exits). ``sample()`` is one look; the thread calls it every ``TREE_SAMPLE_S``."""

    def __init__(self, run_dir: Path, child: ProcessRef, log: Callable[[str], None] | None = None,
                 job_id: str | None = None):
        """``job_id``: a Slurm run's job: its step tasks on this node (children of slurmstepd, not
        of the command) join the tree, each with its task id as its rank (``scontrol listpids``)."""
        self.run_dir = run_dir
        self.child = child
        self.job_id = job_id
        self._job_tasks: dict[int, tuple[int | None, int | None]] = {}  # pid -> (global, local) task id
        self._job_tasks_at = float("-inf")
        self.me = os.getpid()
        self.sid = os.getsid(0)
        self.log = log or (lambda _m: None)
        self._procs: dict[int, dict[str, Any]] = {}  # pid -> record (the pid's latest identity)
        self._write_failed = False
        self._wake_r, self._wake_w = os.pipe()  # wake(): the next look at once (the command ended)
        self.thread: threading.Thread | None = None

    def _members(self) -> list[psutil.Process]:
        """Live processes of the tree: the command, its descendants, the recorded ones and theirs,
        whatever else runs in this supervisor's session, and every child of the supervisor it did not
        start itself (a worker whose parent died is re-parented to it: it is the child subreaper)."""
        with HELPERS_LOCK:
            return self._members_locked(set(HELPER_PIDS))

    def _members_locked(self, helpers: set[int]) -> list[psutil.Process]:
        by_parent: dict[int, list[psutil.Process]] = {}
        procs: dict[int, psutil.Process] = {}
        roots = {self.child.pid} | {pid for pid, r in self._procs.items() if r.get("ended_at_unix") is None}
        if self.job_id and time.monotonic() - self._job_tasks_at >= JOB_TASKS_EVERY_S:
            from stepwatch.monitors.slurm import job_task_pids  # noqa: PLC0415

            self._job_tasks, self._job_tasks_at = job_task_pids(self.job_id), time.monotonic()
        roots |= set(self._job_tasks)
        for p in psutil.process_iter(["ppid"]):
            procs[p.pid] = p
            by_parent.setdefault(p.info["ppid"], []).append(p)
            if p.info["ppid"] == self.me and p.pid not in helpers:
                roots.add(p.pid)
            elif p.pid != self.me:
                try:
                    if os.getsid(p.pid) == self.sid:
                        roots.add(p.pid)
                except OSError:
                    pass
        seen: set[int] = set()
        stack = [pid for pid in roots if pid in procs]
        while stack:
            pid = stack.pop()
            if pid in seen or pid == self.me or pid in helpers:
                continue
            seen.add(pid)
            stack.extend(c.pid for c in by_parent.get(pid, []))
        return [procs[pid] for pid in sorted(seen)]

    def _ranked(self, p: psutil.Process) -> dict[str, int | None]:
        rank = _rank_of(p)
        task = self._job_tasks.get(p.pid)
        if task is not None and rank["rank"] is None:  # a Slurm task: srun's task ids are its ranks
            rank["rank"], rank["local_rank"] = task
        return rank

    def sample(self) -> bool:
        """One look at the tree; writes procs.json when a process appeared or ended. Returns whether
        anything changed."""
        now = time.time()
        changed = False
        live: set[int] = set()
        for p in self._members():
            try:
                ctime = p.create_time()
                status = p.status()
            except psutil.Error:
                continue
            rec = self._procs.get(p.pid)
            if rec is not None and abs((rec.get("create_time") or 0) - ctime) > 0.5:
                rec = None  # the pid was reused: a new process (the old record is replaced)
            if status == psutil.STATUS_ZOMBIE:
                if rec is not None and rec.get("exit") is None:
                    rec["exit"] = zombie_exit(p.pid)  # read before its parent reaps it
                if rec is not None and p.pid != self.child.pid:
                    self._reap(p.pid)
                continue
            live.add(p.pid)
            if rec is not None and rec.get("rank") is None and now - (rec.get("first_seen_unix") or now) < REREAD_S:
                changed |= self._reread(p, rec)
            if rec is None and len(self._procs) < MAX_RECORDED:
                try:
                    ppid, uids, name = p.ppid(), p.uids(), p.name()
                    pgid, sid = os.getpgid(p.pid), os.getsid(p.pid)
                except (psutil.Error, OSError):
                    continue
                self._procs[p.pid] = {"pid": p.pid, "create_time": ctime, "ppid": ppid, "uid": uids.real,
                                      "pgid": pgid, "sid": sid, "name": name[:64], **self._ranked(p),
                                      "first_seen_unix": now, "ended_at_unix": None, "exit": None}
                changed = True
        for pid, rec in self._procs.items():
            if rec.get("ended_at_unix") is None and pid not in live:
                rec["ended_at_unix"] = now
                changed = True
        if changed:
            self._write(now)
        return changed

    def _reread(self, p: psutil.Process, rec: dict[str, Any]) -> bool:
        """A young process recorded with no rank may have been seen between its fork and its exec (torchrun's
        worker, seen as ``pt_elastic`` with its launcher's environment): its name and rank, read again; True when
        they changed (its exec came since)."""
        try:
            name, ranked = p.name()[:64], self._ranked(p)
        except psutil.Error:
            return False
        if name == rec.get("name") and all(rec.get(k) == v for k, v in ranked.items()):
            return False
        rec.update(name=name, **ranked)
        return True

    def _reap(self, pid: int) -> None:
        """Reap a recorded zombie re-parented to this subreaper (never the command: Popen waits)."""
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def recorded(self) -> list[RecordedProcess]:
        """Every process of the tree as this recorder holds it in memory: what the supervisor signals on a stop,
        never procs.json read back (a file the owner opened to the group could name anything: issue 43)."""
        return processes_of(list(self._procs.values()))  # one copy (atomic under the GIL), then validated

    def _write(self, now: float) -> None:
        rec = {"v": 1, "supervisor": {"pid": self.me, "sid": self.sid}, "child_pid": self.child.pid,
               "updated_at_unix": now, "processes": sorted(self._procs.values(), key=lambda r: r["pid"])}
        try:
            write_json_atomic(self.run_dir / PROCS_JSON, rec, indent=None)
            self._write_failed = False
        except OSError as e:
            if not self._write_failed:
                self.log(f"could not record the process tree in {PROCS_JSON}: {e}")
            self._write_failed = True

    def _wait(self, fds: dict[int, int], timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, woken at once when a recorded process exits (its pidfd turns
        readable the instant it is a zombie, before its parent reaps it: its exit status is still
        there to read)."""
        live = {pid for pid, r in self._procs.items() if r.get("ended_at_unix") is None}
        for pid in list(fds):
            if pid not in live:
                os.close(fds.pop(pid))
        for pid in live - set(fds):
            try:
                fds[pid] = os.pidfd_open(pid)
            except (OSError, AttributeError):
                pass
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        for fd in fds.values():
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(int(timeout_s * 1000))}
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        for pid, fd in fds.items():  # exited just now: read the exit status before its parent reaps it
            rec = self._procs.get(pid)
            if fd in ready and rec is not None and rec.get("exit") is None:
                rec["exit"] = zombie_exit(pid)

    def wake(self) -> None:
        """Take the next look now (the supervisor calls it once the command has ended)."""
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass

    def run(self, done: threading.Event) -> None:
        """Sample every ``TREE_SAMPLE_S`` (at once when a process of the tree exits) until ``done``,
        then once more (what the command left behind)."""
        fds: dict[int, int] = {}
        try:
            while True:
                try:
                    with fdreserve.room():  # /proc and procs.json, with every other descriptor taken too
                        self.sample()
                except Exception as e:  # noqa: BLE001 - the record must never take the supervisor down
                    self.log(f"process tree sample failed: {type(e).__name__}: {e}")
                if done.is_set():
                    break
                self._wait(fds, TREE_SAMPLE_S)
        finally:
            for fd in fds.values():
                os.close(fd)
        try:
            with fdreserve.room():
                self.sample()
        except Exception as e:  # noqa: BLE001
            self.log(f"process tree sample failed: {type(e).__name__}: {e}")

    def start(self, done: threading.Event) -> TreeRecorder:
        """Run :meth:`run` in a daemon thread."""
        self.thread = threading.Thread(target=self.run, args=(done,), name="process-tree", daemon=True)
        self.thread.start()
        return self

    def finish(self, timeout_s: float) -> None:
        """After ``done`` was set: wake the thread and wait (bounded) for its last look."""
        self.wake()
        if self.thread is not None:
            self.thread.join(timeout_s)


@dataclass(frozen=True)
class RecordedProcess:
    """One process of the record: its identity, user, rank, and whether it is alive now."""

    ref: ProcessRef
    uid: int | None
    name: str
    rank: int | None
    local_rank: int | None
    pgid: int | None
    sid: int | None
    ended: bool = False  #: the record says it ended (``ended_at_unix`` set)


def _as_int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v <= PID_MAX else None


def recorded_processes(procs_file: Path, owner: int | None = None) -> list[RecordedProcess]:
    """The processes a record names, validated (a file is hostile: pids in pid_t's range, a finite
    create time is required, at most MAX_RECORDED). Missing or unreadable file, a symlink: [].

    With ``owner`` (a reader that acts on the list: whom a stop signals, py-spy's targets, the frozen detector):
    [] unless the file passes the trust rule for that uid (``runfiles.trust_problem``, checked on the descriptor
    read: the owner's, writable by no group or other, one link), said once; a view passes none and shows it."""
    rec = read_json(procs_file, owner, private=owner is not None)
    return processes_of(rec.get("processes") if isinstance(rec, dict) else None)


def processes_of(items: Any) -> list[RecordedProcess]:
    """:func:`recorded_processes` of a record's ``processes`` list (a file's, or the recorder's own in memory)."""
    if not isinstance(items, list):
        return []
    out = []
    for d in items[:MAX_RECORDED]:
        ref = ProcessRef.from_json(d) if isinstance(d, dict) else None
        if ref is None or ref.create_time is None or not math.isfinite(ref.create_time):
            continue  # without a create time a pid is no identity
        name = d.get("name")
        out.append(RecordedProcess(ref, _as_int(d.get("uid")), name[:64] if isinstance(name, str) else "?",
                                   _as_int(d.get("rank")), _as_int(d.get("local_rank")),
                                   _as_int(d.get("pgid")), _as_int(d.get("sid")), d.get("ended_at_unix") is not None))
    return out
