"""The rest of issue 30's attacks, each made by a member of the team's group (a real second Unix user,
created by the test) in the team's group-writable runs dir, against runs root launches there: a symlink
where the launch lock goes, a symlink in the runs dir to a private run, a symlink where root's job
writes its events, and a repository handed to the member under a run root relaunches. Each is refused
or harmless, and each has its positive control (the same thing, the owner's own, works). The attacks on
run.json and the launch race: tests/test_shared_dir.py; the exporter's connections:
tests/test_prometheus_endpoint.py; a Slurm job id: tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TEAM, as_member, git, make_repo, stepwatch, wait_exit, wait_until
from stepwatch.monitors.runfiles import read_json

pytestmark = pytest.mark.system


def member_symlink(member: tuple[int, int], target: Path, link: Path) -> None:
    as_member(member, f"import os; os.symlink({str(target)!r}, {str(link)!r})")
    assert link.is_symlink() and link.lstat().st_uid == member[0]


def private_file(path: Path, text: str) -> Path:
    """A root-only file outside the shared dir (what a member would like root to write to)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "harness", {"ok.py": "print('hello from the run')\n"})


def test_a_members_symlink_where_the_launch_lock_goes_is_refused_and_named_and_its_target_untouched(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    target = private_file(tmp_path / "root-only" / "precious", "precious\n")
    lock = shared / ".r.launch.lock"
    member_symlink(member, target, lock)

    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", "r", "--", sys.executable, "ok.py",
                  cwd=repo, umask=0o002)

    assert r.returncode == 1 and f"{lock} is a symlink" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "cannot use the runs dir" not in r.stderr, r.stderr
    assert target.read_text() == "precious\n" and not (shared / "r").exists()
    lock.unlink()  # positive control: the owner's own lock
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", "r", "--", sys.executable, "ok.py",
                  cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    assert wait_exit(shared / "r")["returncode"] == 0
    assert lock.is_file() and not lock.is_symlink() and lock.stat().st_uid == 0


def test_a_members_symlink_in_the_runs_dir_to_a_private_run_is_never_listed(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    private = tmp_path / "root-runs"
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(private), "--name", "secret", "--", sys.executable, "ok.py",
                  cwd=repo)
    assert r.returncode == 0, r.stderr
    wait_exit(private / "secret")
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", "mine", "--", sys.executable, "ok.py",
                  cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    wait_exit(shared / "mine")
    member_symlink(member, private / "secret", shared / "link")

    listed = stepwatch("runs", "--runs-dir", str(shared))

    assert listed.returncode == 0, listed.stderr
    assert "mine" in listed.stdout, listed.stdout  # positive control: the owner's run in the shared dir
    assert "secret" not in listed.stdout and "link" not in listed.stdout, listed.stdout


WAIT_THEN_EMIT = r"""
import os, sys, time
from stepwatch.telemetry import StepTelemetry
go = sys.argv[1]
while not os.path.exists(go):  # the test plants its link, then says go
    time.sleep(0.02)
tel = StepTelemetry()
for _ in range(5):
    tel.step_begin()
    tel.step_end()
tel.run_end()
tel.close()
print("training went on", flush=True)
"""


