"""The supervisor watches: log step times taken where the bytes arrive, every detector
with no view attached, alerts recorded once in alerts.jsonl and delivered by the run's owner.

Real processes throughout: un-instrumented scripts printing a real tqdm bar, launched by the real
CLI; a real local HTTP endpoint for the push; the runs' own record of their true step times.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import git, make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.stats.nearest_rank import nearest_rank

#: An un-instrumented training loop: a tqdm bar on stderr (tqdm's defaults), its true step ends
#: recorded by itself (perf_counter, then wall clock) into TRUTH, one JSON list at the end.
TQDM_PY = r"""
import json, os, sys, time
from tqdm import tqdm
steps, dt, slow_after, slow_dt, truth = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
tail_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
ends = []
bar = tqdm(total=steps)
t0 = time.time()
for i in range(1, steps + 1):
    # the work: a jitter of +-20 % around dt, the same every run
    time.sleep((slow_dt if slow_after and i > slow_after else dt) * (0.8 + 0.4 * ((i * 7919) % 11) / 10))
    bar.update(1)
    ends.append(time.time())
    with open(truth + ".tmp", "w") as f:  # whole or not at all: the test reads it while the run goes on
        json.dump([t0] + ends, f)
    os.replace(truth + ".tmp", truth)
bar.close()
print("{'train_runtime': '1', 'train_loss': '0.5'}", flush=True)
time.sleep(tail_s)  # a final save, quiet in the log
print("done", flush=True)
"""

#: Prints its alerts into OUT with the time they arrived (the [alerts] command).
PING_PY = r"""
import json, os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"t": time.time(), "id": os.environ["STEPWATCH_ALERT_ID"],
                        "kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"],
                        "level": os.environ["STEPWATCH_ALERT_LEVEL"]}) + "\n")
"""


#: Prints lines no shape reads (no step, no bar): only the process itself can say it is frozen.
SHAPELESS_PY = "import time\nfor i in range(6000):\n    print(f'hello {i}', flush=True)\n    time.sleep(0.05)\n"


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "harness", {"tq.py": TQDM_PY, "ping.py": PING_PY, "shapeless.py": SHAPELESS_PY,
                                            "crash.py": "import sys\nprint('failing', flush=True)\nsys.exit(3)\n"})


def launch_config(repo: Path, name: str, argv: list[str], alerts: dict | None = None) -> Path:
    """Launch from a committed run config (so its [alerts] table travels in run.json)."""
    lines = [f"name = {json.dumps(name)}", f"command = {json.dumps(argv)}"]
    if alerts:
        lines.append("[alerts]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in alerts.items()]
    (repo / f"{name}.toml").write_text("\n".join(lines) + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"config {name}")
    r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo)
    assert r.returncode == 0, r.stderr
    return repo / "runs" / name


def status(run_dir: Path) -> dict:
    r = stepwatch("status", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def true_step_seconds(truth: Path) -> list[float]:
    """The run's own step durations, first step excluded (as stepwatch excludes it)."""
    ends = json.loads(truth.read_text())
    dts = [b - a for a, b in zip(ends, ends[1:])]
    return dts[1:]


def alert_records(run_dir: Path, kind: str = "alert") -> list[dict]:
    p = run_dir / "alerts.jsonl"
    if not p.exists():
        return []
    return [r for r in map(json.loads, p.read_text().splitlines()) if r["kind"] == kind]


def pings(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def within(got: float, want: float, share: float) -> bool:
    return abs(got - want) <= share * want


@pytest.mark.slow
def test_log_step_times_at_a_quarter_second_match_the_runs_own_within_5_percent(harness: Path, tmp_path: Path):
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "quarter", [sys.executable, "tq.py", "40", "0.25", "0", "0", str(truth)])
    # during the run: against the run's own first n step times
    snap = wait_until(lambda: (s := status(run_dir))["step_seconds"]["n"] >= 15 and s, 30, what="15 timed steps")
    assert snap["step"]["timing"] == "per_update" and snap["step"]["source"] == "log", snap["step"]
    n = snap["step_seconds"]["n"]
    so_far = sorted(wait_until(lambda: len(d := true_step_seconds(truth)) >= n and d, 5, what="the truth")[:n])
    for p in ("p50", "p99"):
        assert within(snap["step_seconds"][p], nearest_rank(so_far, int(p[1:])), 0.05), (p, snap["step_seconds"], so_far)
    wait_until(lambda: read_json(run_dir / "exit.json"), 30, what="the run to end")
    final = status(run_dir)
    truth_dts = sorted(true_step_seconds(truth))
    got = final["step_seconds"]
    assert got["n"] == len(truth_dts) == 39, (got, len(truth_dts))
    assert final["step"]["timing"] == "per_update", final["step"]
    for p in ("p50", "p99"):
        assert within(got[p], nearest_rank(truth_dts, int(p[1:])), 0.05), (p, got[p], truth_dts)
    # the same figures in watch's words and in the TUI's: one source for every view
    w = stepwatch("watch", str(run_dir), "--plain")
    assert final["step_line"] in w.stdout, (final["step_line"], w.stdout)
    assert "one progress update per step" in stepwatch("status", str(run_dir)).stdout
    assert tui_step_line(run_dir).startswith(final["step_line"])


