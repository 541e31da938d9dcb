"""A requeued Slurm job's next attempt, in-process (launcher/requeue.py, launcher/restartrun.py, launcher/rotate.py,
monitors/watch/jobwatch.py): how a requeue is recognised, which cancellation line is this attempt's, which files stay
with the job, and the login node's watcher following the job into its next attempt. The whole path against a real
Slurm is tests/test_slurm_requeue.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepwatch.launcher.requeue import requeue_count
from stepwatch.launcher.restartrun import slurm_cancel_line
from stepwatch.launcher.rotate import rotate
from stepwatch.monitors.runfiles import SLURM_JOB_FILES
from stepwatch.monitors.watch.jobwatch import watch_job


def _run(job: str = "7", attempt: int = 1, sup_pid: int | None = 4242) -> dict:
    return {"name": "rq", "attempt": attempt, "launched_at_unix": 1_780_000_000.0 + attempt,
            "scheduler": {"kind": "slurm", "job_id": job, "poll_s": 0.5},
            "supervisor": {"pid": sup_pid, "create_time": None, "sid": None, "host": "vm"}}


@pytest.mark.parametrize("env, run, want", [
    ({"SLURM_RESTART_COUNT": "2", "SLURM_JOB_ID": "7"}, _run(), 2),
    ({"SLURM_RESTART_COUNT": "0", "SLURM_JOB_ID": "7"}, _run(), 0),  # the job's first start
    ({"SLURM_JOB_ID": "7"}, _run(), 0),
    ({"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "8"}, _run(), 0),  # another job than run.json's
    ({"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "7"}, _run(sup_pid=None), 0),  # no supervisor started it yet
    ({"SLURM_RESTART_COUNT": "x", "SLURM_JOB_ID": "7"}, _run(), 0),
    ({"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "7"}, {**_run(), "scheduler": None}, 0),  # a local run
])
def test_a_requeue_is_slurms_restart_count_in_the_job_run_json_names_after_a_supervisor_started_it(
        monkeypatch, env, run, want):
    for k in ("SLURM_RESTART_COUNT", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert requeue_count(run) == want


def test_the_cancellation_line_is_this_supervisors_attempts_and_this_jobs(tmp_path: Path):
    me = os.getpid()
    earlier = ("2026-12-05T12:18:53.827Z supervisor[1]: started pid 2: ['srun']\n"
               "slurmstepd-vm: error: *** JOB 7 ON vm CANCELLED AT 2026-12-05T12:18:59 DUE TO JOB REQUEUE ***\n")
    mine = f"2026-12-05T12:19:03.979Z supervisor[{me}]: started pid 3: ['srun']\n"
    log = tmp_path / "supervisor.log"
    log.write_text(earlier + mine)
    assert slurm_cancel_line(tmp_path, _run()) is None  # the earlier attempt's requeue is not this one's
    log.write_text(earlier + mine + "slurmstepd-vm: error: *** JOB 9 ON vm CANCELLED AT 2026-12-05T12:19:20 "
                   "DUE TO TIME LIMIT ***\n")
    assert slurm_cancel_line(tmp_path, _run()) is None  # another job's line
    line = "*** JOB 7 ON vm CANCELLED AT 2026-12-05T12:19:20 DUE TO TIME LIMIT ***"
    log.write_text(earlier + mine + f"slurmstepd-vm: error: {line}\n")
    assert slurm_cancel_line(tmp_path, _run()) == line
    assert slurm_cancel_line(tmp_path, {**_run(), "scheduler": None}) is None  # a local run has no job


def test_the_next_attempt_in_a_requeued_job_rotates_the_attempts_files_and_leaves_the_jobs(tmp_path: Path):
    (tmp_path / "run.json").write_text(json.dumps(_run()))
    for name in ("train.log", "exit.json", "supervisor.log", "job.sbatch", "jobwatch.log", "scheduler.json"):
        (tmp_path / name).write_text(name)
    moved = {a.name for a, _ in rotate(tmp_path, SLURM_JOB_FILES)}
    assert moved == {"train.log", "exit.json", "run.json"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.count(".") == 1) == sorted(SLURM_JOB_FILES)


def _watch(tmp_path: Path, then: dict | list[dict | None], states: list[str]) -> list[str]:
    """watch_job on a run dir whose run.json becomes ``then`` after the first poll (a list: one per poll, the last
    kept; None: no run.json, as mid-rotation); Slurm answers ``states``."""
    (tmp_path / "run.json").write_text(json.dumps(_run()))
    said: list[str] = []
    answers = iter(states)
    thens = list(then) if isinstance(then, list) else [then]

    def query(job: str) -> dict:
        return {"kind": "slurm", "job_id": job, "state": next(answers), "reason": None, "error": None}

    def sleep(_s: float) -> None:
        now = thens.pop(0) if len(thens) > 1 else thens[0]
        if now is None:
            (tmp_path / "run.json").unlink(missing_ok=True)
        else:
            (tmp_path / "run.json").write_text(json.dumps(now))

    assert watch_job(tmp_path, _run(), log=said.append, query=query, sleep=sleep) == 0
    return said


def test_the_login_nodes_watcher_follows_its_requeued_job_into_the_next_attempt(tmp_path: Path):
    said = _watch(tmp_path, _run(attempt=2), ["RUNNING", "RUNNING", "COMPLETED"])
    assert any("job 7 was requeued: attempt 2 runs in it; the watch goes on" in s for s in said), said
    assert said[-1] == "job 7 ended COMPLETED; the watch ends", said


def test_the_watcher_still_ends_when_a_relaunch_put_another_job_in_the_run_dir(tmp_path: Path):
    said = _watch(tmp_path, _run(job="8", attempt=2), ["RUNNING", "RUNNING", "COMPLETED"])
    assert said[-1] == "the run dir holds another attempt now: this job's watch ends", said


def _policys(job: str = "8") -> dict:
    return {**_run(job=job, attempt=2), "resumed_from": {"by": "restart policy", "after_attempt": 1, "restarts": 1}}


def test_the_watcher_follows_the_restart_policys_resubmission_as_a_new_job(tmp_path: Path):
    said = _watch(tmp_path, _policys(), ["RUNNING", "RUNNING", "RUNNING", "COMPLETED"])
    assert "the restart policy submitted attempt 2 as job 8: the watch follows it" in said, said
    assert said[-1] == "job 8 ended COMPLETED; the watch ends", said


def test_the_watcher_follows_a_resubmission_through_the_rotation_and_the_submission_in_between(tmp_path: Path):
    """The policy's launch moves run.json away, writes the next attempt's without a job id, submits, then writes the id:
    a poll in either gap is no end of the watch (CI once saw the watcher end there and never follow job 8)."""
    unsubmitted = {**_policys(), "scheduler": {**_policys()["scheduler"], "job_id": None}}
    said = _watch(tmp_path, [None, unsubmitted, _policys()], ["RUNNING"] * 4 + ["COMPLETED"])
    assert "the restart policy submitted attempt 2 as job 8: the watch follows it" in said, said
    assert said[-1] == "job 8 ended COMPLETED; the watch ends", said


def test_a_relaunchs_attempt_still_ends_the_watch_before_its_job_is_submitted(tmp_path: Path):
    """Only the policy's own next attempt is waited for: an operator's relaunch is another attempt from its first write."""
    unsubmitted = {**_run(attempt=2), "scheduler": {**_run()["scheduler"], "job_id": None}}
    said = _watch(tmp_path, unsubmitted, ["RUNNING", "RUNNING", "COMPLETED"])
    assert said[-1] == "the run dir holds another attempt now: this job's watch ends", said


def test_a_resubmission_claimed_in_a_run_json_another_user_wrote_is_not_followed(tmp_path: Path):
    """In a team's group-writable run dir a member can put a run.json naming any job: the watcher (its owner's) never
    follows a job on that claim, nor ends its watch of the owner's job for it."""
    (tmp_path / "run.json").write_text(json.dumps(_run()))
    said: list[str] = []
    answers = iter(["RUNNING", "RUNNING", "COMPLETED"])

    def sleep(_s: float) -> None:
        (tmp_path / "run.json").write_text(json.dumps(_policys(job="99")))
        os.chown(tmp_path / "run.json", 12345, 12345)

    assert watch_job(tmp_path, _run(), log=said.append, sleep=sleep,
                     query=lambda job: {"kind": "slurm", "job_id": job, "state": next(answers), "error": None}) == 0
    assert not any("job 99" in s for s in said), said
    assert said[-1] == "job 7 ended COMPLETED; the watch ends", said
