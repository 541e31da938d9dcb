"""A member's checkpoint never runs as the owner (issue 43, finding 1): a checkpoint is judged on its whole path (as
ssh's StrictModes judges authorized_keys: launcher/checkpointpath.py) when the restart policy decides, and again
right before the next attempt's exec, after the back-off and the checklist.

The attack, each time by a real second user of the owner's group, the owner (root) working with umask 002 in a team's
group-writable project dir: the run saves ``out/checkpoint-20`` (its own umask 022: the checkpoint itself is private)
and dies; in the window before the next attempt the member renames ``out/`` away and puts their own
``checkpoint-20/`` there, whose pickle would touch a marker file when loaded. The marker stays absent, and the refusal
names the directory that made the path unsafe. Through the restart policy's back-off (decided unsafe, or made unsafe
only during the back-off: then refused at exec, or started from scratch where ``[restart] unsafe_checkpoint =
"scratch"``), through ``relaunch --from-checkpoint`` with its checklist held open, and through a Slurm requeue's next
attempt (launcher/requeue.py, called at its function boundary: a real requeue is tests/test_slurm_requeue.py's,
two minutes of Slurm's hold each). The control, each time: the same run in a private project dir resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEAM, as_member, make_repo, stepwatch, wait_exit, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.watchdog import ProcessRef, is_alive

pytestmark = pytest.mark.system

#: An HF-layout trainer in plain Python: attempt 1 saves checkpoint-20 (its own umask 022, as README asks in a shared
#: dir) and is SIGKILLed at step 25; a resumed attempt loads the checkpoint's pickle, as torch.load would.
TRAIN_PY = r'''
import json, os, pickle, signal, sys, time
os.umask(0o022)
out = sys.argv[sys.argv.index("--output_dir") + 1]
flag = "--resume_from_checkpoint"
resume = sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None
start = 0
if resume:
    with open(os.path.join(resume, "optimizer.pt"), "rb") as f:
        start = pickle.load(f)["step"]
    print(f"resumed from {resume} at step {start}", flush=True)
else:
    print("from scratch", flush=True)
first = os.environ.get("STEPWATCH_ATTEMPT") == "1"
for step in range(start + 1, 31):
    time.sleep(0.02)
    print(f"step {step}/30", flush=True)
    if first and step == 20:
        cp = os.path.join(out, f"checkpoint-{step}")
        os.makedirs(cp)
        with open(os.path.join(cp, "optimizer.pt"), "wb") as f:
            pickle.dump({"step": step}, f)
        open(os.path.join(cp, "model.safetensors"), "wb").write(b"w" * 16)
        json.dump({"global_step": step}, open(os.path.join(cp, "trainer_state.json"), "w"))  # written last
    if first and step == 25:
        os.kill(os.getpid(), signal.SIGKILL)
'''

#: The checklist's test suite: held open (READY, then wait for GO) while HOLD exists, for the swap during it.
SUITE_PY = r'''
import pathlib, sys, time
ctl = pathlib.Path(sys.argv[1])
if (ctl / "HOLD").exists():
    (ctl / "READY").touch()
    deadline = time.time() + 60
    while not (ctl / "GO").exists() and time.time() < deadline:
        time.sleep(0.05)
print("1 passed")
'''


def _project(tmp_path: Path, member: tuple[int, int], restart: str, shared_dir: bool) -> tuple[Path, Path, Path]:
    """(the project dir, the run dir, the config): the repo is the project dir (group-writable, the team's, when
    ``shared_dir``; else 0755 root's), the config and the runs dir private beside it, so only the checkpoint's path
    is in question."""
    ctl = tmp_path / "ctl"
    ctl.mkdir(mode=0o755)
    proj = make_repo(tmp_path / "proj", {"train.py": TRAIN_PY, "suite.py": SUITE_PY, ".gitignore": "out*\n"})
    os.chown(proj, 0, member[1])
    proj.chmod(0o2775 if shared_dir else 0o755)
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir(mode=0o755)
    (tmp_path / "runs").mkdir(mode=0o755)
    page = f'printf "%s\\n" "$STEPWATCH_ALERT_MESSAGE" >> {ctl / "pages.txt"}'
    config = cfg_dir / "run.toml"
    config.write_text(
        f'name = "cp"\ncwd = {json.dumps(str(proj))}\nruns_dir = {json.dumps(str(tmp_path / "runs"))}\n'
        f'command = [{json.dumps(sys.executable)}, "train.py", "--output_dir", "out"]\n'
        f'[preflight]\ntest_command = [{json.dumps(sys.executable)}, "suite.py", {json.dumps(str(ctl))}]\n'
        f'[alerts]\ncommand = ["sh", "-c", {json.dumps(page)}]\n'
        f'[restart]\nresume = "hf"\n{restart}')
    config.chmod(0o644)
    return proj, tmp_path / "runs" / "cp", config


def _swap(member: tuple[int, int], proj: Path, marker: Path) -> None:
    """The member renames out/ away and puts their own checkpoint-20 there: its pickle touches ``marker``."""
    for d in proj.parents:  # the member may reach it (as the `shared` fixture makes it: another pytest session
        if d == Path("/tmp"):  # started meanwhile takes o+x off its pytest-of-root again)
            break
        d.chmod(d.stat().st_mode | 0o011)
    as_member(member, f"""
import json, os, pickle
class Planted:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
proj = {str(proj)!r}
os.rename(proj + "/out", proj + "/out.moved")
cp = proj + "/out/checkpoint-20"
os.makedirs(cp)
open(cp + "/optimizer.pt", "wb").write(pickle.dumps(Planted()))
open(cp + "/model.safetensors", "wb").write(b"w" * 16)
json.dump({{"global_step": 20}}, open(cp + "/trainer_state.json", "w"))
""")
    assert (proj / "out" / "checkpoint-20").stat().st_uid == member[0]


def _make_shared(proj: Path, member: tuple[int, int]) -> None:
    """The owner makes the project dir the team's (chmod g+w, as a team's setup script would)."""
    os.chown(proj, 0, member[1])
    proj.chmod(0o2775)


def _unsafe_words(proj: Path) -> str:
    return f"{proj} is writable by group {TEAM} (mode 2775): the group can rename out/ away"


def _launch(config: Path) -> None:
    r = stepwatch("launch", "--no-tui", str(config), cwd=config.parent, umask=0o002)
    assert r.returncode == 0, r.stderr


def _decision(run_dir: Path, *keys: str) -> dict:
    """restart.json's decision on attempt 1, once it holds one of ``keys`` (any, when none given)."""
    def got() -> dict | None:
        d = (read_json(run_dir / "restart.json") or {}).get("decision") or {}
        return d if d.get("attempt") == 1 and (not keys or any(k in d for k in keys)) else None
    return wait_until(got, 60, what=f"the restart decision on attempt 1 ({', '.join(keys) or 'any'})")


