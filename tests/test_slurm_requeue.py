"""A Slurm run preempted by a requeue (``scontrol requeue``) resumes with the restart policy's rule (launcher/requeue.py),
against the real single-node Slurm of tests/test_slurm.py: Slurm runs the job's batch script again, and that start is
the run's next attempt (its files rotated, the job's own kept), resuming from the newest complete checkpoint in
``enforce`` mode and from scratch in ``observe``. Slurm holds a requeued job about two minutes (its BeginTime); the
tests let it start at once (``scontrol update StartTime=now``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import make_repo, stepwatch, wait_until
from test_slurm import slurm  # noqa: F401 - the fixture: a Slurm controller answers (fails in CI when none does)

TRAIN_PY = r'''
import json, os, sys, time
n, dt = int(sys.argv[1]), float(sys.argv[2])
start = 0
if "--resume" in sys.argv:
    ck = sys.argv[sys.argv.index("--resume") + 1]
    start = json.load(open(os.path.join(ck, "state.json")))["step"]
    print(f"resuming from {ck} at step {start}", flush=True)
for step in range(start + 1, n + 1):
    time.sleep(dt)
    print(f"step {step}/{n} loss {1.0 / step:.4f}", flush=True)
    if step == 45 and os.environ.get("DIE_ONCE_AT_45") and not os.path.exists("ckpt/died"):
        open("ckpt/died", "w").close()
        raise SystemExit("dying once at step 45")
    if step % 20 == 0:
        d = f"ckpt/ckpt_{step}"
        os.makedirs(d, exist_ok=True)
        json.dump({"step": step}, open(d + "/state.json", "w"))
        open(d + "/done", "w").close()
'''


def _launch(tmp_path: Path, mode: str, steps: int = 200, env: str = "") -> Path:
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY, ".gitignore": "runs/\nckpt/\n"})
    (repo / "run.toml").write_text(
        f'name = "rq"\ncommand = ["srun", "--ntasks=1", "{sys.executable}", "train.py", "{steps}", "0.1"]\n{env}'
        f'[slurm]\npoll_s = 0.5\n[restart]\nmode = "{mode}"\ncheckpoints = "ckpt/ckpt_*"\ncomplete_marker = "done"\n'
        'resume = ["--resume", "{checkpoint}"]\nbackoff_s = 1\n')
    subprocess.run(["git", "add", "run.toml"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "config"], cwd=repo, check=True)
    r = stepwatch("launch", "run.toml", "--no-tui", cwd=repo)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return repo / "runs" / "rq"


def _run_json(run_dir: Path) -> dict:
    """run.json; {} in the moment a new attempt's rotation has moved the last one and not yet written its own."""
    try:
        return json.loads((run_dir / "run.json").read_text())
    except FileNotFoundError:
        return {}


def _decided_on(run_dir: Path) -> int | None:
    """The attempt restart.json's last decision is on."""
    p = run_dir / "restart.json"
    return json.loads(p.read_text())["decision"]["attempt"] if p.exists() else None


def _last_step(log: Path) -> int:
    got = re.findall(r"^step (\d+)/", log.read_text(errors="replace") if log.exists() else "", re.M)
    return int(got[-1]) if got else 0


def _first_step(log: Path) -> int:
    return int(re.findall(r"^step (\d+)/", log.read_text(errors="replace"), re.M)[0])


def _requeue_at(run_dir: Path, attempt: int, step: int) -> None:
    """Once the attempt reached ``step``: scontrol requeue, and the requeued job let start at once."""
    wait_until(lambda: _run_json(run_dir).get("attempt") == attempt and _last_step(run_dir / "train.log") >= step, 90,
               what=f"attempt {attempt} at step {step}")
    job = _run_json(run_dir)["scheduler"]["job_id"]
    t_requeue = time.time()
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_until(lambda: "PENDING" in subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                                    text=True).stdout, 60, what="the requeued job pending")
    # slurmd revokes the job's credential at the requeue, to the second: a start in that same second is refused
    # ("Killing non-startable batch job: Job credential revoked", slurmctld.log), so the start waits for the next one
    wait_until(lambda: time.time() >= t_requeue + 2.0, 5, what="the second after the requeue")
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)