def tui_step_line(run_dir: Path) -> str:
    """What the attached TUI's step panel shows (Pilot, the real app)."""
    import asyncio

    from stepwatch.tui.app import StepwatchApp

    async def go() -> str:
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(160, 45)) as pilot:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                w = app.screen.query_one("#step-line")
                text = str(w.render())
                if text.startswith("n=") and not text.startswith("n=0 "):
                    return text
                await pilot.pause(0.05)
            return text

    return asyncio.run(go())


@pytest.mark.slow
def test_log_step_times_at_20_ms_share_the_updates_and_say_so(harness: Path, tmp_path: Path):
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "fast", [sys.executable, "tq.py", "300", "0.02", "0", "0", str(truth)])
    wait_until(lambda: read_json(run_dir / "exit.json"), 60, what="the run to end")
    final = status(run_dir)
    truth_dts = sorted(true_step_seconds(truth))
    assert final["step"]["timing"] == "shared", final["step"]
    assert within(final["step_seconds"]["p50"], statistics.median(truth_dts), 0.10), (final["step_seconds"],
                                                                                     statistics.median(truth_dts))
    recs = [json.loads(ln) for ln in (run_dir / "logsteps.jsonl").read_text().splitlines()]
    assert any(r["timing"] == "shared" and r["steps_in_update"] > 1 for r in recs)
    assert [r["step"] for r in recs] == list(range(recs[0]["step"], recs[-1]["step"] + 1))  # each step once


@pytest.mark.slow
def test_with_no_view_a_killed_child_reaches_the_alerts_command_within_2_s(harness: Path, tmp_path: Path):
    out = tmp_path / "pings.jsonl"
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "killed", [sys.executable, "tq.py", "600", "0.1", "0", "0", str(truth)],
                            alerts={"command": [sys.executable, str(harness / "ping.py"), str(out)]})
    wait_until(lambda: truth.exists(), 20, what="the run's first step")
    pid = read_json(run_dir / "run.json")["process"]["pid"]
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    got = wait_until(lambda: [p for p in pings(out) if p["kind"] == "watchdog"], 10, what="the watchdog ping")
    assert got[0]["t"] - t_kill < 2.0, got[0]["t"] - t_kill
    assert "SIGKILL" in got[0]["message"] and got[0]["level"] == "error"
    (rec,) = [r for r in alert_records(run_dir) if r["alert_kind"] == "watchdog"]
    assert rec["evidence"]["signal"] == "SIGKILL"
    deliveries = wait_until(lambda: alert_records(run_dir, "delivery"), 10, what="the delivery record")
    assert [(d["alert_id"], d["channel"], d["outcome"]) for d in deliveries] == [(rec["id"], "command", "delivered")]
    snap = status(run_dir)
    (al,) = [a for a in snap["alerts"] if a["kind"] == "watchdog"]
    assert al["recorded"] and al["delivered"]["command"]["outcome"] == "delivered"