def test_a_checkpoint_in_a_group_writable_project_dir_is_refused_by_the_policy_and_the_page_names_the_dir(
        tmp_path: Path, shared: Path, member: tuple[int, int]):
    marker = tmp_path / "ctl" / "MARKER"
    proj, run_dir, config = _project(tmp_path, member, 'mode = "enforce"\nbackoff_s = 3\n', shared_dir=True)
    _launch(config)
    d = _decision(run_dir)
    _swap(member, proj, marker)  # in what would have been the back-off
    sup = ProcessRef.from_json((read_json(run_dir / "run.json") or {}).get("supervisor"))
    wait_until(lambda: sup is not None and not is_alive(sup), 60, what="attempt 1's supervisor to end")
    assert d["verdict"] == "STOP" and d["checkpoint"] is None, d
    assert d["reason"] == f"{proj / 'out' / 'checkpoint-20'} is not safe to resume from: {_unsafe_words(proj)}"
    assert d["unsafe_checkpoint"]["where"] == str(proj), d
    pages = tmp_path / "ctl" / "pages.txt"  # the policy's page says which directory
    wait_until(lambda: pages.exists() and _unsafe_words(proj) in pages.read_text(), 30, what="the decision's page")
    assert not marker.exists() and (read_json(run_dir / "run.json") or {})["attempt"] == 1


