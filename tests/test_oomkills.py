"""The kernel's OOM-kill counts (monitors/oomkills.py) on the files the kernel writes, laid out as cgroup v1, v2 or
neither, and the end they make a SIGKILL (monitors/parsers/endcauses.py). A real OOM kill in a memory cgroup:
tests/test_oom_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO_ROOT
from stepwatch.monitors.oomkills import OomCount, oom_count, oom_kills_between, oom_victims
from stepwatch.monitors.parsers.endcauses import EndFacts, classify

VMSTAT = "pgfault 1\noom_kill 7\n"


def _proc(tmp_path: Path, cgroup: str, vmstat: str = VMSTAT) -> Path:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup)
    (proc / "vmstat").write_text(vmstat)
    return proc


def test_cgroup_v1_counts_in_the_memory_hierarchys_oom_control(tmp_path: Path):
    proc = _proc(tmp_path, "5:devices:/\n4:memory:/process_api/abc\n0::/\n")
    d = tmp_path / "sys" / "memory" / "process_api" / "abc"
    d.mkdir(parents=True)
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert oom_count(42, proc, tmp_path / "sys") == OomCount(3, "/process_api/abc", 7)


def test_cgroup_v2_counts_in_memory_events_and_without_either_only_the_host_counts(tmp_path: Path):
    proc = _proc(tmp_path, "0::/user.slice/run-1.scope\n")
    d = tmp_path / "sys" / "user.slice" / "run-1.scope"
    d.mkdir(parents=True)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert oom_count(42, proc, tmp_path / "sys") == OomCount(2, "/user.slice/run-1.scope", 7)
    (d / "memory.events").unlink()  # no memory controller there
    assert oom_count(42, proc, tmp_path / "sys") == OomCount(None, None, 7)
    assert oom_count(43, proc, tmp_path / "sys") == OomCount(None, None, 7)  # no such process


def test_a_cgroup_path_that_climbs_out_is_never_followed(tmp_path: Path):
    proc = _proc(tmp_path, "4:memory:/../../etc\n")
    assert oom_count(42, proc, tmp_path / "sys").cgroup is None


@pytest.mark.parametrize("start, end, want", [
    (OomCount(1, "/a", 7), OomCount(2, "/a", 8), (1, "the run's memory cgroup (/a)")),
    (OomCount(1, "/a", 7), OomCount(1, "/a", 9), (0, None)),  # the host's count alone: anyone's kill, not the run's
    (OomCount(None, None, 7), OomCount(None, None, 7), (0, None)),
    (OomCount(None, None, None), OomCount(None, None, None), (0, None)),
    (OomCount(1, "/a", 7), OomCount(5, "/b", 7), (0, None)),  # another cgroup's count is no delta
])
def test_the_kills_of_an_attempt_are_the_difference_where_it_moved(start, end, want):
    assert oom_kills_between(start, end) == want


def test_a_kill_counted_only_on_the_host_is_the_runs_only_when_the_kernel_log_names_a_pid_of_its_tree():
    """Another user's job killed by the OOM killer moved the host's count and turned the operator's own SIGKILL into
    ``host_oom`` (issue 44). Now: the kernel log's victim must be in the run's recorded tree."""
    start, end = OomCount(1, "/a", 7), OomCount(1, "/a", 8)
    assert oom_kills_between(start, end, [812, 813], lambda: {4242}) == (0, None)  # someone else's process
    assert oom_kills_between(start, end, [812, 813], lambda: None) == (0, None)  # the kernel log unreadable
    assert oom_kills_between(start, end, [812, 813], lambda: {4242, 813}) == (
        1, "this host, the kernel's log naming pid 813 of the run's tree as its victim")
    assert oom_kills_between(OomCount(1, "/a", 7), OomCount(1, "/a", 7), [813], lambda: {813}) == (0, None)  # no kill


def test_the_kernel_logs_victims_are_read_from_its_records_since_a_time(tmp_path: Path):
    kmsg = tmp_path / "kmsg"  # /dev/kmsg's record format: priority,sequence,microseconds,flags;text
    kmsg.write_text("6,100,5000000,-;Out of memory: Killed process 700 (python) total-vm:1kB\n")
    assert oom_victims(4.0, kmsg) == {700} and oom_victims(6.0, kmsg) == set()  # stamped before: not this attempt's
    assert oom_victims(1.0, tmp_path / "absent") is None


def test_torchruns_rank_killed_by_sigkill_with_oom_kills_counted_is_the_hosts_memory_not_a_signal_from_outside():
    lines = (REPO_ROOT / "tests" / "fixtures" / "real" / "torchrun_sigkill_rank1.log").read_text().splitlines()
    got = classify(EndFacts(returncode=1, step=30, log_tail=tuple(lines), oom_kills=1,
                            oom_where="the run's memory cgroup (/a)"))
    assert got.cause == "host_oom" and got.evidence.startswith("rank 1 (pid 28129) killed by SIGKILL, torchrun's root "
                                                               "cause; the kernel's OOM killer ran 1 time(s)"), got
    assert classify(EndFacts(returncode=1, step=30, log_tail=tuple(lines))).cause == "killed_by_signal"  # none counted