@pytest.mark.slow
def test_a_child_held_stopped_for_60_s_pages_once_frozen_its_stall_shown_as_evidence_then_one_resolved(
        harness: Path, tmp_path: Path):
    """One cause, one page (issue 44): SIGSTOP for 60 s makes the frozen alert and the stall it causes. With no view
    open, both are shown (alerts.jsonl) and the [alerts] command runs once, for ``frozen``; the stall's delivery
    record says it is that page's evidence; SIGCONT gives one ``resolved``. The code before paged the stall too, in
    the same second, and then two resolutions."""
    out = tmp_path / "pings.jsonl"
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "frozen", [sys.executable, "tq.py", "6000", "0.12", "0", "0", str(truth)],
                            alerts={"command": [sys.executable, str(harness / "ping.py"), str(out)]})
    wait_until(lambda: status(run_dir)["stall"]["state"] == "ok", 30, what="the stall detector to judge")
    pid = read_json(run_dir / "run.json")["process"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    try:
        snap = status(run_dir)
        threshold = max(10 * snap["step_seconds"]["p99"], 3.0)
        stall = wait_until(lambda: next((r for r in alert_records(run_dir) if r["alert_kind"] == "stall"), None),
                           threshold + 10, what="the stall shown")
        # the step in progress began at the last step's end, before the SIGSTOP
        assert stall["t"] - t_stop < threshold + 2.0, (stall["t"] - t_stop, threshold)
        same = wait_until(lambda: [r for r in alert_records(run_dir, "delivery") if r["alert_id"] == stall["id"]
                                   and r["outcome"] == "same_cause"], 15, what="the stall's delivery record")
        frozen = next(r for r in alert_records(run_dir) if r["alert_kind"] == "frozen")
        assert frozen["id"] in same[0]["detail"], same
        wait_until(lambda: time.time() - t_stop >= 60 or None, 70, interval_s=1, what="60 s held stopped")
        assert [p["kind"] for p in pings(out)] == ["frozen"], pings(out)
    finally:
        os.kill(pid, signal.SIGCONT)
    got = wait_until(lambda: [p for p in pings(out) if p["kind"] == "resolved"], 20, what="the resolved ping")
    assert got[0]["id"] == f"{frozen['id']}-resolved", got
    wait_until(lambda: (s := status(run_dir))["stall"]["state"] == "ok" and not [
        a for a in s["alerts"] if a["active"]], 20, what="the run stepping again, no alert active")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: read_json(run_dir / "exit.json"), 10, what="the end")
    wait_until(lambda: [p for p in pings(out) if p["kind"] == "watchdog"], 20, what="the death's page")
    assert [p["kind"] for p in pings(out)] == ["frozen", "resolved", "watchdog"], pings(out)
    kinds = {a["kind"]: a for a in status(run_dir)["alerts"]}  # the stall stays shown (recorded, now inactive)
    assert kinds["stall"]["recorded"] and not kinds["stall"]["active"]


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Hook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_a_push_to_a_local_endpoint_arrives_with_the_alerts_text(harness: Path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received = []
    try:
        run_dir = launch_config(harness, "pushed", [sys.executable, "crash.py"],
                                alerts={"urls": [f"json://127.0.0.1:{port}/hook"], "min_level": "warning"})
        got = wait_until(lambda: _Hook.received, 20, what="the push")
        assert "exited with code 3" in got[0]["message"] and "failing" in got[0]["message"], got
        assert "watchdog" in got[0]["title"]
        deliveries = wait_until(lambda: alert_records(run_dir, "delivery"), 10, what="the delivery record")
        assert deliveries[0]["channel"] == "json://127.0.0.1" and deliveries[0]["outcome"] == "delivered"
    finally:
        server.shutdown()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.slow
def test_a_failing_push_is_retried_recorded_and_never_delays_the_exit_record(harness: Path):
    run_dir = launch_config(harness, "refused", [sys.executable, "crash.py"],
                            alerts={"urls": [f"json://127.0.0.1:{_closed_port()}/hook"], "retries": 2})
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 20, what="exit.json")
    assert ex["returncode"] == 3
    d = wait_until(lambda: alert_records(run_dir, "delivery"), 30, what="the failed delivery")
    assert d[0]["outcome"] == "failed" and d[0]["attempts"] == 3
    snap = status(run_dir)
    (al,) = snap["alerts"]
    assert al["delivered"] == {"json://127.0.0.1": {"outcome": "failed", "detail": d[0]["detail"],
                                                    "attempts": 3, "t": d[0]["t"]}}


@pytest.mark.slow
def test_a_fallback_on_an_uninstrumented_run_is_flagged_from_the_log_alone(harness: Path, tmp_path: Path):
    truth = tmp_path / "truth.json"
    # 60 steps of ~0.06 s, then ~20x slower: a silent fallback to eager, seen only through tqdm
    run_dir = launch_config(harness, "fellback", [sys.executable, "tq.py", "66", "0.06", "60", "1.2", str(truth)])
    snap = wait_until(lambda: (s := status(run_dir))["fallback"]["state"] == "flagged" and s, 60,
                      what="the fallback flag")
    assert snap["step"]["source"] == "log" and snap["step"]["timing"] in ("per_update", "shared")
    # the onset is the first slow step, within one tqdm update of step 61 (steps sharing an update
    # share its interval, so the last fast step of that update reads slow with it)
    recs = [json.loads(ln) for ln in (run_dir / "logsteps.jsonl").read_text().splitlines()]
    k = max(r["steps_in_update"] for r in recs if r["step"] in (60, 61))
    assert 61 - k <= snap["fallback"]["onset_step"] <= 61, (snap["fallback"], k)
    recs = wait_until(lambda: [r for r in alert_records(run_dir) if r["alert_kind"] == "fallback"], 10,
                      what="the recorded fallback alert")
    assert recs[0]["evidence"]["fallback"]["state"] == "flagged"


