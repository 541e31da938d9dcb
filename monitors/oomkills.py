"""The kernel's OOM kills, counted where the run's memory is accounted: the process's memory cgroup (cgroup v2
``memory.events``, v1 ``memory.oom_control``: its ``oom_kill`` line), and the host's (``/proc/vmstat``
``oom_kill``). A supervisor reads them at its attempt's start and end (the child inherits its cgroup); a SIGKILL
with more kills at the end is the kernel's OOM killer (monitors/parsers/endcauses.py ``host_oom``). A Slurm task
runs in the step's cgroup, not the supervisor's: there only the host's count moves, and the evidence says so.
Files of the kernel only: nothing here is read from a run dir.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SYS_CGROUP = Path("/sys/fs/cgroup")


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


def oom_kills_between(start: OomCount, end: OomCount) -> tuple[int, str | None]:
    """(OOM kills from ``start`` to ``end``, where they were counted): the run's cgroup when its count moved, else
    the host's; (0, None) when neither moved or neither could be read."""
    if start.cgroup is not None and end.cgroup is not None and start.cgroup_path == end.cgroup_path \
            and end.cgroup > start.cgroup:
        return end.cgroup - start.cgroup, f"the run's memory cgroup ({start.cgroup_path})"
    if start.host is not None and end.host is not None and end.host > start.host:
        return end.host - start.host, "this host (the run's own cgroup counted none or could not be read)"
    return 0, None