@pytest.mark.parametrize("unsafe", ["stop", "scratch"])
def test_a_project_dir_made_group_writable_during_the_back_off_is_refused_at_exec(
        tmp_path: Path, shared: Path, member: tuple[int, int], unsafe: str):
    marker = tmp_path / "ctl" / "MARKER"
    proj, run_dir, config = _project(tmp_path, member, f'mode = "enforce"\nbackoff_s = 3\nunsafe_checkpoint = "{unsafe}"\n',
                                     shared_dir=False)
    _launch(config)
    d = _decision(run_dir)
    assert d["verdict"] == "RESTART" and d["checkpoint"] == str(proj / "out" / "checkpoint-20"), d  # safe when decided
    _make_shared(proj, member)
    _swap(member, proj, marker)
    d = _decision(run_dir, "started", "not_started")
    if unsafe == "stop":
        assert d.get("not_started", "").endswith(
            f"REFUSING to resume from {proj / 'out' / 'checkpoint-20'}: {_unsafe_words(proj)}. A resume loads it (a "
            "pickle) with your rights, so its whole path must be writable by you and root alone (chmod g-w,o-w the "
            "directory named)"), d
        assert (read_json(run_dir / "run.json") or {})["attempt"] == 1
        pages = tmp_path / "ctl" / "pages.txt"  # the promised restart's refusal is paged, naming the directory
        wait_until(lambda: pages.exists() and "the restart did not start" in pages.read_text(), 30,
                   what="the refusal's page")
        assert f"the restart did not start: LaunchRefused: REFUSING to resume from {proj / 'out' / 'checkpoint-20'}: "\
            f"{_unsafe_words(proj)}" in pages.read_text()
    else:
        run = wait_exit(run_dir) and (read_json(run_dir / "run.json") or {})
        assert "started" in d and run["attempt"] == 2 and "--resume_from_checkpoint" not in run["argv"], (d, run)
        assert run["resumed_from"]["unsafe_checkpoint"] == d["started"]["unsafe_checkpoint"] == _unsafe_words(proj), d
        assert (run_dir / "train.log").read_text().startswith("from scratch"), (run_dir / "train.log").read_text()
    assert not marker.exists()


def test_the_control_a_private_project_dir_resumes_from_its_checkpoint(tmp_path: Path, member: tuple[int, int]):
    proj, run_dir, config = _project(tmp_path, member, 'mode = "enforce"\nbackoff_s = 1\n', shared_dir=False)
    _launch(config)
    d = _decision(run_dir, "started", "not_started")
    assert "started" in d and d["unsafe_checkpoint"] is None, d
    wait_until(lambda: (read_json(run_dir / "run.json") or {}).get("attempt") == 2 and read_json(run_dir / "exit.json"),
               60, what="attempt 2's end")
    log = (run_dir / "train.log").read_text()
    assert log.startswith(f"resumed from {proj / 'out' / 'checkpoint-20'} at step 20"), log
    run = read_json(run_dir / "run.json") or {}
    assert run["resumed_from"]["checkpoint"] == str(proj / "out" / "checkpoint-20") and run["resumed_from"][
        "unsafe_checkpoint"] is None