@pytest.mark.slow
def test_a_steady_uninstrumented_run_is_judged_and_not_flagged(harness: Path, tmp_path: Path):
    """The negative control beside the fallback test (the same script, no slow steps)."""
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "steady", [sys.executable, "tq.py", "40", "0.06", "0", "0", str(truth)])
    wait_until(lambda: read_json(run_dir / "exit.json"), 30, what="the end")
    final = status(run_dir)
    assert final["fallback"]["state"] == "ok" and final["alerts"] == [], (final["fallback"], final["alerts"])
    assert alert_records(run_dir) == []


@pytest.mark.slow
def test_a_quiet_final_save_after_the_bar_completed_is_no_stall(harness: Path, tmp_path: Path):
    """Found by review: a healthy run's silent final save read as a stall (and was pushed)."""
    out = tmp_path / "pings.jsonl"
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "quiet-tail", [sys.executable, "tq.py", "20", "0.1", "0", "0", str(truth), "6"],
                            alerts={"command": [sys.executable, str(harness / "ping.py"), str(out)]})
    wait_until(lambda: read_json(run_dir / "exit.json"), 40, what="the end")
    sup = read_json(run_dir / "run.json")["supervisor"]
    wait_until(lambda: not _alive(sup["pid"]), 20, what="the supervisor's exit")
    assert alert_records(run_dir) == [] and pings(out) == [], alert_records(run_dir)
    assert status(run_dir)["alerts"] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
def test_with_the_supervisor_gone_views_stop_trusting_its_frozen_records(harness: Path, tmp_path: Path):
    """Found by review: after a SIGKILLed supervisor, views kept folding the frozen logsteps.jsonl
    (n stuck, a new false stall per step)."""
    truth = tmp_path / "truth.json"
    run_dir = launch_config(harness, "orphaned", [sys.executable, "tq.py", "80", "0.1", "0", "0", str(truth)])
    wait_until(lambda: status(run_dir)["step_seconds"]["n"] >= 5, 30, what="a few timed steps")
    run = read_json(run_dir / "run.json")
    os.kill(run["supervisor"]["pid"], signal.SIGKILL)
    try:
        time.sleep(1.0)  # the child goes on; logsteps.jsonl no longer grows
        snap = status(run_dir)
        assert snap["supervisor_alive"] is False and snap["state"] == "running"
        assert snap["step"]["timing"] in (None, "approximate"), snap["step"]
        assert snap["stall"]["state"] != "stalled" and not [a for a in snap["alerts"] if a["kind"] == "stall"]
    finally:
        os.kill(run["process"]["pid"], signal.SIGKILL)


@pytest.mark.slow
def test_a_hung_alerts_command_is_killed_with_its_session_and_never_holds_the_exit(harness: Path, tmp_path: Path):
    """Found by review: a hung notifier kept the supervisor alive and left an orphan."""
    marker = f"sleep {600 + (os.getpid() % 100)}.5"
    run_dir = launch_config(harness, "hung", [sys.executable, "crash.py"],
                            alerts={"command": ["sh", "-c", marker], "command_timeout_s": 2})
    t0 = time.time()
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 20, what="exit.json")
    assert ex["returncode"] == 3 and ex["ended_at_unix"] - t0 < 10
    sup = read_json(run_dir / "run.json")["supervisor"]
    wait_until(lambda: not _alive(sup["pid"]), 30, what="the supervisor's exit")
    d = wait_until(lambda: alert_records(run_dir, "delivery"), 5, what="the delivery record")
    assert d[0]["outcome"] == "failed" and "session was killed" in d[0]["detail"]
    import psutil
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert left == [], left


@pytest.mark.slow
def test_push_urls_stay_out_of_the_files_other_users_read(harness: Path):
    secret = "json://user:s3cret-token@127.0.0.1:9/hook"
    run_dir = launch_config(harness, "secret", [sys.executable, "crash.py"], alerts={"urls": [secret]})
    wait_until(lambda: read_json(run_dir / "exit.json"), 20, what="exit.json")
    urls_file = run_dir / "alerts.urls.json"
    assert json.loads(urls_file.read_text())["urls"] == [secret]
    assert urls_file.stat().st_mode & 0o077 == 0
    run_text = (run_dir / "run.json").read_text()
    assert "s3cret" not in run_text and "json://127.0.0.1" in run_text
    wait_until(lambda: alert_records(run_dir, "delivery"), 30, what="the delivery record")
    assert "s3cret" not in (run_dir / "alerts.jsonl").read_text()
    assert "s3cret" not in stepwatch("status", str(run_dir), "--json").stdout


