"""A team's group-writable runs dir, attacked by another member of the group (a real second Unix
user, created here): nothing a member writes there runs as the owner. Each attack has its positive
control, the owner's own edit through the owner's own config, which still takes effect."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEAM, as_member, git, make_repo, stepwatch, until, wait_exit
from stepwatch.tui.app import StepwatchApp
from stepwatch.launcher.trust import launch_digest, owner_copy_path
from stepwatch.monitors.runfiles import read_json

pytestmark = pytest.mark.system


def team_launch(repo: Path, runs: Path, *args: str) -> subprocess.CompletedProcess:
    """A launch as a team member with umask 002 makes it (group-writable files and dirs)."""
    return stepwatch("launch", "--no-tui", "--runs-dir", str(runs), *args, cwd=repo, umask=0o002)


REPLACE_RUN_JSON = """
import json, os
if probe:  # only try: is the run dir the member's to write?
    try:
        open(os.path.join(run_dir, ".member.probe"), "w").close()
        print("written")
    except PermissionError:
        print("refused")
    raise SystemExit(0)
path = os.path.join(run_dir, "run.json")
run = json.load(open(path))
for key, value in edits.items():
    target = run
    *parents, last = key.split(".")
    for k in parents:
        target = target.setdefault(k, {})
    target[last] = value
tmp = os.path.join(run_dir, ".member.tmp")
with open(tmp, "w") as f:
    json.dump(run, f)
