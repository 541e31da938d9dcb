"""A real OOM kill: a run launched inside a memory cgroup with a 400 MB limit (created by the test, as root) whose
training process then grows past it; the kernel's OOM killer SIGKILLs it. The supervisor counts the kill in its
cgroup (monitors/oomkills.py) and the restart policy names the cause, host out of memory, not a signal from outside.
Needs a writable memory cgroup (v1's memory hierarchy, or v2 with the memory controller): outside CI the test
skips and says why; in CI it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import make_repo, wait_until

pytestmark = pytest.mark.slow

TRAIN_PY = r'''
import time
for step in range(1, 6):
    time.sleep(0.1)
    print(f"step {step}/100 loss {1.0 / step:.4f}", flush=True)
hog = []
while True:  # past the cgroup's limit: the kernel's OOM killer ends it
    hog.append(bytearray(32 * 1024 * 1024))
'''
LIMIT_BYTES = 400 * 1024 * 1024


def _new_memory_cgroup(name: str) -> tuple[Path | None, str]:
    """A child of this process's memory cgroup with LIMIT_BYTES (and no swap), or (None, why not)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as e:
        return None, f"/proc/self/cgroup: {e}"
    v1 = next((ln.split(":", 2)[2] for ln in lines if "memory" in ln.split(":", 2)[1].split(",")), None)
    try:
        if v1 is not None:
            cg = Path("/sys/fs/cgroup/memory") / v1.lstrip("/") / name
            cg.mkdir()
            (cg / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
            return cg, ""
        v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        if v2 is None:
            return None, "no memory cgroup (neither v1's memory hierarchy nor v2)"
        cg = Path("/sys/fs/cgroup") / v2.lstrip("/") / name
        cg.mkdir()
        (cg / "memory.max").write_text(str(LIMIT_BYTES))
        (cg / "memory.swap.max").write_text("0")
        return cg, ""
    except OSError as e:
        return None, f"cannot make a memory cgroup here: {e}"


@pytest.fixture
def memory_cgroup():
    cg, why = _new_memory_cgroup(f"stepwatch-oom-{os.getpid()}")
    if cg is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this against a real memory cgroup: {why}")
        pytest.skip(why)
    yield cg
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the supervisor lingers a little after the run
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.2)


def test_a_run_the_kernels_oom_killer_ends_is_out_of_host_memory_with_the_kill_counted_in_its_cgroup(
        memory_cgroup: Path, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY})
    (repo / "run.toml").write_text(f'name = "oom"\ncommand = ["{sys.executable}", "train.py"]\n'
                                   '[restart]\nmode = "observe"\n')
    subprocess.run(["git", "add", "run.toml"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "config"], cwd=repo, check=True)
    env = {k: v for k, v in os.environ.items() if k != "STEPWATCH_RUNS_DIR"}
    launch = (f'echo $$ > {memory_cgroup / "cgroup.procs"} && exec "{sys.executable}" -m stepwatch.tui.cli '
              'launch run.toml --no-tui')
    r = subprocess.run(["sh", "-c", launch], cwd=repo, capture_output=True, text=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run_dir = repo / "runs" / "oom"
    wait_until(lambda: (run_dir / "restart.json").exists(), 90, what="the run to end and the policy to decide")
    ex = json.loads((run_dir / "exit.json").read_text())
    assert ex["signal"] == "SIGKILL" and ex["oom_kills"] >= 1, ex
    end = json.loads((run_dir / "restart.json").read_text())["attempts"][-1]
    assert end["cause"] == "host_oom", end
    assert end["evidence"].startswith("killed by SIGKILL; the kernel's OOM killer ran ") and \
        "in the run's memory cgroup (" in end["evidence"] and memory_cgroup.name in end["evidence"], end


STEADY_PY = r'''
import time
for step in range(1, 100000):
    time.sleep(0.1)
    print(f"step {step}/100000 loss {1.0 / step:.4f}", flush=True)
'''


def test_someone_elses_oom_kill_on_the_host_leaves_the_operators_own_sigkill_a_signal_from_outside(
        memory_cgroup: Path, tmp_path: Path):
    """An OOM kill anywhere on the host turned a manual SIGKILL into ``host_oom`` (issue 44): the host's count moved,
    the run's own did not. Here a process outside the run (in its own memory cgroup) is OOM-killed while the run
    steps, then the run's process is SIGKILLed by hand: the cause is a signal from outside, no OOM counted."""
    repo = make_repo(tmp_path / "repo", {"train.py": STEADY_PY, "hog.py": TRAIN_PY})
    (repo / "run.toml").write_text(f'name = "bystander"\ncommand = ["{sys.executable}", "train.py"]\n'
                                   '[restart]\nmode = "observe"\n')
    subprocess.run(["git", "add", "run.toml"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "config"], cwd=repo, check=True)
    env = {k: v for k, v in os.environ.items() if k != "STEPWATCH_RUNS_DIR"}
    r = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "launch", "run.toml", "--no-tui"], cwd=repo,
                       capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run_dir = repo / "runs" / "bystander"
    wait_until(lambda: (run_dir / "train.log").exists() and "step 5/" in (run_dir / "train.log").read_text(), 60,
               what="the run stepping")
    host_before = int(next(ln.split()[1] for ln in Path("/proc/vmstat").read_text().splitlines()
                           if ln.startswith("oom_kill ")))
    hog = subprocess.run(["sh", "-c", f'echo $$ > {memory_cgroup / "cgroup.procs"} && exec "{sys.executable}" '
                          f'{repo / "hog.py"}'], capture_output=True, timeout=120)
    assert hog.returncode == -9 or hog.returncode == 137, hog  # the OOM killer's SIGKILL, in the hog's cgroup
    host_after = int(next(ln.split()[1] for ln in Path("/proc/vmstat").read_text().splitlines()
                          if ln.startswith("oom_kill ")))
    assert host_after > host_before  # the host's count moved: the situation the issue describes
    pid = json.loads((run_dir / "run.json").read_text())["process"]["pid"]
    os.kill(pid, 9)
    wait_until(lambda: (run_dir / "restart.json").exists(), 60, what="the run to end and the policy to decide")
    ex = json.loads((run_dir / "exit.json").read_text())
    assert ex["signal"] == "SIGKILL" and ex["oom_kills"] == 0, ex
    end = json.loads((run_dir / "restart.json").read_text())["attempts"][-1]
    assert end["cause"] == "killed_by_signal" and "from outside" in end["evidence"], end
