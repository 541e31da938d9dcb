"""Slurm as a launch target, against a real single-node Slurm (slurmctld + slurmd + munged
on this machine, accounting off: tools/slurm/start.sh; .ci/run starts it). Outside CI, without a
cluster answering, these tests skip and say why; in CI a missing cluster fails them.

Also the parsers of Slurm's own output, on lines captured from this Slurm (22.05), no cluster needed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import as_member, make_repo, stepwatch, wait_until
from snapshot_types import assert_declared
from stepwatch.monitors.slurm import duration_s, is_ended, parse_sacct, parse_scontrol, parse_squeue, query_job

TRAIN_PY = r'''
import os, sys, time
n, dt = int(sys.argv[1]), float(sys.argv[2])
rank = os.environ.get("SLURM_PROCID", "0")
for step in range(1, n + 1):
    time.sleep(dt)
    if rank == "0":
        print(f"step {step}/{n} loss {1.0 / step:.4f}", flush=True)
'''
ALERT_PY = "import os, sys; open(sys.argv[1], 'a').write(os.environ.get('STEPWATCH_ALERT_KIND', '?') + '\\n')\n"


def _slurm_answers() -> str | None:
    """None when a Slurm controller answers here, else why not."""
    if not shutil.which("sbatch"):
        return "Slurm's client is not installed (apt-get install slurmctld slurmd slurm-client munge)"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s"
    if p.returncode != 0 or not any(s in p.stdout for s in ("idle", "mixed", "allocated", "completing")):
        return f"no Slurm node is up (sinfo: {(p.stderr or p.stdout).strip()[:200]}); start one: sudo tools/slurm/start.sh"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    why = _slurm_answers()
    if why and os.environ.get("CI"):
        pytest.fail(f"CI must run these against a real Slurm: {why}")
    if why:
        pytest.skip(why)


def _launch(tmp_path: Path, args: list[str], slurm_table: str, extra_toml: str = "") -> Path:
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY, "alert.py": ALERT_PY})
    command = json.dumps(args)
    (repo / "run.toml").write_text(f'name = "sl"\ncommand = {command}\n{extra_toml}\n[slurm]\npoll_s = 0.5\n{slurm_table}\n')
    subprocess.run(["git", "add", "run.toml"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "config"], cwd=repo, check=True)
    r = stepwatch("launch", "run.toml", "--no-tui", cwd=repo)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run_dir = repo / "runs" / "sl"
    job = json.loads((run_dir / "run.json").read_text())["scheduler"]["job_id"]
    assert f"submitted as Slurm job {job}" in r.stdout, r.stdout
    return run_dir


def _status(run_dir: Path) -> dict:
    r = stepwatch("status", str(run_dir), "--json")
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def _job(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["scheduler"]["job_id"]


def _recorded_alerts(run_dir: Path) -> list[dict]:
    p = run_dir / "alerts.jsonl"
    return [r for r in (json.loads(ln) for ln in p.read_text().splitlines() if ln.strip())
            if r.get("kind") == "alert"] if p.exists() else []


@pytest.mark.slow
def test_a_slurm_run_runs_its_job_stops_and_relaunches_as_a_new_job(slurm, tmp_path: Path):
    run_dir = _launch(tmp_path, ["srun", "--ntasks=1", sys.executable, "train.py", "3000", "0.05"], 'time = "10"')
    job = _job(run_dir)
    snap = wait_until(lambda: (s := _status(run_dir))["scheduler"]["state"] == "RUNNING"
                      and (s["step_seconds"]["n"] or 0) >= 5 and s, 60, what="the job running, its steps arriving")
    sch = snap["scheduler"]
    assert (sch["kind"], sch["job_id"], snap["state"]) == ("slurm", job, "running")
    assert_declared(snap)  # every key of a real Slurm run's status --json is declared in the snapshot's types
    assert sch["nodes"] and sch["time_limit_s"] == 600 and 0 < sch["time_left_s"] <= 600, sch
    assert snap["step"]["source"] == "log" and snap["step"]["max_steps"] == 3000
    asyncio.run(_header_shows(run_dir, f"RUNNING  job {job} 0:0"))  # the job and its time left on screen
    plain = stepwatch("status", str(run_dir)).stdout
    assert f"Slurm job {job} RUNNING on {sch['nodes']} · " in plain and " left of 0:10:00" in plain, plain
    r = stepwatch("stop", str(run_dir), "--grace", "5", timeout=90)
    assert r.returncode == 0, (r.stdout, r.stderr)
    ended = wait_until(lambda: (s := _status(run_dir))["scheduler"]["state"] not in ("RUNNING", "COMPLETING") and s,
                       30, what="the job to end after the stop")
    assert ended["state"] == "exited" and ended["ended"]["stop_requested"], ended["ended"]
    # srun ends with 130 once its tasks took the INT (scancel --signal=INT): a stop, not a failure
    assert "stopped as requested (exit code 130) by " in stepwatch("status", str(run_dir)).stdout
    assert not [a for a in ended["alerts"] if a["kind"] in ("job_end", "watchdog")], ended["alerts"]  # asked for
    stop = json.loads((run_dir / "stop.json").read_text())
    assert stop["signals"][0]["signal"] == "SIGINT"
    assert f"scancel --signal=INT {job}" in (run_dir / "supervisor.log").read_text()  # srun's tasks got it too

    r = stepwatch("relaunch", "sl", "--no-tui", "--runs-dir", str(run_dir.parent), cwd=run_dir.parent.parent)
    assert r.returncode == 0, (r.stdout, r.stderr)
    new = _job(run_dir)
    assert new != job and f"submitted as Slurm job {new}" in r.stdout
    rotated = [json.loads(p.read_text()) for p in run_dir.glob("run.*.json")]
    assert [x["scheduler"]["job_id"] for x in rotated] == [job]  # the old job id kept in the rotated run.json
    assert json.loads((run_dir / "run.json").read_text())["scheduler"]["previous_job_ids"] == [job]
    assert list(run_dir.glob("train.*.log")) and list(run_dir.glob("scheduler.*.json"))
    wait_until(lambda: _status(run_dir)["scheduler"]["state"] == "RUNNING", 60, what="the new job running")
    subprocess.run(["scancel", new], check=True)


@pytest.mark.slow
def test_scancel_from_outside_is_an_alert_naming_cancelled_within_the_poll_interval(slurm, tmp_path: Path):
    got = tmp_path / "delivered.txt"
    run_dir = _launch(tmp_path, ["srun", "--ntasks=1", sys.executable, "train.py", "3000", "0.05"], 'time = "10"',
                      f'[alerts]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "repo" / "alert.py"))}, '
                      f'{json.dumps(str(got))}]\n')
    job = _job(run_dir)
    wait_until(lambda: _status(run_dir)["scheduler"]["state"] == "RUNNING", 60, what="the job running")
    assert not [a for a in _recorded_alerts(run_dir) if a["alert_kind"] == "job_end"]  # control: none while it runs
    subprocess.run(["scancel", job], check=True)
    t0 = time.monotonic()
    rec = wait_until(lambda: [a for a in _recorded_alerts(run_dir) if a["alert_kind"] == "job_end"], 15,
                     what="the job watcher's job_end record")
    assert time.monotonic() - t0 < 0.5 + 5, "within the poll interval (0.5 s), plus Slurm's own ending"
    assert f"Slurm job {job} ended CANCELLED" in rec[0]["message"], rec
    wait_until(lambda: got.exists() and "job_end" in got.read_text(), 30, what="the job_end alert delivered")
    snap = _status(run_dir)
    assert snap["scheduler"]["state"] == "CANCELLED" and snap["state"] == "exited"
    assert len([a for a in snap["alerts"] if a["kind"] == "job_end"]) == 1


@pytest.mark.slow
def test_a_job_over_its_time_limit_says_it_will_not_finish_then_timeout(slurm, tmp_path: Path):
    # 3,000 steps of 0.1 s (300 s) in a 1-minute job: the ETA says it will not fit, then Slurm kills it
    run_dir = _launch(tmp_path, ["srun", "--ntasks=1", sys.executable, "train.py", "3000", "0.1"], 'time = "1"')
    job = _job(run_dir)
    warn = wait_until(lambda: [a for a in _recorded_alerts(run_dir) if a["alert_kind"] == "time_limit"], 40,
                      what="the time_limit alert")
    assert "will not finish before the time limit" in warn[0]["message"] and f"job {job}'s 0:01:00 limit" in warn[0]["message"]
    rec = wait_until(lambda: [a for a in _recorded_alerts(run_dir) if a["alert_kind"] == "job_end"], 150,
                     interval_s=1.0, what="TIMEOUT")
    assert f"Slurm job {job} ended TIMEOUT" in rec[0]["message"] and "time limit" in rec[0]["message"], rec
    snap = _status(run_dir)
    assert snap["scheduler"]["state"] == "TIMEOUT"
    assert stepwatch("watch", str(run_dir)).returncode == 1  # not a stop anyone asked for


@pytest.mark.slow
def test_a_job_held_in_the_queue_reads_pending_with_slurms_reason_and_stops_there(slurm, tmp_path: Path):
    run_dir = _launch(tmp_path, [sys.executable, "train.py", "10", "0.1"], 'extra = ["--begin=now+3600"]')
    job = _job(run_dir)
    snap = wait_until(lambda: (s := _status(run_dir))["scheduler"]["reason"] and s, 20, what="the queue's reason")
    assert (snap["state"], snap["scheduler"]["state"], snap["scheduler"]["reason"]) == ("pending", "PENDING", "BeginTime")
    assert snap["alerts"] == []  # waiting in the queue is no failure: no "status unknown"
    assert f"Slurm job {job} PENDING (BeginTime)" in stepwatch("status", str(run_dir)).stdout
    runs = stepwatch("runs", "--runs-dir", str(run_dir.parent)).stdout
    assert re.search(rf"^sl\s+1 pending\s+job {job} ", runs, re.M), runs  # the queued job in the runs list
    asyncio.run(_header_shows(run_dir, f"PENDING  job {job} "))
    r = stepwatch("launch", "run.toml", "--no-tui", cwd=run_dir.parent.parent)
    assert r.returncode == 1 and f"Slurm job {job} has not ended" in r.stderr, r.stderr  # one live attempt
    decoy = run_dir.parent / "decoy"  # another run dir whose run.json names this job: a claim Slurm does not confirm
    decoy.mkdir()
    (decoy / "run.json").write_text(json.dumps({
        "v": 1, "name": "decoy", "attempt": 1, "launched_at_unix": time.time(), "process": {"pid": None},
        "supervisor": {"pid": None}, "scheduler": {"kind": "slurm", "job_id": job}}))
    r = stepwatch("stop", str(decoy), timeout=60)
    assert r.returncode != 0 and f"refusing to cancel Slurm job {job}" in r.stderr and "works in" in r.stderr, r
    assert _status(run_dir)["scheduler"]["state"] == "PENDING"  # nothing was cancelled
    r = stepwatch("stop", str(run_dir), timeout=60)
    assert r.returncode == 0 and f"Slurm job {job} cancelled while PENDING; nothing had started" in r.stdout, r.stdout
    snap = wait_until(lambda: (s := _status(run_dir))["scheduler"]["state"] == "CANCELLED" and s, 20,
                      what="the cancelled job")
    assert snap["state"] == "exited" and not [a for a in snap["alerts"] if a["kind"] == "job_end"]  # asked for


@pytest.mark.slow
def test_a_members_run_json_naming_roots_running_job_never_cancels_it(slurm, tmp_path: Path, member, shared: Path):
    """Issue 30, item 5, by the team's member: a run dir of theirs in the shared runs dir whose run.json names
    root's running job. Root's ``stop`` of it asks Slurm first: the job is root's, not the run dir's owner's
    (refused, nothing cancelled); a root-owned decoy naming it is refused too (the job works elsewhere). The
    positive control: root's stop of its own run cancels the job."""
    run_dir = _launch(tmp_path, [sys.executable, "train.py", "3000", "0.05"], 'time = "10"')
    job = _job(run_dir)
    wait_until(lambda: _status(run_dir)["scheduler"]["state"] == "RUNNING", 60, what="the job running")
    crafted = json.dumps({"v": 1, "name": "decoy", "attempt": 1, "launched_at_unix": time.time(),
                          "process": {"pid": None}, "supervisor": {"pid": None},
                          "scheduler": {"kind": "slurm", "job_id": job}})
    uid = member[0]
    theirs = shared / "theirs"
    as_member(member, f"import os; os.mkdir({str(theirs)!r}); open({str(theirs / 'run.json')!r}, 'w').write({crafted!r})")
    assert (theirs / "run.json").stat().st_uid == uid
    r = stepwatch("stop", str(theirs), timeout=60)
    assert r.returncode != 0 and f"refusing to cancel Slurm job {job}" in r.stderr, (r.stdout, r.stderr)
    assert f"not to the run's owner (uid {uid})" in r.stderr and "Nothing was cancelled" in r.stderr, r.stderr
    decoy = shared / "decoy"  # root's own dir, the same claim: the job works in another run dir
    decoy.mkdir()
    (decoy / "run.json").write_text(crafted)
    r = stepwatch("stop", str(decoy), timeout=60)
    assert r.returncode != 0 and f"refusing to cancel Slurm job {job}" in r.stderr and "works in" in r.stderr, r.stderr
    assert _status(run_dir)["scheduler"]["state"] == "RUNNING"  # nothing was cancelled
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=90)
    assert r.returncode == 0, (r.stdout, r.stderr)
    wait_until(lambda: _status(run_dir)["scheduler"]["state"] not in ("RUNNING", "COMPLETING"), 60,
               what="the job to end after the owner's stop")