def test_a_members_symlink_where_roots_job_writes_events_is_never_followed_and_the_job_goes_on(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    (repo / "emit.py").write_text(WAIT_THEN_EMIT)
    git(repo, "add", "emit.py")
    git(repo, "commit", "-qm", "emit")
    target = private_file(tmp_path / "root-only" / "precious", "precious\n")
    results = {}
    for name, attack in (("attacked", True), ("control", False)):
        go = tmp_path / f"go-{name}"
        r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", name, "--", sys.executable,
                      "emit.py", str(go), cwd=repo, umask=0o002)
        assert r.returncode == 0, r.stderr
        run_dir = shared / name
        wait_until(lambda: (run_dir / "train.log").exists(), 10, what="the attempt's log")  # noqa: B023
        if attack:
            assert _member_may_write(member, run_dir) is False  # a run dir stepwatch made is 0755: refused
            run_dir.chmod(run_dir.stat().st_mode | 0o020)  # the owner opens the run dir to the team (chmod g+w)
            member_symlink(member, target, run_dir / "events.jsonl")
        go.touch()
        results[name] = (wait_exit(run_dir), (run_dir / "train.log").read_text())
    exit_rec, log = results["attacked"]
    assert exit_rec["returncode"] == 0 and "training went on" in log, log
    assert target.read_text() == "precious\n"
    refusals = [ln for ln in log.splitlines() if "not writing events to" in ln]
    assert len(refusals) == 1 and "it is a symlink (never followed)" in refusals[0], log
    exit_rec, log = results["control"]  # positive control: the same job, no link, writes its events
    assert exit_rec["returncode"] == 0 and "not writing events" not in log, log
    kinds = [json.loads(ln)["kind"] for ln in (shared / "control" / "events.jsonl").read_text().splitlines()]
    assert kinds.count("step") == 5 and kinds[-1] == "run_end", kinds


def test_a_relaunch_after_the_repository_went_to_the_member_is_one_line_and_runs_nothing(
        repo: Path, tmp_path: Path, member: tuple[int, int]):
    """The run's own repository was handed to the team's member (chown -R): git refuses it ("dubious
    ownership"); a relaunch says so in one line, runs nothing, and names the fix. Given back, it relaunches."""
    runs = tmp_path / "runs"
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(runs), "--name", "h", "--", sys.executable, "ok.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    wait_exit(runs / "h")

    def chown_tree(uid: int, gid: int) -> None:
        for dirpath, dirnames, filenames in os.walk(repo):
            for n in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, n), uid, gid)
        os.chown(repo, uid, gid)

    chown_tree(*member)
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    r = stepwatch("relaunch", "--no-tui", str(runs / "h"), env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "GitCommandError" not in r.stderr, r.stderr
    assert f"git cannot read the repository at {repo} (fatal: detected dubious ownership" in r.stderr, r.stderr
    assert f"git config --global --add safe.directory {repo}" in r.stderr, r.stderr
    assert read_json(runs / "h" / "run.json")["attempt"] == 1  # type: ignore[index]
    chown_tree(0, 0)  # positive control: the owner's repository again
    r = stepwatch("relaunch", "--no-tui", str(runs / "h"), env=env)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: (read_json(runs / "h" / "run.json") or {}).get("attempt") == 2, 15, what="attempt 2")


STEPS_PY = r"""
import time
for s in range(1, 100_000):
    print(f"step {s}/100000 loss {1.0 / s:.4f}", flush=True)
    time.sleep(0.05)
"""
PING_PY = r"""
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
"""
PLANT = r"""
import json, os
def plant(name, doc):
    tmp = os.path.join(run_dir, ".member.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, os.path.join(run_dir, name))  # the run dir is group-writable: a member may replace a file
for name, doc in plants.items():
    if name == "run.json":
        run = json.load(open(os.path.join(run_dir, name)))
        run.update(doc)
        doc = run
    plant(name, doc)
"""


def _member_may_write(member: tuple[int, int], run_dir: Path) -> bool:
    """Whether the member may create a file in ``run_dir`` (tried, then removed)."""
    code = (f"import os\np = os.path.join({str(run_dir)!r}, '.member.probe')\ntry:\n    open(p, 'w').close()\n"
            "    os.unlink(p)\n    print('written')\nexcept PermissionError:\n    print('refused')\n")
    return as_member(member, code).stdout.strip() == "written"