os.replace(tmp, path)  # the dir is group-writable: a member may replace the owner's file
print("replaced")
"""


def member_replaces_run_json(member: tuple[int, int], run_dir: Path, edits: dict) -> None:
    """The member rewrites the owner's run.json with ``edits`` (dotted keys) and renames it into place, once the
    owner opened the run dir to the team (a run dir stepwatch made is 0755: the kernel refuses the member)."""
    if not run_dir.stat().st_mode & 0o020:
        probe = as_member(member, f"run_dir = {str(run_dir)!r}\nedits = {{}}\nprobe = True\n" + REPLACE_RUN_JSON)
        assert probe.stdout.strip() == "refused", probe.stdout  # without the owner's chmod, nothing is planted
        run_dir.chmod(run_dir.stat().st_mode | 0o020)  # the owner opens the run dir to the team (chmod g+w)
    r = as_member(member, f"run_dir = {str(run_dir)!r}\nedits = {edits!r}\nprobe = False\n" + REPLACE_RUN_JSON)
    assert "replaced" in r.stdout, r.stderr
    assert (run_dir / "run.json").stat().st_uid == member[0]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "harness", {"ok.py": "print('hello from the run')\n"})


def test_a_launch_into_the_shared_dir_keeps_its_run_dir_the_owners_and_a_relaunch_ignores_a_members_run_json(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    r = team_launch(repo, shared, "--name", "r", "--", sys.executable, "ok.py")
    assert r.returncode == 0, r.stderr
    # the team's runs dir is sticky and the run dir the owner's alone: no risk to state
    assert "other users can replace" not in r.stdout + r.stderr, r.stdout + r.stderr
    run_dir = shared / "r"
    wait_exit(run_dir)
    assert run_dir.stat().st_mode & 0o777 == 0o755 and (run_dir / "run.json").stat().st_mode & 0o777 == 0o644
    mark = tmp_path / "pwned"
    member_replaces_run_json(member, run_dir, {
        "argv": ["/bin/sh", "-c", f"touch {mark}"], "config.command": ["/bin/sh", "-c", f"touch {mark}"],
        "config.alerts": {"command": f"touch {mark}.alert"}})

    r = stepwatch("relaunch", "--no-tui", "r", "--runs-dir", str(shared), cwd=repo)

    assert r.returncode == 0, r.stderr
    assert "run.json differs from what you launched (its argv" in r.stdout and "it is ignored" in r.stdout
    assert f"command: {sys.executable} ok.py" in r.stdout
    wait_exit(run_dir)
    run = read_json(run_dir / "run.json")
    assert run is not None and run["argv"] == [sys.executable, "ok.py"] and run["attempt"] == 2
    assert "hello from the run" in (run_dir / "train.log").read_text()
    assert not mark.exists() and not Path(f"{mark}.alert").exists()


async def test_the_tuis_relaunch_key_shows_and_runs_the_owners_command_not_a_members_run_json(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """The TUI's ``r`` (confirm, checklist, enter) after a member rewrote run.json: the checklist shows the
    command the owner launched and says run.json is ignored; what runs is that command."""
    r = team_launch(repo, shared, "--name", "t", "--", sys.executable, "ok.py")
    assert r.returncode == 0, r.stderr
    run_dir = shared / "t"
    wait_exit(run_dir)
    mark = tmp_path / "pwned"
    member_replaces_run_json(member, run_dir, {"argv": ["/bin/sh", "-c", f"touch {mark}"],
                                               "config.command": ["/bin/sh", "-c", f"touch {mark}"]})
    app = StepwatchApp(run_dir, shared)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("r")
        await until(pilot, lambda: type(app.screen).__name__ == "Confirm", what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: type(app.screen).__name__ == "PreflightScreen", what="the checklist")
        await until(pilot, lambda: getattr(app.screen, "checklist", None) is not None, 30, "the checklist to finish")
        shown = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert f"command: {shlex.join([sys.executable, 'ok.py'])}" in shown, shown
        assert "run.json differs from what you launched (its argv" in shown and "it is ignored" in shown, shown
        assert "touch" not in shown.split("run.json differs")[0], shown  # the member's command is never offered
        await pilot.press("enter")
        await until(pilot, lambda: (read_json(run_dir / "run.json") or {}).get("attempt") == 2, 15, "attempt 2")
    wait_exit(run_dir)
    assert read_json(run_dir / "run.json")["argv"] == [sys.executable, "ok.py"]  # type: ignore[index]
    assert "hello from the run" in (run_dir / "train.log").read_text()
    assert not mark.exists()


def test_a_relaunch_from_a_config_file_reads_the_owners_file_not_the_one_run_json_names(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    cfg = repo / "run.toml"
    cfg.write_text(f'name = "cf"\ncommand = ["{sys.executable}", "ok.py"]\nenv = {{ LR = "1e-4" }}\n')
    git(repo, "add", "run.toml")
    git(repo, "commit", "-qm", "config")
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "run.toml", cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    run_dir = shared / "cf"
    wait_exit(run_dir)
    theirs = shared / "member.toml"  # where the member may write: a config file of theirs that exists
    mark = tmp_path / "pwned"
    as_member(member, f"open({str(theirs)!r}, 'w').write('name = \"cf\"\\ncommand = [\"/bin/sh\", \"-c\", \"touch {mark}\"]\\n')")
    member_replaces_run_json(member, run_dir, {"config_path": str(theirs)})
    # the positive control: the owner's own edit of the owner's own config
    cfg.write_text(f'name = "cf"\ncommand = ["{sys.executable}", "ok.py"]\nenv = {{ LR = "3e-4" }}\n')
    git(repo, "commit", "-qam", "new lr")

    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)

    assert r.returncode == 0, r.stderr
    assert "run.json differs from what you launched (its config_path" in r.stdout
    assert "config changed" in r.stdout and "3e-4" in r.stdout
    wait_exit(run_dir)
    assert read_json(run_dir / "run.json")["env"]["LR"] == "3e-4"  # type: ignore[index]
    assert not mark.exists()


def test_a_config_file_others_can_write_is_refused_with_the_reason_and_accepted_once_it_is_the_owners_alone(
        repo: Path, shared: Path):
    cfg = repo / "run.toml"
    cfg.write_text(f'name = "gw"\ncommand = ["{sys.executable}", "ok.py"]\n')
    git(repo, "add", "run.toml")
    git(repo, "commit", "-qm", "config")
    assert stepwatch("launch", "--no-tui", "--runs-dir", str(shared), "run.toml", cwd=repo).returncode == 0
    run_dir = shared / "gw"
    wait_exit(run_dir)
    cfg.chmod(0o664)
    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
    assert r.returncode == 1 and "is writable by group" in r.stderr and "chmod go-w" in r.stderr
    assert read_json(run_dir / "run.json")["attempt"] == 1  # type: ignore[index]  # nothing started
    cfg.chmod(0o644)
    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert wait_exit(run_dir) and read_json(run_dir / "run.json")["attempt"] == 2  # type: ignore[index]


def test_without_the_owners_copy_a_shared_run_dir_is_refused_and_a_private_one_relaunches_from_run_json(
        repo: Path, shared: Path):
    assert team_launch(repo, shared, "--name", "nc", "--", sys.executable, "ok.py").returncode == 0
    run_dir = shared / "nc"
    wait_exit(run_dir)
    owner_copy_path(run_dir).unlink()  # as after a launch by an older stepwatch
    assert run_dir.stat().st_mode & 0o777 == 0o755  # stepwatch made it the owner's alone
    run_dir.chmod(0o2775)  # the owner opens it to the team (chmod g+w): a member could replace run.json
    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
    assert r.returncode == 1, r.stdout
    assert "REFUSING to relaunch nc" in r.stderr and f"is writable by group {TEAM}" in r.stderr
    run_dir.chmod(0o755)  # the owner's alone again: run.json, 0644 and the owner's, may stand in
    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert wait_exit(run_dir) and "hello from the run" in (run_dir / "train.log").read_text()


def test_the_supervisor_runs_what_its_launcher_handed_it_never_a_run_json_replaced_in_between(
        tmp_path: Path, shared: Path, member: tuple[int, int]):
    """The launch race: a member replaces run.json after the launcher wrote it. Over the pipe
    (a local launch) the supervisor never reads it; with a digest (a Slurm batch script) it
    refuses what does not match."""
    run_dir = shared / "race"
    run_dir.mkdir()
    run_dir.chmod(0o2775)
    mark = tmp_path / "pwned"
    good = {"v": 1, "name": "race", "attempt": 1, "argv": [sys.executable, "-c", "print('owner ran')"],
            "executable": sys.executable, "shell": False, "cwd": str(tmp_path), "env": {}, "config": {},
            "config_path": None, "config_sha256": None, "launched_at_unix": 1.0,
            "supervisor": {"pid": None}, "process": {"pid": None}}
    (run_dir / "run.json").write_text(json.dumps(good))
    member_replaces_run_json(member, run_dir, {"argv": ["/bin/sh", "-c", f"touch {mark}"]})
    sup = [sys.executable, "-P", "-m", "stepwatch.launcher.supervisor", str(run_dir)]

    refused = subprocess.run([*sup, "--launch-sha256", launch_digest(good)], capture_output=True, text=True,
                             timeout=30, cwd=run_dir)
    assert refused.returncode == 2 and "REFUSING to run" in refused.stderr and "belongs to uid" in refused.stderr
    assert not (run_dir / "exit.json").exists() and not mark.exists()

    rfd, wfd = os.pipe()
    os.write(wfd, json.dumps(good).encode())
    os.close(wfd)
    try:
        ran = subprocess.run([*sup, "--run-fd", str(rfd)], pass_fds=(rfd,), capture_output=True, text=True,
                             timeout=60, cwd=run_dir)
    finally:
        os.close(rfd)
    assert ran.returncode == 0, ran.stderr
    assert (run_dir / "train.log").read_text() == "owner ran\n" and not mark.exists()
    assert read_json(run_dir / "run.json")["argv"] == good["argv"]  # type: ignore[index]  # the owner's record again

    # the positive control of the digest: the owner's own run.json, unchanged, runs
    (run_dir / "exit.json").unlink()
    (run_dir / "train.log").unlink()
    (run_dir / "run.json").unlink()
    (run_dir / "run.json").write_text(json.dumps(good))
    (run_dir / "run.json").chmod(0o644)
    ok = subprocess.run([*sup, "--launch-sha256", launch_digest(good)], capture_output=True, text=True, timeout=60,
                        cwd=run_dir)
    assert ok.returncode == 0, ok.stderr
    assert (run_dir / "train.log").read_text() == "owner ran\n"
    shutil.rmtree(run_dir)