@pytest.mark.slow
def test_a_requeued_job_resumes_each_time_from_the_newest_complete_checkpoint_as_the_next_attempt(slurm,  # noqa: F811
                                                                                                  tmp_path: Path):
    run_dir = _launch(tmp_path, "enforce")
    job = _run_json(run_dir)["scheduler"]["job_id"]
    _requeue_at(run_dir, 1, 45)
    _requeue_at(run_dir, 2, 85)  # the batch script's digest is attempt 1's: attempt 2's is the owner's copy
    wait_until(lambda: _decided_on(run_dir) == 3, 120, what="attempt 3 to end and the policy to decide")
    assert json.loads((run_dir / "exit.json").read_text())["returncode"] == 0
    run = _run_json(run_dir)
    assert run["scheduler"]["job_id"] == job and run["scheduler"]["requeues"] == 2  # one job, three attempts
    rf = run["resumed_from"]
    assert (rf["by"], rf["after_attempt"], rf["restarts"], rf["step"]) == ("slurm requeue", 2, 2, 80), rf
    assert rf["checkpoint"].endswith("ckpt/ckpt_80") and run["argv"][-2:] == ["--resume", rf["checkpoint"]]
    assert _first_step(run_dir / "train.log") == 81 and _last_step(run_dir / "train.log") == 200
    rotated = sorted(run_dir.glob("train.*.log"))
    assert [_first_step(p) for p in rotated] == [1, 41]  # one file describes one attempt
    assert [json.loads(p.read_text())["attempt"] for p in sorted(run_dir.glob("run.*.json"))] == [1, 2]
    assert not list(run_dir.glob("supervisor.*.log")) and not list(run_dir.glob("job.*.sbatch"))  # the job's files

    restart = json.loads((run_dir / "restart.json").read_text())
    ends = [(e["attempt"], e["cause"]) for e in restart["attempts"]]
    assert ends == [(1, "preempted"), (2, "preempted"), (3, "completed")], restart["attempts"]
    assert f"*** JOB {job} ON " in restart["attempts"][0]["evidence"] and "DUE TO JOB REQUEUE" in restart["attempts"][0]["evidence"]
    sup = (run_dir / "supervisor.log").read_text()
    assert f"Slurm requeued job {job} (restart 1) after attempt 1: attempt 2 starts in the job, resuming from " in sup
    assert "when Slurm runs the requeued job" in sup, sup[-3000:]
    wait_until(lambda: f"job {job} ended " in (run_dir / "jobwatch.log").read_text(), 60,
               what="the login node's watcher to see the job end")
    jw = (run_dir / "jobwatch.log").read_text()
    assert "attempt 2 runs in it" in jw and "attempt 3 runs in it" in jw and f"job {job} ended COMPLETED" in jw, jw

    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert snap["attempt"] == 3 and snap["step"]["global_step"] == 200
    ledger = snap["ledger"]
    assert [a["attempt"] for a in ledger["attempts"]] == [1, 2, 3], ledger
    lost = [a["lost_steps"] for a in ledger["attempts"]]
    assert lost[0] >= 5 and lost[1] >= 5 and lost[2] is None, ledger  # 45-40 and 85-80 at least, done again
    assert ledger["phases_s"]["restart_gap"] > 0, ledger  # the requeue's kill to the next attempt
    plain = stepwatch("status", str(run_dir)).stdout
    assert "in 3 attempts" in plain, plain


@pytest.mark.slow
def test_in_observe_mode_a_requeued_job_runs_the_next_attempt_from_scratch_and_says_what_it_would_have_done(
        slurm, tmp_path: Path):  # noqa: F811
    run_dir = _launch(tmp_path, "observe", steps=80)
    _requeue_at(run_dir, 1, 45)
    wait_until(lambda: _decided_on(run_dir) == 2, 90, what="attempt 2 to end and the policy to decide")
    run = _run_json(run_dir)
    assert "--resume" not in run["argv"] and run["resumed_from"]["checkpoint"] is None
    assert run["resumed_from"]["by"] == "slurm requeue" and _first_step(run_dir / "train.log") == 1
    first = json.loads((run_dir / "restart.json").read_text())["attempts"][0]
    assert first["cause"] == "preempted" and first["checkpoint"].endswith("ckpt/ckpt_40"), first
    assert "would restart from " in (run_dir / "supervisor.log").read_text()