def _team_run(repo: Path, shared: Path, name: str, pings: Path, member: tuple[int, int]) -> Path:
    """A long run of root's in the team's runs dir (umask 002), paging through an ``[alerts] command`` into
    ``pings``, its run dir opened to the team by its owner; returns its run dir once a few steps were read."""
    (repo / "steps.py").write_text(STEPS_PY)
    (repo / "ping.py").write_text(PING_PY)
    (repo / f"{name}.toml").write_text(
        f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "steps.py"]\n[alerts]\n'
        f'command = [{json.dumps(sys.executable)}, {json.dumps(str(repo / "ping.py"))}, {json.dumps(str(pings))}]\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", name)
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), f"{name}.toml", cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    run_dir = shared / name
    wait_until(lambda: b"step 5/" in (run_dir / "train.log").read_bytes(), 30, what="a few steps")
    assert not _member_may_write(member, run_dir)  # stepwatch made it 0755: the kernel refuses the member
    run_dir.chmod(run_dir.stat().st_mode | 0o020)  # the owner opens the run dir to the team (chmod g+w)
    return run_dir


def _plant(member: tuple[int, int], run_dir: Path, plants: dict) -> None:
    as_member(member, f"run_dir = {str(run_dir)!r}\nplants = {plants!r}\n" + PLANT)
    for name in plants:
        assert (run_dir / name).stat().st_uid == member[0]


def _pages(pings: Path) -> list[dict]:
    return [json.loads(ln) for ln in pings.read_text().splitlines()] if pings.exists() else []


def test_a_members_stop_record_neither_holds_the_owners_stop_back_nor_slows_it(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """A stop.json saying a stop is in progress, with a grace of eleven days: the owner's stop is not refused as
    "already in progress" and its ladder keeps the owner's grace."""
    run_dir = _team_run(repo, shared, "held", tmp_path / "pings.jsonl", member)
    _plant(member, run_dir, {"stop.json": {"v": 1, "requested_at_unix": 9e9, "requested_at": "2255-01-01T00:00:00Z",
                                           "grace_s": 1e6, "signals": [], "ended_by": None}})
    t0 = time.monotonic()
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 0 and "already in progress" not in r.stdout + r.stderr, (r.stdout, r.stderr)
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 20, what="exit.json")
    assert ex["stop_requested"] is True and time.monotonic() - t0 < 20, ex
    stop = read_json(run_dir / "stop.json")
    assert stop is not None and stop["grace_s"] == 2 and (run_dir / "stop.json").stat().st_uid == 0, stop


def test_a_members_exit_record_and_run_json_never_silence_the_page_of_a_killed_supervisor_and_the_runs_death(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """The member plants an exit.json (exit 0) and rewrites run.json (another attempt); then the supervisor
    is SIGKILLed, then the run: its warden (the owner's) still pages the loss and the death within 10 s."""
    pings = tmp_path / "pings.jsonl"
    run_dir = _team_run(repo, shared, "warded", pings, member)
    run = read_json(run_dir / "run.json")
    assert run is not None
    _plant(member, run_dir, {"exit.json": {"v": 1, "returncode": 0, "signal": None, "ended_at_unix": time.time()},
                             "run.json": {"attempt": 7, "launched_at_unix": 1.0}})
    os.kill(run["supervisor"]["pid"], signal.SIGKILL)
    wait_until(lambda: [p for p in _pages(pings) if p["kind"] == "supervisor_lost"], 10, what="the loss paged")
    t_kill = time.monotonic()
    os.kill(run["process"]["pid"], signal.SIGKILL)
    deaths = wait_until(lambda: [p for p in _pages(pings) if p["kind"] == "watchdog"], 10, what="the death paged")
    assert time.monotonic() - t_kill <= 10
    assert f"process {run['process']['pid']}" in deaths[0]["message"], deaths


def test_a_runs_dir_the_group_may_write_without_the_sticky_bit_is_refused_and_with_it_a_member_cannot_move_a_run_dir(
        repo: Path, shared: Path, member: tuple[int, int]):
    """In a group-writable runs dir without the sticky bit a member may rename any entry, the owner's run dir too, and
    put a dir of their own in its place (its files then read, and the alert command run in it, as the owner): the
    launch refuses it and says how to stop it (chmod +t). With the sticky bit (the control) the launch goes ahead
    and says nothing of it, and the member's rename of the owner's run dir is refused by the kernel."""
    shared.chmod(0o2775)  # setgid, no sticky bit
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", "loose", "--", sys.executable, "ok.py",
                  cwd=repo, umask=0o002)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"REFUSING: the runs dir {shared} is writable by group {TEAM} and has no sticky bit: another user could "
            "rename your run dir away") in r.stderr and f"chmod +t {shared}" in r.stderr, r.stderr
    assert not (shared / "loose").exists()
    shared.chmod(0o3775)  # setgid + sticky, as a team's /tmp-like dir
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", "pinned", "--", sys.executable, "ok.py",
                  cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    assert "sticky" not in r.stdout + r.stderr and "other users can replace" not in r.stdout + r.stderr, r.stderr
    wait_exit(shared / "pinned")
    code = (f"import os\ntry:\n    os.rename({str(shared / 'pinned')!r}, {str(shared / 'moved')!r})\n"
            "except PermissionError:\n    print('refused')\n")
    out = as_member(member, code)
    assert out.stdout.strip() == "refused", (out.stdout, out.stderr)
    assert (shared / "pinned" / "exit.json").exists() and not (shared / "moved").exists()


