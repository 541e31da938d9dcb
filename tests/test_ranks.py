"""Many ranks on one node: real ``torchrun --nproc_per_node 2`` runs on the CPU (gloo).
The supervisor records each rank's process (RANK from its environment) and how it ended; a rank's
death is an alert naming the rank, its pid and the signal within 2 s; a frozen rank does not outlive
``stepwatch stop``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import FIXTURES_REAL, make_repo, stepwatch, wait_until
from snapshot_types import assert_declared
from stepwatch.monitors.parsers.torchrun import FailureTable
from stepwatch.monitors.runfiles import read_json

DDP_PY = '''\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} pid {os.getpid()} up", flush=True)
for step in range(1, int(sys.argv[1]) + 1):
    dist.all_reduce(torch.ones(10))
    time.sleep(0.1)
    if rank == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
dist.destroy_process_group()
'''
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def test_the_failure_table_of_a_real_torchrun_names_the_root_cause():
    table = FailureTable()
    for line in (FIXTURES_REAL / "torchrun_sigkill_rank1.log").read_text().splitlines():
        table.feed(line)
    got = [(e.rank, e.local_rank, e.exitcode, e.root_cause, e.how()) for e in table.entries]
    assert got == [(0, 0, -15, False, "killed by SIGTERM"), (1, 1, -9, True, "killed by SIGKILL")]
    assert all(e.pid > 0 for e in table.entries)
    control = FailureTable()  # a log with no table: nothing
    for line in (FIXTURES_REAL / "hf_trainer_plain.log").read_text().splitlines():
        control.feed(line)
    assert control.entries == []


def _launch_ddp(tmp_path: Path, steps: int) -> Path:
    repo = make_repo(tmp_path / "repo", {"ddp.py": DDP_PY})
    r = stepwatch("launch", "--no-tui", "--name", "ddp", "--", TORCHRUN, "--nproc_per_node", "2",
                  "--monitor-interval", "0.1", "ddp.py", str(steps), cwd=repo, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return repo / "runs" / "ddp"


def _ranks(run_dir: Path) -> dict[int, dict]:
    procs = (read_json(run_dir / "procs.json") or {}).get("processes") or []
    ranked = {p["pid"]: p for p in procs if p.get("rank") is not None}
    return {p["rank"]: p for p in ranked.values()
            if not (ranked.get(p["ppid"]) and ranked[p["ppid"]]["rank"] == p["rank"])}


def _wait_both_ranks_step(run_dir: Path) -> dict[int, dict]:
    wait_until(lambda: "step 10" in (run_dir / "train.log").read_text(), 60, what="the ranks to step")
    return wait_until(lambda: len(r := _ranks(run_dir)) == 2 and r, 10, what="both ranks recorded")


@pytest.mark.slow
def test_sigkill_of_rank_1_is_an_alert_naming_rank_pid_and_signal_within_2_s(tmp_path: Path):
    run_dir = _launch_ddp(tmp_path, 600)
    ranks = _wait_both_ranks_step(run_dir)
    victim = ranks[1]["pid"]
    t_kill = time.time()
    os.kill(victim, signal.SIGKILL)
    rec = wait_until(lambda: next((json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()
                                   if '"rank_death"' in ln), None), 15, interval_s=0.05, what="the rank_death alert")
    print(f"rank_death recorded {rec['t'] - t_kill:.3f} s after the kill")
    assert rec["t"] - t_kill < 2.0, f"recorded {rec['t'] - t_kill:.2f} s after the kill"
    msg = rec["message"]
    assert msg.startswith(f"rank 1 (local_rank 1, pid {victim}) killed by SIGKILL"), msg
    wait_until(lambda: read_json(run_dir / "exit.json"), 60, what="torchrun to end")
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert_declared(snap)  # every key of a real torchrun run's status --json is declared in the snapshot's types
    by_rank = {r["rank"]: r for r in snap["ranks"]}
    assert by_rank[1]["pid"] == victim and by_rank[1]["signal"] == "SIGKILL" and not by_rank[1]["alive"]
    assert by_rank[1]["exit_source"] in ("kernel", "torchrun")  # its zombie, or torchrun's table if reaped first
    assert by_rank[0]["signal"] in ("SIGTERM", None)  # torchrun's teardown of the other rank (if seen)
    deaths = [a for a in snap["alerts"] if a["kind"] == "rank_death"]
    assert len(deaths) == 1 and f"pid {victim}" in deaths[0]["message"], deaths  # rank 0's teardown rides along
    end = next(a["message"] for a in snap["alerts"] if a["kind"] == "watchdog")  # torchrun's empty ChildFailedError
    assert f"root cause: rank 1 (pid {victim}) killed by SIGKILL" in end, end
    text = stepwatch("status", str(run_dir)).stdout
    assert f"rank 1 pid {victim} killed by SIGKILL" in text, text


PING_PY = """\
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "id": os.environ["STEPWATCH_ALERT_ID"]}) + "\\n")
"""


@pytest.mark.slow
def test_a_rank_death_that_ends_the_group_is_one_page_the_deaths_naming_the_rank(tmp_path: Path):
    """One cause, one page (issue 44): rank 1 SIGKILLed, torchrun tears rank 0 down and ends 0.1 s later. The code
    before paged rank_death ("the run goes on") and then the run's death; now the death's page, which names the
    root-cause rank, is the one page, and the rank_death is shown as its evidence."""
    pings = tmp_path / "pings.jsonl"
    toml = (f'name = "ddp"\ncommand = {json.dumps([TORCHRUN, "--nproc_per_node", "2", "--monitor-interval", "0.1", "ddp.py", "600"])}\n'
            'env = { OMP_NUM_THREADS = "1" }\n'
            f"[alerts]\ncommand = {json.dumps([sys.executable, str(tmp_path / 'repo' / 'ping.py'), str(pings)])}\n")
    repo = make_repo(tmp_path / "repo", {"ddp.py": DDP_PY, "ping.py": PING_PY, "ddp.toml": toml})
    r = stepwatch("launch", "--no-tui", "ddp.toml", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "ddp"
    ranks = _wait_both_ranks_step(run_dir)
    victim = ranks[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: read_json(run_dir / "exit.json"), 60, what="torchrun to end")

    def records() -> list[dict]:
        return [json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()]

    death = wait_until(lambda: next((r for r in records() if r.get("alert_kind") == "rank_death"), None), 15,
                       what="the rank_death shown")
    same = wait_until(lambda: [r for r in records() if r["kind"] == "delivery" and r["alert_id"] == death["id"]], 20,
                      what="the rank_death's delivery record")
    assert [r["outcome"] for r in same] == ["same_cause"] and "watchdog" in same[0]["detail"], same
    got = wait_until(lambda: [p for p in (json.loads(x) for x in pings.read_text().splitlines())]
                     if pings.exists() else None, 20, what="the death's page")
    assert [p["kind"] for p in got] == ["watchdog"], got
    end = next(r["message"] for r in records() if r.get("alert_kind") == "watchdog")
    assert f"root cause: rank 1 (pid {victim}) killed by SIGKILL" in end, end


@pytest.mark.slow
def test_a_clean_two_rank_run_raises_no_rank_alert(tmp_path: Path):
    run_dir = _launch_ddp(tmp_path, 20)
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 90, what="the end")
    assert ex["returncode"] == 0
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert sorted(r["rank"] for r in snap["ranks"]) == [0, 1]
    # each rank's exit as the kernel gave it, or unknown when torchrun reaped it first: never a failure
    assert all((r["returncode"], r["exit_source"]) in ((0, "kernel"), (None, None)) and not r["signal"]
               for r in snap["ranks"]), snap["ranks"]
    assert [a["kind"] for a in snap["alerts"]] == []


RESTART_PY = '''\
import os, signal, time
import torch, torch.distributed as dist
rank, world, restart = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# a store prefix per restart: a plain init_process_group("gloo") after a restart read the first
# attempt's addresses from torchrun's store (torch 2.13: "connectFullMesh failed", often a hang)
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{restart}", store), rank=rank, world_size=world)
print(f"rank {rank} pid {os.getpid()} restart {restart} up", flush=True)
for step in range(1, 31):
    if rank == 1 and restart == 0 and step == 10:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(10))
    time.sleep(0.05)
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_a_rank_death_torchrun_restarts_from_is_named_with_the_restart_count(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"restart.py": RESTART_PY})
    r = stepwatch("launch", "--no-tui", "--name", "rs", "--", TORCHRUN, "--nproc_per_node", "2", "--max-restarts", "2",
                  "--monitor-interval", "0.1", "restart.py", cwd=repo, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "rs"
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 120, what="the run to end")
    assert ex["returncode"] == 0  # the restarted workers finished
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert snap["rank_restarts"] == {"count": 1, "max": 2}, snap["rank_restarts"]
    ones = [x for x in snap["ranks"] if x["rank"] == 1]
    assert [x["restart_count"] for x in ones] == [0, 1] and ones[0]["signal"] == "SIGKILL", ones
    deaths = [a for a in snap["alerts"] if a["kind"] == "rank_death"]
    assert len(deaths) == 1, deaths
    assert deaths[0]["message"].startswith(f"rank 1 (local_rank 1, pid {ones[0]['pid']}) killed by SIGKILL"), deaths
    assert "torchrun restarted the workers (restart 1 of at most 2)" in deaths[0]["message"], deaths
    text = stepwatch("status", str(run_dir)).stdout
    assert "torchrun restarted the workers 1 time (at most 2)" in text, text
    assert f"rank 1 pid {ones[1]['pid']} " in text and f"pid {ones[0]['pid']}" not in text.split("ranks:")[1].split("\n")[0]
    shown = _tui_ranks(run_dir)  # the screen's ranks line: the restarted rank's latest process and the count
    assert "torchrun restarted the workers 1 time (at most 2)" in " ".join(shown.split()), shown
    assert f"1 pid {ones[1]['pid']}" in shown and f"pid {ones[0]['pid']}" not in shown, shown


@pytest.mark.slow
def test_a_frozen_rank_does_not_outlive_stop(tmp_path: Path):
    run_dir = _launch_ddp(tmp_path, 600)
    ranks = _wait_both_ranks_step(run_dir)
    os.kill(ranks[1]["pid"], signal.SIGSTOP)
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 0 and "stopped as requested" in r.stdout, (r.stdout, r.stderr)
    recorded = [(p["pid"], p["create_time"]) for p in read_json(run_dir / "procs.json")["processes"]]
    assert len(recorded) >= 3  # torchrun and both ranks

    def gone(pid: int, ctime: float) -> bool:
        try:
            p = psutil.Process(pid)
            return abs(p.create_time() - ctime) > 0.5 or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(lambda: all(gone(*x) for x in recorded), 10, what="every process of the run to be gone")
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert snap["survivors"] == [] and not [a for a in snap["alerts"] if a["kind"] == "rank_death"]


DDP_TEL_PY = '''\
import os, sys, time
import torch, torch.distributed as dist
from stepwatch.telemetry import StepTelemetry
dist.init_process_group("gloo")
rank = dist.get_rank()
slow_rank, steps = int(sys.argv[1]), int(sys.argv[2])
tel = StepTelemetry(max_steps=steps)  # STEPWATCH_ALL_RANKS=1: every rank its own file
tel.step_begin()
for step in range(1, steps + 1):
    dist.all_reduce(torch.ones(10))
    time.sleep(0.05)
    if rank == slow_rank:
        time.sleep(0.2)  # this rank alone: its steps end later than the other's
    tel.step_end()
print(f"rank {rank} done", flush=True)
time.sleep(4)  # every rank still running while the views judge it (each reads alive; py-spy dumps rank 1)
tel.close()
dist.destroy_process_group()
'''


def _launch_tel(tmp_path: Path, slow_rank: int, steps: int) -> Path:
    repo = make_repo(tmp_path / "repo", {"ddp_tel.py": DDP_TEL_PY})
    r = stepwatch("launch", "--no-tui", "--name", "tel", "--", TORCHRUN, "--nproc_per_node", "2", "ddp_tel.py",
                  str(slow_rank), str(steps), cwd=repo, env={"OMP_NUM_THREADS": "1", "STEPWATCH_ALL_RANKS": "1"})
    assert r.returncode == 0, r.stderr
    return repo / "runs" / "tel"


@pytest.mark.slow
@pytest.mark.parametrize("slow_rank", [1, -1], ids=["rank-1-slowed", "control-none-slowed"])
def test_each_rank_has_its_own_steps_and_a_slowed_rank_is_a_straggler(tmp_path: Path, slow_rank: int):
    run_dir = _launch_tel(tmp_path, slow_rank, 30)
    wait_until(lambda: all(f"rank {r} done" in (run_dir / "train.log").read_text() for r in (0, 1)), 90,
               what="both ranks to end their steps")
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert snap["state"] == "running", snap["state"]
    by_rank = {r["rank"]: r for r in snap["ranks"]}
    assert sorted(by_rank) == [0, 1] and (run_dir / "events.rank1.jsonl").exists()
    for rank in (0, 1):
        st = by_rank[rank]["steps"]
        assert st["last_step"] == 30 and st["n"] == 29 and st["p50"] > 0.04 and st["p99"] >= st["p50"], (rank, st)
        assert 0 <= time.time() - st["last_step_end_unix"] < 60 and st["source"] == "events", st  # when it ended
        assert by_rank[rank]["alive"] is True and by_rank[rank]["pid"] > 0
    sg = snap["straggler"]
    kinds = [a["kind"] for a in snap["alerts"]]
    if slow_rank == 1:
        assert sg["state"] == "flagged" and sg["rank"] == 1 and sg["lag_s"] > 0.15, sg
        msg = next(a["message"] for a in snap["alerts"] if a["kind"] == "straggler")
        assert msg.startswith(f"straggler: rank 1 (pid {by_rank[1]['pid']}) ends its steps a median"), msg
        text = stepwatch("status", str(run_dir)).stdout
        assert "straggler flagged (rank 1 ends its steps" in text and "rank 1 pid" in text and "n=29" in text, text
        rec = wait_until(lambda: next((json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()
                                       if '"kind":"stack"' in ln), None), 30, interval_s=0.2, what="the straggler's stack")
        assert rec["pid"] == by_rank[1]["pid"] and "ddp_tel.py" in rec["stack"], rec  # py-spy's dump of rank 1
    else:
        assert sg["state"] == "ok" and sg["lag_s"] < 0.05, sg
        assert "straggler" not in kinds, kinds
    wait_until(lambda: read_json(run_dir / "exit.json"), 60, what="the end")


def _two_rank_run(run_dir: Path, rank1_steps: int = 20) -> None:
    """An ended 2-rank run as its supervisor and emitter leave it: procs.json with both ranks (the
    pids long gone), each rank's events file (rank 0: 20 steps, rank 1: ``rank1_steps``), rank 1
    ending each step 0.2 s after rank 0."""
    import subprocess

    from stepwatch.monitors.runfiles import write_json_atomic

    run_dir.mkdir(parents=True)
    dead = [subprocess.Popen(["true"]) for _ in range(3)]
    for d in dead:
        d.wait()
    t0 = 1_780_000_000.0
    for rank, name in ((0, "events.jsonl"), (1, "events.rank1.jsonl")):
        lines = [{"v": 1, "kind": "run_start", "t": t0, "step": None, "rank": rank, "world_size": 2, "pid": dead[rank + 1].pid}]
        for s in range(1, (21 if rank == 0 else rank1_steps + 1)):
            end = t0 + s * 0.3 + 0.2 * rank
            lines.append({"v": 1, "kind": "step", "t": end, "step": s, "rank": rank, "dt": 0.3, "step_begin": end - 0.3,
                          "step_end": end, "flags": ["first"] if s == 1 else []})
        (run_dir / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    procs = [{"pid": dead[0].pid, "create_time": 1.0, "ppid": 1, "rank": None, "ended_at_unix": t0 + 7, "exit": None},
             *({"pid": dead[r + 1].pid, "create_time": 1.0, "ppid": dead[0].pid, "rank": r, "local_rank": r,
                "ended_at_unix": t0 + 7, "exit": {"returncode": 0, "signal": None}} for r in (0, 1))]
    write_json_atomic(run_dir / "procs.json", {"v": 1, "processes": procs})
    (run_dir / "train.log").write_text("done\n")
    gone = {"pid": dead[0].pid, "create_time": 1.0}
    write_json_atomic(run_dir / "run.json", {"v": 1, "name": run_dir.name, "attempt": 1, "argv": ["torchrun"],
                                             "cwd": str(run_dir), "launched_at_unix": t0, "supervisor": gone,
                                             "process": {**gone, "pgid": gone["pid"]}})
    write_json_atomic(run_dir / "exit.json", {"returncode": 0, "ended_at_unix": t0 + 8, "duration_s": 8.0})


def _tui_ranks(run_dir: Path) -> str:
    """The run screen's ranks line, from the real app on ``run_dir``."""
    import asyncio

    from stepwatch.tui.app import StepwatchApp

    async def shown() -> str:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(160, 45)) as pilot:
            await pilot.pause(0.1)
            wait = 0
            while getattr(app.screen, "snap", {"run_dir": None})["run_dir"] is None and wait < 100:
                await pilot.pause(0.05)
                wait += 1
            await pilot.pause(0.2)
            return str(app.screen.query_one("#ranks").render())

    return asyncio.run(shown())