@pytest.mark.slow
def test_a_slurm_job_that_died_is_resubmitted_by_the_policy_as_a_new_job_resuming_and_its_watcher_follows(
        slurm, tmp_path: Path):  # noqa: F811
    run_dir = _launch(tmp_path, "enforce", steps=80, env='[env]\nDIE_ONCE_AT_45 = "1"\n')
    first = _run_json(run_dir)["scheduler"]["job_id"]
    wait_until(lambda: _decided_on(run_dir) == 2, 120, what="attempt 2, a new job, to end and the policy to decide")
    run = _run_json(run_dir)
    second = run["scheduler"]["job_id"]
    assert second != first and run["scheduler"]["previous_job_ids"] == [first], run["scheduler"]
    rf = run["resumed_from"]
    assert (rf["by"], rf["after_attempt"], rf["step"]) == ("restart policy", 1, 40), rf
    assert _first_step(run_dir / "train.log") == 41 and _last_step(run_dir / "train.log") == 80
    restart = json.loads((run_dir / "restart.json").read_text())
    assert [(e["attempt"], e["cause"]) for e in restart["attempts"]] == [(1, "exception"), (2, "completed")]
    assert "SLURM_JOB_ID" not in run["env"]  # the dead job's variables stay out of the new job's submission
    wait_until(lambda: f"job {second} ended " in (run_dir / "jobwatch.log").read_text(), 60,
               what="the first job's watcher to follow the second job to its end")
    jw = (run_dir / "jobwatch.log").read_text()
    assert f"the restart policy submitted attempt 2 as job {second}: the watch follows it" in jw, jw
    assert jw.count("watching Slurm job") == 1 and f"watching Slurm job {first} " in jw, jw  # one watcher, kept


def _supervisor_gone(run_dir: Path) -> bool:
    """The attempt's supervisor (run.json's pid and create time) has ended: Slurm's requeue took the batch script."""
    sup = _run_json(run_dir).get("supervisor") or {}
    try:
        return psutil.Process(sup["pid"]).create_time() != sup["create_time"]
    except psutil.NoSuchProcess:
        return True


def _stop_while_pending(tmp_path: Path, forget_decision: bool) -> None:
    run_dir = _launch(tmp_path, "enforce")
    job = _run_json(run_dir)["scheduler"]["job_id"]
    wait_until(lambda: _last_step(run_dir / "train.log") >= 45, 90, what="step 45")
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_until(lambda: "PENDING" in subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                                    text=True).stdout, 60, what="the requeued job pending")
    wait_until(lambda: _supervisor_gone(run_dir), 30, what="the first attempt's supervisor to end")
    restart = run_dir / "restart.json"
    if forget_decision:  # Slurm's KillWait took the supervisor after exit.json and before its decision
        doc = json.loads(restart.read_text()) if restart.exists() else {}
        doc.get("decision", {}).pop("requeued", None)
        restart.write_text(json.dumps(doc))
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=90)
    assert r.returncode == 0, (r.stdout, r.stderr, (run_dir / "supervisor.log").read_text())
    state = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in state, (state, (run_dir / "supervisor.log").read_text())
    assert _run_json(run_dir)["attempt"] == 1 and not list(run_dir.glob("run.*.json"))  # nothing started


@pytest.mark.slow
def test_a_stop_while_the_requeued_job_waits_in_the_queue_cancels_it_and_no_attempt_starts(slurm, tmp_path: Path):  # noqa: F811
    _stop_while_pending(tmp_path, forget_decision=False)


@pytest.mark.slow
def test_a_stop_cancels_the_requeued_job_when_the_supervisor_was_killed_before_it_recorded_the_decision(
        slurm, tmp_path: Path):  # noqa: F811
    """CI once saw no decision 30 s after the requeue: Slurm's kill (KillWait) can take the supervisor between its
    exit record and its decision. The stop asks Slurm, and the queued job is cancelled all the same."""
    _stop_while_pending(tmp_path, forget_decision=True)