@pytest.mark.slow
def test_a_two_task_srun_run_shows_both_ranks(slurm, tmp_path: Path):
    run_dir = _launch(tmp_path, ["srun", "--ntasks=2", sys.executable, "train.py", "3000", "0.05"],
                      'ntasks_per_node = 2\ntime = "10"')
    snap = wait_until(lambda: (s := _status(run_dir))["ranks"] and {r["rank"] for r in s["ranks"]} == {0, 1}
                      and s, 60, what="both ranks in the recorded tree")
    by_rank = {r["rank"]: r for r in snap["ranks"]}
    assert all(r["alive"] for r in by_rank.values()) and by_rank[0]["pid"] != by_rank[1]["pid"]
    procs = json.loads((run_dir / "procs.json").read_text())["processes"]
    assert sorted(p["rank"] for p in procs if p["rank"] is not None) == [0, 1]
    assert "ranks: rank 0 pid" in stepwatch("status", str(run_dir)).stdout


async def _header_shows(run_dir: Path, words: str) -> None:
    """The TUI's header (Pilot, 80x24) shows ``words``."""
    from stepwatch.tui.app import StepwatchApp

    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        deadline = time.monotonic() + 15
        while words not in str(app.screen.query_one("#header").render()):
            assert time.monotonic() < deadline, str(app.screen.query_one("#header").render())
            await pilot.pause(0.1)