@pytest.mark.parametrize("shared_dir", [True, False])
def test_relaunch_from_checkpoint_judges_the_path_after_its_checklist(
        tmp_path: Path, shared: Path, member: tuple[int, int], shared_dir: bool):
    ctl, marker = tmp_path / "ctl", tmp_path / "ctl" / "MARKER"
    proj, run_dir, config = _project(tmp_path, member, "", shared_dir=False)  # private when the choice is made
    _launch(config)
    wait_exit(run_dir)
    (ctl / "HOLD").touch()
    env = {k: v for k, v in os.environ.items() if k != "STEPWATCH_RUNS_DIR"}
    p = subprocess.Popen([sys.executable, "-m", "stepwatch.tui.cli", "relaunch", "--no-tui", "--from-checkpoint",
                          str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         stdin=subprocess.DEVNULL, umask=0o002)
    try:
        wait_until(lambda: (ctl / "READY").exists() or p.poll() is not None, 60, what="the checklist's test suite")
        assert p.poll() is None, p.communicate()
        if shared_dir:  # the choice is made; the checklist runs: the owner opens the project dir, the member swaps
            _make_shared(proj, member)
            _swap(member, proj, marker)
        (ctl / "GO").touch()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    cp = proj / "out" / "checkpoint-20"
    assert f"resuming from {cp} (step 20)" in out, out
    if shared_dir:
        assert p.returncode == 1, (out, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"REFUSING to resume from {cp}: {_unsafe_words(proj)}." in lines[0], err
        assert (read_json(run_dir / "run.json") or {})["attempt"] == 1
    else:  # the control: resumed
        assert p.returncode == 0, (out, err)
        wait_until(lambda: b"resumed from" in (run_dir / "train.log").read_bytes(), 30, what="the resumed attempt")
        assert (run_dir / "train.log").read_text().startswith(f"resumed from {cp} at step 20")
    assert not marker.exists()


def test_relaunch_from_checkpoint_refuses_a_path_already_unsafe_when_chosen_before_its_checklist_runs(
        tmp_path: Path, shared: Path, member: tuple[int, int]):
    ctl = tmp_path / "ctl"
    proj, run_dir, config = _project(tmp_path, member, "", shared_dir=False)
    _launch(config)
    wait_exit(run_dir)
    _make_shared(proj, member)
    (ctl / "HOLD").touch()  # a checklist that ran would touch READY and wait 60 s for GO
    r = stepwatch("relaunch", "--no-tui", "--from-checkpoint", str(run_dir), umask=0o002, timeout=30)
    assert r.returncode == 1 and f"REFUSING to resume from {proj / 'out' / 'checkpoint-20'}: " \
        f"{_unsafe_words(proj)}." in r.stderr, (r.stdout, r.stderr)
    assert not (ctl / "READY").exists() and (read_json(run_dir / "run.json") or {})["attempt"] == 1


@pytest.mark.parametrize("shared_dir", [True, False])
def test_a_slurm_requeues_next_attempt_judges_the_path_after_its_checklist(
        tmp_path: Path, shared: Path, member: tuple[int, int], shared_dir: bool):
    """launcher/requeue.py's next_attempt_in_job, as a requeued job's supervisor calls it: the checkpoint the
    ended attempt's decision chose, the owner's config, the gate, the checklist and the last look before exec."""
    from stepwatch.launcher.requeue import next_attempt_in_job

    marker = tmp_path / "ctl" / "MARKER"
    proj, run_dir, config = _project(tmp_path, member, 'mode = "observe"\n', shared_dir=False)
    _launch(config)
    d = _decision(run_dir)
    assert d["verdict"] == "RESTART" and d["checkpoint"] == str(proj / "out" / "checkpoint-20"), d
    sup = ProcessRef.from_json((read_json(run_dir / "run.json") or {}).get("supervisor"))
    wait_until(lambda: sup is not None and not is_alive(sup), 60, what="attempt 1's supervisor to end")
    config.write_text(config.read_text().replace('mode = "observe"', 'mode = "enforce"'))  # the owner's own config
    if shared_dir:
        _make_shared(proj, member)
        _swap(member, proj, marker)
    run = {**(read_json(run_dir / "run.json") or {}), "scheduler": {"kind": "slurm", "job_id": "4343", "poll_s": 0.5}}
    said: list[str] = []
    old = os.umask(0o002)
    try:
        got = next_attempt_in_job(run_dir, run, 1, said.append)
    finally:
        os.umask(old)
    decided = (read_json(run_dir / "restart.json") or {})["decision"]
    cp = proj / "out" / "checkpoint-20"
    if shared_dir:
        assert got is None and any(f"REFUSING to resume from {cp}: {_unsafe_words(proj)}" in s for s in said), said
        assert f"REFUSING to resume from {cp}: {_unsafe_words(proj)}" in decided["not_started"], decided
    else:  # the control: the next attempt, prepared for the job's supervisor to exec, resumes from the checkpoint
        assert got is not None and got["argv"][-2:] == ["--resume_from_checkpoint", str(cp)], (got, said)
        assert got["resumed_from"]["checkpoint"] == str(cp) and "started" in decided, decided
    assert not marker.exists()
