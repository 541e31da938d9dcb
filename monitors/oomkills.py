"""The kernel's OOM kills, counted where the run's memory is accounted: the process's memory cgroup (cgroup v2
``memory.events``, v1 ``memory.oom_control``: its ``oom_kill`` line), and the host's (``/proc/vmstat``
``oom_kill``). A supervisor reads them at its attempt's start and end (the child inherits its cgroup); a SIGKILL
with more kills at the end is the kernel's OOM killer (monitors/parsers/endcauses.py ``host_oom``). A Slurm task
runs in the step's cgroup, not the supervisor's: there only the host's count moves, and the evidence says so.

The host's count is everyone's: another user's job killed by the OOM killer moves it as much as the run. So a kill
counted only on the host is this run's only when the kernel's own log (``/dev/kmsg``: ``Killed process 812``)
names a victim of the run's recorded tree since the attempt began; a kernel log that cannot be read (not root,
``kernel.dmesg_restrict``) or names only others leaves the kill a SIGKILL from outside: a cause, and the restart
policy's act on it, rests on evidence that belongs to this run.
Files of the kernel only: nothing here is read from a run dir.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SYS_CGROUP = Path("/sys/fs/cgroup")
KMSG = Path("/dev/kmsg")
#: The kernel's words for an OOM kill's victim: ``Out of memory: Killed process 812 (python)`` (and the memory
#: cgroup's ``Memory cgroup out of memory: Killed process 812``), or the ``oom-kill:...,pid=812,...`` summary line.
_VICTIM = re.compile(r"Killed process (\d{1,10})\b|\boom-kill:.*?\bpid=(\d{1,10})\b")
#: Kernel log records read at most (its ring buffer holds a few thousand).
MAX_KMSG_RECORDS = 100_000


@dataclass(frozen=True, slots=True)
class OomCount:
    """One reading: the memory cgroup's count (None: not readable) with its path, and the host's."""

    cgroup: int | None
    cgroup_path: str | None
    host: int | None


def _counter(path: Path, name: str = "oom_kill") -> int | None:
    """The value of the line ``name N`` of a kernel key-value file, or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == name and v.strip().isdigit():
            return int(v)
    return None


def _memory_cgroup(pid: int, proc: Path, sys_cgroup: Path) -> tuple[Path, str] | None:
    """The file holding ``pid``'s memory cgroup's OOM-kill count, and the cgroup's path; None when there is none."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        _hier, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
        if not path.startswith("/") or ".." in path.split("/"):
            continue
        if "memory" in ctrls.split(","):  # cgroup v1's memory hierarchy
            return sys_cgroup / "memory" / path.lstrip("/") / "memory.oom_control", path
        if ctrls == "" and _hier == "0":
            v2 = path
    if v2 is not None and (f := sys_cgroup / v2.lstrip("/") / "memory.events").exists():
        return f, v2
    return None


def oom_count(pid: int, proc: Path = PROC, sys_cgroup: Path = SYS_CGROUP) -> OomCount:
    """The OOM kills counted so far in ``pid``'s memory cgroup and on the host."""
    where = _memory_cgroup(pid, proc, sys_cgroup)
    return OomCount(_counter(where[0]) if where else None, where[1] if where else None, _counter(proc / "vmstat"))


def oom_victims(since_s: float, kmsg: Path = KMSG) -> set[int] | None:
    """The pids the kernel's log names as OOM-kill victims in records stamped at or after ``since_s`` (seconds of
    the kernel's clock, as ``time.monotonic()``); None when the log cannot be read."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found: set[int] = set()
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                rec = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break  # the end of the buffer
            except OSError:  # EPIPE: a record overwritten while reading; go on with the next
                continue
            if not rec:
                break
            head, _, text = rec.partition(";")
            fields = head.split(",")
            if len(fields) < 3 or not fields[2].isdigit() or int(fields[2]) / 1e6 < since_s:
                continue
            if (m := _VICTIM.search(text)) is not None:
                found.add(int(m[1] or m[2]))
    finally:
        os.close(fd)
    return found


def oom_kills_between(start: OomCount, end: OomCount, tree_pids: Iterable[int] = (),
                      victims: Callable[[], set[int] | None] = lambda: None) -> tuple[int, str | None]:
    """(OOM kills from ``start`` to ``end``, where they were counted): the run's cgroup when its count moved; else the
    host's, only when ``victims()`` (the kernel log's, :func:`oom_victims`) names a pid of ``tree_pids`` (the run's
    recorded processes); (0, None) otherwise."""
    if start.cgroup is not None and end.cgroup is not None and start.cgroup_path == end.cgroup_path \
            and end.cgroup > start.cgroup:
        return end.cgroup - start.cgroup, f"the run's memory cgroup ({start.cgroup_path})"
    if start.host is not None and end.host is not None and end.host > start.host:
        named = sorted((victims() or set()) & set(tree_pids))
        if named:
            return len(named), (f"this host, the kernel's log naming pid {', '.join(map(str, named[:4]))} of the "
                                "run's tree as its victim")
    return 0, None