# ---- the parsers, on this Slurm's own output --------------------------------------------------------

SQUEUE_RUNNING = "7|RUNNING|None|vm|10:00|9:57|2026-12-01T19:22:44|2026-12-01T19:32:44\n"
SCONTROL_TIMEOUT = ("JobId=9 JobName=stepwatch-sl UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 "
                    "Account=(null) QOS=(null) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Requeue=1 "
                    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:01:04 TimeLimit=00:01:00 TimeMin=N/A "
                    "SubmitTime=2026-12-01T19:30:00 StartTime=2026-12-01T19:30:01 EndTime=2026-12-01T19:31:05 "
                    "NodeList=vm BatchHost=vm NumNodes=1 Command=/tmp/a dir/job.sbatch WorkDir=/tmp/a dir\n")


def test_slurm_durations_and_lines_parse_to_seconds_and_states():
    assert [duration_s(x) for x in ("UNLIMITED", "5", "1:30", "1:00:00", "2-03", "1-00:00:00", "INVALID", None)] == \
        [None, 300.0, 90.0, 3600.0, 183600.0, 86400.0, None, None]
    run = parse_squeue("7", SQUEUE_RUNNING)
    assert (run["state"], run["nodes"], run["time_limit_s"], run["time_left_s"]) == ("RUNNING", "vm", 600.0, 597.0)
    assert parse_squeue("8", SQUEUE_RUNNING) is None  # another job's line is not this one's
    t = parse_scontrol("9", SCONTROL_TIMEOUT)
    assert (t["state"], t["reason"], t["exit_code"], t["time_limit_s"], t["time_left_s"]) == \
        ("TIMEOUT", "TimeLimit", "0:15", 60.0, 0.0)
    assert parse_sacct("9", "9|NODE_FAIL|0:0|vm|01:00:00|2026-12-01T19:30:01|2026-12-01T19:31:05\n")["state"] == "NODE_FAIL"
    assert not any(is_ended(s) for s in ("COMPLETING", "CONFIGURING", "PENDING", "RUNNING", "UNKNOWN"))
    assert all(is_ended(s) for s in ("COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"))


def test_with_the_job_forgotten_and_accounting_off_the_state_is_unknown_with_slurms_words():
    answers = {"squeue": (1, "", "slurm_load_jobs error: Invalid job id specified"),
               "scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified"),
               "sacct": (1, "", "Slurm accounting storage is disabled")}

    def runner(argv):
        rc, out, err = answers[argv[0]]
        return subprocess.CompletedProcess(argv, rc, out, err)

    st = query_job("42", runner)
    assert st["state"] == "UNKNOWN" and "accounting storage is disabled" in st["error"], st
    answers["squeue"] = (0, SQUEUE_RUNNING.replace("7|", "42|"), "")  # control: the controller knows it
    assert query_job("42", runner)["state"] == "RUNNING"