def test_the_tui_shows_every_rank_and_the_straggler(tmp_path: Path):
    run_dir = tmp_path / "runs" / "two"
    _two_rank_run(run_dir, rank1_steps=18)
    text = _tui_ranks(run_dir)
    assert "ranks 0 pid" in text and "| 1 pid" in text, text
    zero, one = text.split("| 1 pid")[0], text.split("| 1 pid")[1]
    assert "step 20" in zero and "step 18" in one and "step 20" not in one, text  # each rank its own numbers
    assert text.count("STRAGGLER") == 1 and text.index("STRAGGLER") > text.index("| 1 pid"), text
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert [(r["rank"], r["steps"]["n"]) for r in snap["ranks"]] == [(0, 19), (1, 17)]


def test_a_relaunch_rotates_every_ranks_events_file(tmp_path: Path):
    """One file describes one attempt, per rank too: events.rank1.jsonl is renamed with the attempt's
    stamp like events.jsonl, so the next attempt's rank 1 starts a file of its own."""
    from stepwatch.launcher.rotate import rotate

    run_dir = tmp_path / "runs" / "two"
    _two_rank_run(run_dir)
    (run_dir / "events.rank12.jsonl").write_text("{}\n")
    (run_dir / "events.rankx.jsonl").write_text("{}\n")  # not a rank's file: left alone
    (run_dir / "logsteps.rank3.jsonl").write_text("{}\n")  # rank 3's log-derived steps
    renamed = {src.name: dst.name for src, dst in rotate(run_dir)}
    stamp = renamed["run.json"][len("run."):-len(".json")]
    assert renamed["events.rank1.jsonl"] == f"events.{stamp}.rank1.jsonl"
    assert renamed["logsteps.rank3.jsonl"] == f"logsteps.{stamp}.rank3.jsonl"
    assert renamed["events.rank12.jsonl"] == f"events.{stamp}.rank12.jsonl"
    assert not (run_dir / "events.rank1.jsonl").exists() and (run_dir / "events.rankx.jsonl").exists()


