"""A page means trouble, silence means health (issue 32), live: an un-instrumented loop that goes silent
in the middle of its run, three ways. A save it announces (``saving checkpoint to …``) is a saving phase
with a budget of its own: no stall, and the step after it is no step time. A silent stretch whose process
computes (a save that prints nothing) is busy but silent: shown as suspected, never paged before the busy
budget. The control: the same silence with the process idle is a stall, paged. System tier: real
supervisors, real processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json

LOOP_PY = '''\
import sys, time
mode = sys.argv[1]
for i in range(1, 41):
    time.sleep(0.1)
    print(f"step {i} loss {1 / i:.4f}", flush=True)
if mode == "saveline":  # a checkpoint the loop announces, then 10 s of silence
    print("saving checkpoint to ckpt/step_40", flush=True)
    time.sleep(10)
elif mode == "busy":  # a save that prints nothing, the CPU busy for 10 s
    t = time.monotonic()
    while time.monotonic() - t < 10:
        sum(range(1000))
else:  # the control: 10 s of silence with the process idle (stuck in a wait)
    time.sleep(10)
for i in range(41, 61):
    time.sleep(0.1)
    print(f"step {i} loss {1 / i:.4f}", flush=True)
'''


def _status(run_dir: Path) -> dict:
    return json.loads(stepwatch("status", str(run_dir), "--json").stdout)


def _recorded_kinds(run_dir: Path) -> list[str]:
    """The alerts the supervisor recorded (and so delivered) for the run."""
    f = run_dir / "alerts.jsonl"
    lines = f.read_text().splitlines() if f.exists() else []
    return [rec.get("alert_kind") for rec in map(json.loads, lines) if rec.get("kind") == "alert"]


@pytest.mark.slow
def test_an_announced_save_and_a_busy_silence_page_nothing_and_an_idle_silence_is_a_stall(tmp_path: Path):
    toml = f'name = "floor"\ncommand = [{json.dumps(sys.executable)}, "loop.py", "idle"]\n[stall]\nstep_floor_s = 30\n'
    repo = make_repo(tmp_path / "repo", {"loop.py": LOOP_PY, "floor.toml": toml})
    runs = {}
    for mode in ("saveline", "busy", "idle", "floor"):  # floor: the idle run, its step budget's floor set to 30 s
        argv = ["floor.toml"] if mode == "floor" else ["--name", mode, "--", sys.executable, "loop.py", mode]
        r = stepwatch("launch", "--no-tui", *argv, cwd=repo)
        assert r.returncode == 0, r.stderr
        runs[mode] = repo / "runs" / mode
    # in the silence, long past the step budget (max(10 x p99, 3 s)): what each run's supervisor judges
    during = {}
    for mode, run_dir in runs.items():
        during[mode] = wait_until(lambda d=run_dir: (s := _status(d))["state"] == "running"
                                  and (s["stall"].get("current_step_elapsed_s") or 0) > 6 and s or None,
                                  60, interval_s=0.3, what=f"the {mode} run 6 s into its silence")
    sav, busy, idle = during["saveline"]["stall"], during["busy"]["stall"], during["idle"]["stall"]
    assert sav["state"] == "ok" and "within its budget" in sav["reason"], sav
    assert during["saveline"]["phase"]["name"] == "saving" and during["saveline"]["phase"]["source"] == "log"
    assert busy["state"] == "suspected" and "busy but silent" in busy["reason"], busy
    assert idle["state"] == "stalled", idle  # the control: the same silence, idle, is a stall
    floor = during["floor"]["stall"]  # [stall] step_floor_s = 30: the same idle silence is within its budget
    assert floor["state"] == "ok" and "stalled after 30.0 s" in floor["reason"], floor
    signals = {mode: during[mode]["liveness"]["signals_s"] for mode in during}  # what each verdict stands on
    assert all(sig["output"] > 5 and sig["step"] > 5 for sig in signals.values()), signals
    # a one-shot status knows the CPU moves now (0 s), never for how long it has not (unknown, not 0)
    assert signals["busy"]["cpu"] == 0.0 and signals["idle"]["cpu"] is None is signals["saveline"]["cpu"], signals
    wait_until(lambda: "stall" in _recorded_kinds(runs["idle"]), 20, what="the idle run's stall page")
    for mode, run_dir in runs.items():
        ex = wait_until(lambda d=run_dir: read_json(d / "exit.json"), 60, what=f"the {mode} run to end")
        assert ex["returncode"] == 0, ex
    assert not {"stall"} & {*_recorded_kinds(runs["saveline"]), *_recorded_kinds(runs["busy"]),
                            *_recorded_kinds(runs["floor"])}
    end = _status(runs["saveline"])
    records = [json.loads(ln) for ln in (runs["saveline"] / "logsteps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "save" in r["flags"]] == [41], records[39:42]  # the save's interval
    assert end["step_seconds"]["p50"] == pytest.approx(0.1, rel=0.1) and end["step_seconds"]["max"] < 1.0, \
        end["step_seconds"]  # the 10 s save is no step time
    assert end["fallback"]["state"] != "suspected", end["fallback"]
    for mode, flag in (("busy", "silent"), ("idle", "idle")):  # what the supervisor saw, on the step ending it
        recs = [json.loads(ln) for ln in (runs[mode] / "logsteps.jsonl").read_text().splitlines()]
        assert [r["step"] for r in recs if flag in r["flags"]] == [41], (mode, recs[39:42])
        assert _status(runs[mode])["fallback"]["state"] == "ok", (mode, _status(runs[mode])["fallback"])


BUSY_FOREVER_PY = '''\
import time
def spin_in_a_save_that_never_ends():
    while True:
        sum(range(1000))
for i in range(1, 31):
    time.sleep(0.1)
    print(f"step {i} loss {1 / i:.4f}", flush=True)
spin_in_a_save_that_never_ends()
'''

UNREAD_PY = '''\
import time
for i in range(10_000):
    time.sleep(0.2)
    print(f"tick {i}: nothing any shape reads", flush=True)
'''


@pytest.mark.slow
def test_a_busy_loop_that_stops_stepping_pages_at_its_busy_budget_with_its_stack_and_a_stop_with_no_shape_pages(
        tmp_path: Path):
    """Busy but silent for good: with ``[stall] busy_floor_s = 5`` the stall pages 5 s after the step began, and
    the page names the function the process spins in (py-spy). A process whose log no shape reads, held
    stopped: a ``frozen`` page naming its pid within 3 s + 2 s."""
    import os
    import signal
    import time

    toml = (f'name = "spin"\ncommand = [{json.dumps(sys.executable)}, "spin.py"]\n[stall]\nbusy_floor_s = 5\n')
    repo = make_repo(tmp_path / "repo", {"spin.py": BUSY_FOREVER_PY, "unread.py": UNREAD_PY, "spin.toml": toml})
    assert stepwatch("launch", "--no-tui", "spin.toml", cwd=repo).returncode == 0
    assert stepwatch("launch", "--no-tui", "--name", "unread", "--", sys.executable, "unread.py", cwd=repo).returncode == 0
    spin, unread = repo / "runs" / "spin", repo / "runs" / "unread"
    try:
        wait_until(lambda: (unread / "train.log").exists() and "tick 3" in (unread / "train.log").read_text(), 30,
                   what="the unread run printing")
        run = read_json(unread / "run.json")
        assert run is not None
        pid = run["process"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        frozen = wait_until(lambda: "frozen" in _recorded_kinds(unread) or None, 15, interval_s=0.2, what="frozen")
        took = time.monotonic() - t0
        recs = [json.loads(ln) for ln in (unread / "alerts.jsonl").read_text().splitlines()]
        msg = next(r["message"] for r in recs if r.get("alert_kind") == "frozen")
        print(f"frozen page {took:.1f} s after SIGSTOP: {msg}")
        assert frozen and took <= 5.0 and f"pid {pid} (" in msg, (took, msg)
        os.kill(pid, signal.SIGCONT)
        stack = wait_until(lambda: next((json.loads(ln) for ln in (spin / "alerts.jsonl").read_text().splitlines()
                                         if '"kind":"stack"' in ln), None) if (spin / "alerts.jsonl").exists() else None,
                           40, interval_s=0.3, what="the spinning run's stall and its stacks")
        stall = next(json.loads(ln) for ln in (spin / "alerts.jsonl").read_text().splitlines()
                     if '"alert_kind":"stall"' in ln)
        print(f"busy stall: {stall['message']} · stacks: {stack['summary']}")
        assert "busy but silent for" in stall["message"] or "alive but stuck" in stall["message"], stall
        assert "spin_in_a_save_that_never_ends" in stack["summary"], stack
    finally:
        for d in (spin, unread):
            stepwatch("stop", str(d), "--grace", "2", timeout=60)