HELD_SUITE_PY = r"""
import pathlib, sys, time
ctl = pathlib.Path(sys.argv[1])
(ctl / "READY").touch()
deadline = time.time() + 60
while not (ctl / "GO").exists() and time.time() < deadline:
    time.sleep(0.05)
print("1 passed")
"""


def test_a_run_dir_a_member_makes_under_the_name_while_the_checklist_runs_is_refused_and_nothing_runs_in_it(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """The race the attack found: the member waits for the launch lock, then makes the run dir under the launch's name
    with a module of theirs in it (the alert command, run in the run dir, would import it as root). The launch
    refuses once it has made the run dir, naming its owner; the control, the same launch with nobody racing it, runs."""
    ctl = tmp_path / "ctl"
    ctl.mkdir(mode=0o755)
    (repo / "suite.py").write_text(HELD_SUITE_PY)
    mark = tmp_path / "imported"
    ping = [sys.executable, "-c", "import json"]
    for name in ("raced", "calm"):
        (repo / f"{name}.toml").write_text(
            f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "ok.py"]\n'
            f'[preflight]\ntest_command = [{json.dumps(sys.executable)}, "suite.py", {json.dumps(str(ctl))}]\n'
            f'[alerts]\ncommand = {json.dumps(ping)}\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "held checklist")
    for name in ("raced", "calm"):
        for f in ("READY", "GO"):
            (ctl / f).unlink(missing_ok=True)
        p = subprocess.Popen([sys.executable, "-m", "stepwatch.tui.cli", "launch", "--no-tui", "--runs-dir", str(shared),
                              f"{name}.toml"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, umask=0o002)
        try:
            wait_until(lambda: (ctl / "READY").exists() or p.poll() is not None, 60, what="the checklist's suite")
            assert p.poll() is None, p.communicate()
            if name == "raced":
                module = f"open({str(mark)!r}, 'w').write('x')\n"  # what `import json` in the run dir would run
                as_member(member, f"import os\nd = {str(shared / name)!r}\nos.mkdir(d, 0o2775)\n"
                                  f"open(d + '/json.py', 'w').write({module!r})\n")
            (ctl / "GO").touch()
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        if name == "raced":
            assert p.returncode == 1, (out, err)
            assert f"REFUSING: the run dir {shared / name} belongs to uid {member[0]}, not to you" in err, err
            assert sorted(os.listdir(shared / name)) == ["json.py"] and not mark.exists()
        else:
            assert p.returncode == 0, (out, err)
            assert wait_exit(shared / name)["returncode"] == 0 and not mark.exists()


def test_a_members_run_json_never_keeps_the_owner_from_stopping_the_run(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """run.json rewritten by the member (its pids and attempt): the owner's ``stop`` asks the supervisor the
    owner's own copy of the launch recorded, and the run ends as asked. The control: with that copy gone, the
    same stop is refused with the reason, and nothing is signalled."""
    runs = []
    for name in ("kept", "nocopy"):
        run_dir = _team_run(repo, shared, name, tmp_path / f"{name}.pings", member)
        run = read_json(run_dir / "run.json")
        assert run is not None
        _plant(member, run_dir, {"run.json": {"attempt": 9, "process": {"pid": 1, "create_time": 0.0},
                                              "supervisor": {"pid": 1, "create_time": 0.0}}})
        runs.append((run_dir, run))
    (run_dir, run) = runs[0]
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"asking the supervisor your launch recorded (pid {run['supervisor']['pid']})" in r.stderr, r.stderr
    ex = wait_until(lambda: read_json(run_dir / "exit.json", 0), 20, what="exit.json")
    assert ex["stop_requested"] is True and ex["signal"] == "SIGINT", ex
    (run_dir, run) = runs[1]
    from stepwatch.launcher.trust import owner_copy_path

    owner_copy_path(run_dir).unlink()
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 1 and "refusing to signal anything for nocopy" in r.stderr, (r.stdout, r.stderr)
    assert "no copy of your launch names a live supervisor of yours" in r.stderr, r.stderr
    assert not (run_dir / "exit.json").exists() and b"step" in (run_dir / "train.log").read_bytes()
    os.kill(run["supervisor"]["pid"], signal.SIGUSR1)  # the owner's own way in: the supervisor stops the run
    wait_until(lambda: read_json(run_dir / "exit.json", 0), 20, what="exit.json of the second run")


RACE = r"""
import json, os, time
path = os.path.join(run_dir, "run.json")
deadline, swaps = time.monotonic() + 8, 0
while time.monotonic() < deadline:  # from the moment the launcher writes run.json, replace it again and again
    try:
        run = json.load(open(path))
    except (OSError, ValueError):
        continue
    run["argv"] = run["config"]["command"] = ["/bin/sh", "-c", "touch " + mark]
    tmp = os.path.join(run_dir, ".member.%d.tmp" % swaps)
    try:
        with open(tmp, "w") as f:
            json.dump(run, f)
        os.replace(tmp, path)
        swaps += 1
    except OSError:
        pass
print(swaps)
"""


def test_a_member_racing_the_launch_never_gets_a_command_run(repo: Path, shared: Path, member: tuple[int, int],
                                                             tmp_path: Path):
    """Finding 2 as it happened: a member replaces run.json in a tight loop from the moment the launcher writes
    it, while the owner's ``stepwatch launch`` starts the supervisor. What runs is the owner's command."""
    import threading

    mark = tmp_path / "pwned"
    run_dir = shared / "raced"
    result: dict[str, subprocess.CompletedProcess] = {}
    racer = threading.Thread(target=lambda: result.update(
        race=as_member(member, f"run_dir = {str(run_dir)!r}\nmark = {str(mark)!r}\n" + RACE)))
    racer.start()

    def open_to_team() -> None:  # the owner opens the run dir to the team (chmod g+w) once the launcher wrote run.json
        wait_until(lambda: (run_dir / "run.json").exists(), 20, interval_s=0.001, what="run.json")
        run_dir.chmod(run_dir.stat().st_mode | 0o020)

    opener = threading.Thread(target=open_to_team)
    opener.start()
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "--name", "raced", "--", sys.executable, "ok.py",
                  cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    racer.join(30)
    opener.join(30)
    assert int(result["race"].stdout.strip()) > 0, result["race"]  # the member did replace it, again and again
    ex = wait_exit(run_dir)
    assert ex["returncode"] == 0 and "hello from the run" in (run_dir / "train.log").read_text()
    assert not mark.exists()