INDEPENDENT_PY = '''\
import os, sys, time
import torch.distributed as dist
from stepwatch.telemetry import StepTelemetry
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} pid {os.getpid()} up", flush=True)
tel = StepTelemetry(max_steps=400)
tel.step_begin()
def train_step():
    time.sleep(0.05)
for step in range(1, 401):  # no collective per step: one rank can stop while the other goes on
    train_step()
    tel.step_end()
tel.close()
'''


@pytest.mark.slow
@pytest.mark.parametrize("freeze", [True, False], ids=["rank-1-frozen", "control-none-frozen"])
def test_a_rank_that_stops_stepping_while_the_other_goes_on_is_named_with_its_stack(tmp_path: Path, freeze: bool):
    repo = make_repo(tmp_path / "repo", {"indep.py": INDEPENDENT_PY})
    r = stepwatch("launch", "--no-tui", "--name", "indep", "--", TORCHRUN, "--nproc_per_node", "2", "indep.py",
                  cwd=repo, env={"OMP_NUM_THREADS": "1", "STEPWATCH_ALL_RANKS": "1"})
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "indep"
    wait_until(lambda: (run_dir / "events.rank1.jsonl").exists()
               and (run_dir / "events.rank1.jsonl").read_text().count('"step"') >= 20, 60, what="rank 1 stepping")
    ranks = _ranks(run_dir)
    victim = ranks[1]["pid"]
    try:
        if freeze:
            os.kill(victim, signal.SIGSTOP)
        t0 = time.time()

        def judged():
            snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
            return snap if time.time() - t0 > 5.5 and snap["state"] == "running" else None

        snap = wait_until(judged, 30, interval_s=0.3, what="5 s past the stall floor with the run still going")
        stuck = [a for a in snap["alerts"] if a["kind"] == "stuck_rank"]
        if not freeze:
            assert stuck == [] and snap["straggler"]["stuck"] == [], snap["straggler"]
            assert snap["liveness"]["frozen"]["state"] == "ok" and not [a for a in snap["alerts"] if a["kind"] == "frozen"]
            return
        assert len(stuck) == 1 and stuck[0]["message"].startswith(f"rank 1 (pid {victim}) stopped stepping"), stuck
        frozen = [a for a in snap["alerts"] if a["kind"] == "frozen"]  # held stopped: named by rank within 5 s
        assert len(frozen) == 1 and f"pid {victim} (rank 1, " in frozen[0]["message"], frozen
        assert "before rank 0's step" in stuck[0]["message"]
        rec = wait_until(lambda: next((json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()
                                       if '"kind":"stack"' in ln), None), 30, interval_s=0.2, what="the rank's stack")
        assert rec["pid"] == victim and "train_step (indep.py:" in rec["stack"], rec["stack"][-1500:]
        text = stepwatch("status", str(run_dir)).stdout
        assert "stack (py-spy):" in text and "train_step (indep.py:" in text, text
        details = _tui_alert_details(run_dir)  # the operator's `d` on the run screen shows it too
        assert f"rank 1 (pid {victim}) stopped stepping" in details, details
        assert "its Python stack (py-spy" in details and "train_step (indep.py:" in details, details
        assert details.index("train_step (indep.py:") > details.index(f"rank 1 (pid {victim}) stopped"), details
        # then rank 0 stops too: a whole-run stall, naming the ranks by their last step, rank 1 first
        os.kill(ranks[0]["pid"], signal.SIGSTOP)
        stall = wait_until(lambda: next((a for a in json.loads(stepwatch("status", str(run_dir), "--json").stdout)
                                         ["alerts"] if a["kind"] == "stall"), None), 40, interval_s=0.5,
                           what="the whole-run stall")
        words = stall["message"][stall["message"].index("; ranks by last step: "):]
        first, second = words[len("; ranks by last step: "):].split(", ")[:2]
        assert first.startswith("1 at step ") and first.endswith(f"(pid {victim})"), words
        assert second.startswith("0 at step ") and f"(pid {ranks[0]['pid']})" in second, words
        assert int(first.split()[3]) < int(second.split()[3]), words  # rank 1 stopped steps earlier
    finally:
        for pid in (victim, ranks[0]["pid"]) if freeze else ():
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGCONT)
        stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)