@pytest.mark.slow
def test_a_killed_supervisor_is_paged_and_the_runs_later_death_reaches_the_endpoint_within_10_s_once(
        harness: Path, tmp_path: Path):
    """The supervisor SIGKILLed (the OOM killer, kill -9), then the training process: its warden pages
    the loss at once and the death within 10 s, once; the positive control is the supervisor's own
    normal end (test_a_push_to_a_local_endpoint...), where the warden pages nothing."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received = []
    truth = tmp_path / "truth.json"
    try:
        run_dir = launch_config(harness, "warded", [sys.executable, "tq.py", "600", "0.1", "0", "0", str(truth)],
                                alerts={"urls": [f"json://127.0.0.1:{port}/hook"], "min_level": "warning"})
        wait_until(lambda: status(run_dir)["step_seconds"]["n"] >= 3, 30, what="a few timed steps")
        run = read_json(run_dir / "run.json")
        assert run is not None
        os.kill(run["supervisor"]["pid"], signal.SIGKILL)
        lost: list[dict] = wait_until(lambda: [x for x in _Hook.received if "supervisor_lost" in x["title"]], 10,
                                      what="the supervisor's loss paged")
        assert f"supervisor (pid {run['supervisor']['pid']})" in lost[0]["message"] and "goes on" in lost[0]["message"]
        assert not [x for x in _Hook.received if "watchdog" in x["title"]]  # the run still lives: no death yet
        t_kill = time.monotonic()
        os.kill(run["process"]["pid"], signal.SIGKILL)
        deaths: list[dict] = wait_until(lambda: [x for x in _Hook.received if "watchdog" in x["title"]], 10,
                                        what="the run's death paged with its supervisor gone")
        assert time.monotonic() - t_kill <= 10
        assert f"process {run['process']['pid']}" in deaths[0]["message"], deaths
        wait_until(lambda: "the warding ends" in (run_dir / "supervisor.log").read_text(), 60,
                   what="the warden to finish its deliveries")  # then "once" can be counted
        assert len([x for x in _Hook.received if "watchdog" in x["title"]]) == 1, _Hook.received
        recorded = [r["alert_kind"] for r in alert_records(run_dir)]
        assert recorded.count("supervisor_lost") == 1 and recorded.count("watchdog") == 1, recorded
        snap = status(run_dir)
        assert {a["kind"] for a in snap["alerts"]} >= {"supervisor_lost", "watchdog"}  # what a view shows too
    finally:
        server.shutdown()


@pytest.mark.slow
def test_a_stopped_process_whose_log_no_shape_reads_is_paged_frozen_naming_its_pid_within_5_s(
        harness: Path, tmp_path: Path):
    """No step, no bar: the stall detector cannot judge, the process state can (SIGSTOP). The control:
    the same run printing along raises nothing for the first seconds, and after SIGCONT nothing new."""
    out = tmp_path / "pings.jsonl"
    run_dir = launch_config(harness, "shapeless", [sys.executable, "shapeless.py"],
                            alerts={"command": [sys.executable, str(harness / "ping.py"), str(out)]})
    snap = wait_until(lambda: (s := status(run_dir))["liveness"]["frozen"]["state"] == "ok" and s, 20,
                      what="the frozen detector to judge the running process")
    assert snap["stall"]["state"] == "not judged" and snap["alerts"] == []  # the control: healthy, no page
    pid = read_json(run_dir / "run.json")["process"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    try:
        got = wait_until(lambda: [p for p in pings(out) if p["kind"] == "frozen"], 10, what="the frozen ping")
        assert got[0]["t"] - t_stop <= 3.0 + 2.0, got[0]["t"] - t_stop
        assert f"pid {pid} (" in got[0]["message"] and "SIGCONT" in got[0]["message"] and got[0]["level"] == "error"
        text = stepwatch("status", str(run_dir)).stdout  # a one-shot view: the supervisor's recorded alert
        assert "[frozen]" in text and f"pid {pid} (" in text, text
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: status(run_dir)["liveness"]["frozen"]["state"] == "ok", 10, what="the thaw")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: read_json(run_dir / "exit.json"), 10, what="the end")
    kinds = [r["alert_kind"] for r in alert_records(run_dir)]
    assert kinds.count("frozen") == 1, kinds  # once per process, not once per look