def _tui_alert_details(run_dir: Path) -> str:
    """The text of the run screen's alert details (the ``d`` key), from the real app on ``run_dir``."""
    import asyncio

    from textual.widgets import Static

    from stepwatch.tui.app import StepwatchApp
    from stepwatch.tui.screens.modals import AlertDetails

    async def shown() -> str:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(120, 50)) as pilot:
            for _ in range(200):
                if (getattr(app.screen, "snap", None) or {}).get("alerts"):
                    break
                await pilot.pause(0.05)
            await pilot.press("d")
            for _ in range(100):
                if isinstance(app.screen, AlertDetails):
                    break
                await pilot.pause(0.05)
            await pilot.pause(0.1)
            return str(app.screen.query_one("#alert-details").query_one(Static).render())

    return asyncio.run(shown())


BARS_PY = '''\
import os, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
n = 60 if rank == 0 else 200  # rank 1 counts further and faster: its counter is not the run's step
for _ in tqdm(range(n), mininterval=0):
    time.sleep(0.05 if rank == 0 else 0.01)
time.sleep(2)
'''


@pytest.mark.slow
def test_an_uninstrumented_run_with_rank_prefixed_bars_takes_rank_0s_step(tmp_path: Path):
    """torchrun --tee 3: every rank's tqdm bar in train.log behind ``[default<N>]:``; rank 1's bar runs
    to 200 while rank 0's goes to 60. The headline step is rank 0's, during the run and at its end."""
    repo = make_repo(tmp_path / "repo", {"bars.py": BARS_PY})
    r = stepwatch("launch", "--no-tui", "--name", "bars", "--", TORCHRUN, "--nproc_per_node", "2", "--tee", "3",
                  "bars.py", cwd=repo, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "bars"
    seen = []
    while read_json(run_dir / "exit.json") is None and len(seen) < 200:
        snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
        seen.append((snap["step"]["global_step"], snap["step"]["max_steps"]))
    assert "[default1]:" in (run_dir / "train.log").read_text()  # rank 1's bar is there, prefixed
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert (snap["step"]["global_step"], snap["step"]["max_steps"]) == (60, 60), snap["step"]
    assert all(g is None or (g <= 60 and m in (None, 60)) for g, m in seen), seen
    assert any(g is not None and g < 60 for g, _ in seen), seen  # it was read while running, too
    # each rank's own log-derived steps: the supervisor timed rank 1's prefixed bar apart from rank 0's
    by_rank = {r["rank"]: r for r in snap["ranks"]}
    assert sorted(by_rank) == [0, 1], snap["ranks"]
    st0, st1 = by_rank[0]["steps"], by_rank[1]["steps"]
    assert (st0["last_step"], st0["source"]) == (60, "log") and (st1["last_step"], st1["source"]) == (200, "log"), (st0, st1)
    assert st0["n"] > 20 and st1["n"] > 50 and st1["p50"] < st0["p50"], (st0, st1)  # rank 1 steps 5x faster
    assert (run_dir / "logsteps.rank1.jsonl").exists() and not (run_dir / "events.rank1.jsonl").exists()
    assert all(json.loads(ln)["rank"] == 1 for ln in (run_dir / "logsteps.rank1.jsonl").read_text().splitlines())


def test_each_prefixed_rank_gets_its_own_log_step_timer_and_rank_0_none():
    """The supervisor's per-rank timers take only lines behind a rank N > 0 prefix; an unprefixed
    line, rank 0's and an absurd rank number never start one."""
    from stepwatch.monitors.readers.textlog import Segment
    from stepwatch.monitors.watch.logsteps import RankLogTimers

    timers = RankLogTimers()
    out: dict[int, list] = {}
    for i in range(1, 6):
        at = 100.0 + i
        bar = "|" + "█" * i + " " * (5 - i) + "|"
        segs = [Segment(f"[default3]:{20 * i:3d}%{bar} {i}/5 [00:0{i}<00:00,  1.00it/s]", "\r", at_s=at, poll_seq=i),
                Segment(f"[rank2]: step {i} loss 0.{i}", "\n", at_s=at, poll_seq=i),
                Segment(f"{2 * i:3d}%{bar} {i}/50 [00:0{i}<00:00,  1.00it/s]", "\r", at_s=at, poll_seq=i),  # rank 0's
                Segment(f"[rank0]: step {i} loss 1.0", "\n", at_s=at, poll_seq=i),
                Segment(f"[rank123456]: step {i}", "\n", at_s=at, poll_seq=i)]
        for rank, recs in timers.feed_poll(segs, None).items():
            out.setdefault(rank, []).extend(recs)
    assert sorted(timers.timers) == [2, 3] and sorted(out) == [2, 3], (timers.timers, out)
    for rank in (2, 3):
        steps = [r for r in out[rank] if r["kind"] == "step"]
        assert [r["step"] for r in steps] == [2, 3, 4, 5] and {r["rank"] for r in out[rank]} == {rank}
        assert all(abs(r["dt"] - 1.0) < 1e-9 for r in steps), out[rank]
    # each rank's own metrics ride along as log records when they change: rank 2's loss, never rank 0's 1.0
    assert [r["logs"]["loss"] for r in out[2] if r["kind"] == "log"] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert not [r for r in out[3] if r["kind"] == "log"]  # a bar with no postfix: no metrics
    assert timers.timers[3].tracker.total == 5 and timers.timers[2].tracker.format == "step_line"


def test_a_cascade_noticed_in_the_wrong_order_still_starts_with_the_rank_that_was_not_torn_down():
    """On a busy machine the supervisor can read the torn-down rank's exit (torchrun's SIGTERM) before
    the one that caused it (CI saw it): the alert still starts with the SIGKILLed rank."""
    from stepwatch.monitors.snapshot.ranks import rank_alerts, root_cause_words

    def rank(n, pid, ended, sig):
        return {"rank": n, "local_rank": n, "pid": pid, "alive": False, "ended_at_unix": ended, "returncode": None,
                "signal": sig, "exit_source": "kernel", "root_cause": False, "after_stop": False,
                "restart_count": 0, "max_restarts": 0}

    snap = {"attempt": 1, "state": "exited", "straggler": {},
            "ranks": [rank(0, 100, 1_780_000_000.10, "SIGTERM"), rank(1, 101, 1_780_000_000.15, "SIGKILL")]}
    made = []
    rank_alerts(snap, lambda *a: made.append(a) or a, {})
    msg = made[0][4]
    assert msg.startswith("rank 1 (local_rank 1, pid 101) killed by SIGKILL") and "then rank 0 (pid 100) killed by SIGTERM" in msg
    assert root_cause_words(snap) == "; root cause: rank 1 (pid 101) killed by SIGKILL"
    snap["ranks"][1]["signal"] = "SIGTERM"  # all torn down alike: the earliest
    made.clear()
    rank_alerts(snap, lambda *a: made.append(a) or a, {})
    assert made[0][4].startswith("rank 0 (local_rank 0, pid 100) killed by SIGTERM")


EARLY_SAVE_PY = '''\
import os, sys, time
import torch
import torch.distributed as dist
from stepwatch.telemetry import StepTelemetry
dist.init_process_group("gloo")
rank = dist.get_rank()
steps = 300 if rank == 0 else 55  # rank 1's shard ends early; rank 0 goes on
tel = StepTelemetry(max_steps=300)  # the same plan on both: rank 1's data ran out
tel.step_begin()
for step in range(1, steps + 1):
    time.sleep(0.05)
    tel.step_end()
state = {"w": torch.zeros(256, 256)}
def save_shard():  # its own shard, saved silently: 8 s of CPU-busy serialisation (the stuck rank shows at ~3 s)
    t = time.monotonic()
    while time.monotonic() - t < 8:
        torch.save(state, f"shard{rank}.pt")
if rank == 1:
    save_shard()
tel.close()
'''


@pytest.mark.slow
def test_a_rank_whose_shard_ends_early_and_saves_it_silently_is_not_paged_stuck(tmp_path: Path):
    """Under torchrun, a rank whose shard ends early and then saves its own shard silently (4.5 s in the issue, 8 s
    here, CPU busy) before exiting 0 was paged stuck_rank 3 s after its last step (issue 44). Its stack is taken first: it
    shows the save, so the stuck rank is judged again after the save budget, by which time it has ended: no page."""
    pings = tmp_path / "pings.jsonl"
    toml = (f'name = "early"\ncommand = {json.dumps([TORCHRUN, "--nproc_per_node", "2", "early.py"])}\n'
            'env = { OMP_NUM_THREADS = "1", STEPWATCH_ALL_RANKS = "1" }\n'
            f"[alerts]\ncommand = {json.dumps([sys.executable, str(tmp_path / 'repo' / 'ping.py'), str(pings)])}\n")
    repo = make_repo(tmp_path / "repo", {"early.py": EARLY_SAVE_PY, "ping.py": PING_PY, "early.toml": toml,
                                         ".gitignore": "runs/\n*.pt\n"})
    r = stepwatch("launch", "--no-tui", "early.toml", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "early"
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 120, what="the run to end")
    assert ex["returncode"] == 0, ex
    recs = [json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()] \
        if (run_dir / "alerts.jsonl").exists() else []
    stuck = [x for x in recs if x.get("alert_kind") == "stuck_rank"]
    print("stuck shown:", [x["message"] for x in stuck], "deliveries:",
          [(x["alert_id"], x["outcome"], x["detail"][:80]) for x in recs if x["kind"] == "delivery"],
          "stacks:", [x["stack"][-600:] for x in recs if x["kind"] == "stack"])
    assert stuck, "the control: rank 1 stopped stepping while rank 0 went on, and it was shown"
    wait_until(lambda: [x for x in map(json.loads, (run_dir / "alerts.jsonl").read_text().splitlines())
                        if x["kind"] == "delivery" and x["alert_id"] == stuck[0]["id"]], 20,
               what="the stuck rank's delivery record")
    assert not pings.exists() or pings.read_text() == "", pings.read_text()  # no page at all
