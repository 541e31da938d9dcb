"""The status snapshot: ``stepwatch status RUN [--json]`` on real run dirs.

Real processes launched through the real CLI from a temp git repo, real files, the real captures
under ``tests/fixtures/real``. The runs that need step times use ``StepTelemetry`` in a plain
loop (the emitter a user's loop would call), so every step event is a real write by a real process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from conftest import FIXTURES_REAL, make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.snapshot.observer import RunObserver

# status --json's block: every key, always present (null when unknown).
TOP_KEYS = ("run", "run_dir", "attempt", "state", "pid", "alive", "returncode", "signal", "versions", "step",
            "step_seconds", "throughput", "eta_s", "warmup", "fallback", "stall", "dynamo", "attn_implementation",
            "gpu", "gpu_error", "alerts")
NESTED_KEYS = {
    "versions": ("python", "torch", "transformers"),
    "step": ("global_step", "max_steps", "source"),
    "step_seconds": ("n", "min", "p50", "p90", "p99", "max", "last"),
    "throughput": ("tokens_per_s", "real_tokens_per_s", "padding_share"),
    "warmup": ("state", "until_step"),
    "fallback": ("state", "slow_steps", "onset_step", "reason"),
    "stall": ("state", "current_step_elapsed_s", "threshold_s", "floor_s", "floor_source"),
    "dynamo": ("recompiles", "graph_breaks", "unique_graphs", "recompile_limit_hits", "source"),
    "attn_implementation": ("requested", "resolved"),
}
ALERT_KEYS = ("id", "kind", "at", "message")
ALERT_KINDS = ("watchdog", "fallback", "stall", "recompile_limit", "recompile_storm", "gpu")

# A plain training loop instrumented with StepTelemetry: N steps of DT seconds, then an ending.
STEPS_PY = textwrap.dedent('''\
    import sys, time
    from stepwatch.telemetry import StepTelemetry

    n, dt, end = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    tel = StepTelemetry(max_steps=100)
    tel.step_begin()
    for _ in range(n):
        time.sleep(dt)
        tel.step_end(tokens=1000, padded_tokens=1024)
    print(f"did {n} steps", flush=True)
    if end == "hang":
        print("hanging (no save, no eval)", flush=True)
        time.sleep(600)
    elif end == "save-hang":
        tel.phase("save", "begin")
        print("saving a checkpoint (slowly)", flush=True)
        time.sleep(600)
    else:
        tel.close()
        sys.exit(int(end))
    ''')

# 60 steps of ~0.05 s, then ~1.0 s steps: either every step (a full eager fallback) or only steps
# whose cost is a checkpoint save announced by phase events (the negative control).
FALLBACK_PY = textwrap.dedent('''\
    import sys, time
    from stepwatch.telemetry import StepTelemetry

    mode = sys.argv[1]
    tel = StepTelemetry(max_steps=100)
    tel.step_begin()
    for _ in range(60):
        time.sleep(0.05)
        tel.step_end()
    print("60 fast steps done", flush=True)
    if mode == "fallback":
        for _ in range(30):
            time.sleep(1.0)
            tel.step_end()
    else:
        for _ in range(4):
            tel.phase("save", "begin")
            time.sleep(1.0)
            tel.phase("save", "end")
            time.sleep(0.05)
            tel.step_end()
        for _ in range(10):
            time.sleep(0.05)
            tel.step_end()
    tel.close()
    ''')


# 12 MB of log lines, then the real dynamo capture, then a crash: more than one poll of the log
# tailer reads (8 MB), so a one-shot status must keep reading to the end.
BIGLOG_PY = textwrap.dedent('''\
    import sys
    line = "x" * 99 + "\\n"
    for _ in range(120_000):
        sys.stdout.write(line)
    sys.stdout.flush()
    with open(sys.argv[1], "rb") as f:
        sys.stdout.buffer.write(f.read())
    sys.stdout.flush()
    raise RuntimeError("late failure after 12 MB of log")
    ''')


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    """A clean git repo holding the scripts the runs of this module execute."""
    return make_repo(tmp_path / "harness", {
        "ok.py": "print('hello from the run')\n",
        "exit3.py": "import sys\nprint('about to fail')\nsys.exit(3)\n",
        "sleep.py": "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n",
        "steps.py": STEPS_PY,
        "fallback.py": FALLBACK_PY,
        "biglog.py": BIGLOG_PY,
    })


# --- helpers ---------------------------------------------------------------------------------------

def launch(repo: Path, *cmd: str, name: str) -> Path:
    r = stepwatch("launch", "--no-tui", "--name", name, "--", *cmd, cwd=repo)
    assert r.returncode == 0, r.stderr
    return repo / "runs" / name


def wait_exit(run_dir: Path, timeout_s: float = 30) -> dict:
    return wait_until(lambda: read_json(run_dir / "exit.json"), timeout_s, what=f"{run_dir.name}/exit.json")


def status_json(run_dir: Path, cwd: Path) -> dict:
    r = stepwatch("status", str(run_dir), "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    try:
        text = (run_dir / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    out = [json.loads(ln) for ln in text.splitlines() if ln.strip().endswith("}")]
    return [e for e in out if kind is None or e.get("kind") == kind]


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def assert_every_key(snap: dict) -> None:
    missing = [k for k in TOP_KEYS if k not in snap]
    assert not missing, f"status --json lacks {missing}"
    for k, sub in NESTED_KEYS.items():
        assert isinstance(snap[k], dict), k
        missing = [s for s in sub if s not in snap[k]]
        assert not missing, f"status --json {k} lacks {missing}"
    assert snap["state"] in ("running", "exited", "unknown")
    assert isinstance(snap["alerts"], list)
    for al in snap["alerts"]:
        assert set(ALERT_KEYS) <= set(al), al
        assert al["kind"] in ALERT_KINDS, al
        assert al["at"].endswith("Z") and datetime.fromisoformat(al["at"].replace("Z", "+00:00")), al
    if nvml_available():  # pragma: no cover - only on a machine with a GPU driver
        assert snap["gpu"] is None or isinstance(snap["gpu"], list)  # None until the sampler's first tick
    else:
        assert snap["gpu"] in (None, []), snap["gpu"]
        assert "NVML" in (snap["gpu_error"] or ""), snap["gpu_error"]


def listing(d: Path) -> dict:
    """Every entry under ``d`` (and ``d`` itself) with size, mtime and mode: what a writer would change."""
    out = {}
    for p in [d, *sorted(d.rglob("*"))]:
        st = p.stat()
        out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    return out


# --- every key, every state, exit codes ------------------------------------------------------------

@pytest.mark.system
def test_status_json_has_every_key_running_and_after_sigkill(harness: Path):
    run_dir = launch(harness, sys.executable, "sleep.py", name="live")
    pid = run_json(run_dir)["process"]["pid"]
    snap = status_json(run_dir, harness)
    assert_every_key(snap)
    assert (snap["run"], snap["attempt"], snap["state"], snap["alive"]) == ("live", 1, "running", True)
    assert snap["pid"] == pid and snap["run_dir"] == str(run_dir)
    assert snap["returncode"] is None and snap["signal"] is None and snap["alerts"] == []

    os.kill(pid, signal.SIGKILL)
    wait_exit(run_dir)
    snap = status_json(run_dir, harness)
    assert_every_key(snap)
    assert (snap["state"], snap["alive"], snap["returncode"], snap["signal"]) == ("exited", False, None, "SIGKILL")
    assert [a["kind"] for a in snap["alerts"]] == ["watchdog"]
    assert "SIGKILL" in snap["alerts"][0]["message"]


@pytest.mark.system
def test_status_of_a_failed_run_exits_0_with_the_outcome_in_the_content(harness: Path):
    run_dir = launch(harness, sys.executable, "exit3.py", name="bad")
    wait_exit(run_dir)
    snap = status_json(run_dir, harness)
    assert_every_key(snap)
    assert (snap["state"], snap["alive"], snap["returncode"], snap["signal"]) == ("exited", False, 3, None)
    (al,) = snap["alerts"]
    assert al["kind"] == "watchdog" and "code 3" in al["message"] and "about to fail" in al["message"]


@pytest.mark.system
def test_status_of_a_run_that_does_not_exist_is_a_usage_error(harness: Path):
    for args in (("status", "nosuch"), ("status", "nosuch", "--json"), ("status", str(harness / "runs" / "gone"))):
        r = stepwatch(*args, cwd=harness)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stdout == ""
        assert "no run" in r.stderr and "run.json" in r.stderr and "stepwatch runs" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.system
def test_status_without_json_prints_readable_lines_for_a_failed_run(harness: Path):
    run_dir = launch(harness, sys.executable, "steps.py", "6", "0.02", "3", name="plain")
    wait_exit(run_dir)
    r = stepwatch("status", str(run_dir), cwd=harness)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("plain attempt 1: exited") and "exited with code 3" in lines[0], lines[0]
    snap = status_json(run_dir, harness)
    assert snap["step_seconds"]["n"] == 5  # 6 steps, the first excluded
    assert re.fullmatch(r"n=5 min=\S+ p50=\S+ p99=\S+ max=\S+ seconds_per_optimizer_step", snap["step_line"])
    assert any(ln.strip() == snap["step_line"] for ln in lines), lines
    assert any("step 6/100 (from events)" in ln for ln in lines), lines
    assert any(ln.strip().startswith("ALERT [watchdog]") and "code 3" in ln for ln in lines), lines
    assert any("NVML" in ln for ln in lines) or nvml_available(), lines


# --- views only read ---------------------------------------------------------------------------------

@pytest.mark.system
def test_status_and_watch_on_a_read_only_copy_write_nothing(harness: Path, tmp_path: Path):
    from stepwatch.monitors.watchdog import ProcessRef, is_alive

    src = launch(harness, sys.executable, "steps.py", "6", "0.02", "3", name="ro")
    wait_exit(src)
    # the supervisor outlives the child by its last save (a temp file that comes and goes): copy the
    # run dir once it is gone, not while a file of it may vanish under copytree
    sup = ProcessRef.from_json(read_json(src / "run.json")["supervisor"])
    wait_until(lambda: not is_alive(sup), 60, what="the supervisor to finish")
    ro = tmp_path / "mount" / "ro"
    shutil.copytree(src, ro)
    for p in ro.iterdir():
        os.chmod(p, 0o444)
    os.chmod(ro, 0o555)
    try:
        before = listing(ro)
        snap = status_json(ro, tmp_path)
        assert snap["state"] == "exited" and snap["returncode"] == 3
        assert snap["step_seconds"] == status_json(src, harness)["step_seconds"]
        r = stepwatch("status", str(ro), cwd=tmp_path)
        assert r.returncode == 0 and "exited with code 3" in r.stdout, r.stderr
        for mode in ("--plain", "--json"):
            r = stepwatch("watch", str(ro), mode, cwd=tmp_path, timeout=30)
            assert r.returncode == 1, r.stderr
            assert "Traceback" not in r.stderr and "code 3" in r.stdout, (r.stdout, r.stderr)
        # Observers in this process too (a TUI would hold one), refreshed twice.
        obs = RunObserver(ro)
        obs.refresh()
        obs.refresh()
        assert listing(ro) == before, "a view wrote into the run dir"
    finally:
        os.chmod(ro, 0o755)
        for p in ro.iterdir():
            os.chmod(p, 0o644)


@pytest.mark.system
def test_status_of_an_ended_run_reads_its_log_to_the_end(harness: Path):
    run_dir = launch(harness, sys.executable, "biglog.py", str(FIXTURES_REAL / "dynamo_recompiles.log"), name="big")
    assert wait_exit(run_dir)["returncode"] == 1
    assert (run_dir / "train.log").stat().st_size > 12_000_000
    snap = status_json(run_dir, harness)
    assert snap["log"]["from_start"] is True
    assert snap["log"]["traceback_last_line"] == "RuntimeError: late failure after 12 MB of log"
    assert snap["log"]["last_line"] == "RuntimeError: late failure after 12 MB of log"
    d = snap["dynamo"]
    assert (d["recompiles"], d["recompile_limit_hits"], d["graph_breaks"]) == (3, 1, 1), d
    assert sorted(a["kind"] for a in snap["alerts"]) == ["recompile_limit", "watchdog"]
    wd = next(a for a in snap["alerts"] if a["kind"] == "watchdog")
    assert "code 1" in wd["message"] and "traceback: RuntimeError: late failure after 12 MB" in wd["message"]
    r = stepwatch("watch", str(run_dir), "--plain", cwd=harness, timeout=30)
    assert r.returncode == 1 and "traceback: RuntimeError: late failure" in r.stdout, r.stdout


# --- the watchdog's part: a reused pid, a self-match --------------------------------------------------

@pytest.mark.system
def test_alive_pid_with_a_different_create_time_reads_dead(harness: Path):
    src = launch(harness, sys.executable, "ok.py", name="orig")
    wait_exit(src)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ctime = psutil.Process(decoy.pid).create_time()
        run_dirs = {}
        for name, offset in (("reused", -3600.0), ("control", 0.0)):
            d = harness / "runs" / name
            shutil.copytree(src, d)
            (d / "exit.json").unlink()  # as if the supervisor had gone too
            run = run_json(d)
            run["name"] = name
            run["process"] = {"pid": decoy.pid, "create_time": ctime + offset, "pgid": decoy.pid}
            run["supervisor"] = {"pid": decoy.pid, "create_time": ctime + offset, "sid": decoy.pid}
            (d / "run.json").write_text(json.dumps(run))
            run_dirs[name] = d
        assert psutil.pid_exists(decoy.pid)

        snap = status_json(run_dirs["reused"], harness)
        assert snap["pid"] == decoy.pid
        assert snap["alive"] is False and snap["state"] != "running", snap["state"]
        assert snap["process_verdict"] == "reused"
        assert [a["kind"] for a in snap["alerts"]] == ["watchdog"]
        assert "status unknown" in snap["alerts"][0]["message"]
        r = stepwatch("watch", str(run_dirs["reused"]), "--plain", cwd=harness, timeout=30)
        assert r.returncode == 1 and "status unknown" in r.stdout, (r.stdout, r.stderr)

        # Positive control: the same live pid with its true create_time reads alive.
        snap = status_json(run_dirs["control"], harness)
        assert (snap["alive"], snap["state"], snap["process_verdict"]) == (True, "running", "alive")
    finally:
        decoy.kill()
        decoy.wait()


SELF_MATCH_CHECK = textwrap.dedent('''\
    import io, json, subprocess, sys
    from pathlib import Path
    import psutil
    from stepwatch.tui.plain import watch
    from stepwatch.monitors.snapshot.observer import RunObserver

    run_dir, run_cmd = Path(sys.argv[1]), " ".join(sys.argv[2:])
    snap = RunObserver(run_dir).refresh()
    buf = io.StringIO()
    code = watch(run_dir, out=buf, poll_s=0.1, should_stop=lambda: True)  # one pass, even if it reads alive
    cli = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(run_dir), "--json"],
                         capture_output=True, text=True)
    print(json.dumps({"me": " ".join(psutil.Process().cmdline()), "run_cmd": run_cmd, "state": snap["state"],
                      "alive": snap["alive"], "watch_code": code, "watch_out": buf.getvalue(),
                      "cli": json.loads(cli.stdout)}))
    ''')


@pytest.mark.system
def test_a_watcher_whose_own_argv_holds_the_run_command_still_reads_dead(harness: Path):
    run_dir = launch(harness, sys.executable, "sleep.py", name="selfmatch")
    run = run_json(run_dir)
    os.kill(run["process"]["pid"], signal.SIGKILL)
    wait_exit(run_dir)
    # A live look-alike too: the run's exact argv in the run's cwd.
    twin = subprocess.Popen(run["argv"], cwd=run["cwd"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run([sys.executable, "-c", SELF_MATCH_CHECK, str(run_dir), *run["argv"]], cwd=harness,
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["run_cmd"] == " ".join(run["argv"]) and out["run_cmd"] in out["me"]  # the premise
        assert twin.poll() is None and " ".join(psutil.Process(twin.pid).cmdline()) == out["run_cmd"]
        assert (out["state"], out["alive"]) == ("exited", False)
        assert out["watch_code"] == 1 and "killed by SIGKILL" in out["watch_out"], out["watch_out"]
        assert (out["cli"]["state"], out["cli"]["alive"], out["cli"]["signal"]) == ("exited", False, "SIGKILL")
    finally:
        twin.kill()
        twin.wait()


# --- the stall detector on a real hanging process -----------------------------------------------------

@pytest.mark.system
def test_twenty_fast_steps_then_a_hang_reads_stalled(harness: Path):
    run_dir = launch(harness, sys.executable, "steps.py", "20", "0.02", "hang", name="hang")
    wait_until(lambda: len(events(run_dir, "step")) == 20, 20, what="20 step events")
    snap = wait_until(lambda: (s := status_json(run_dir, harness))["stall"]["state"] == "stalled" and s, 10,
                      interval_s=0.2, what="stall.state == stalled")
    assert (snap["state"], snap["alive"]) == ("running", True)
    assert snap["step"] == {"global_step": 20, "max_steps": 100, "source": "events", "timing": "exact",
                           "arrival": None}
    assert snap["stall"]["current_step_elapsed_s"] >= 3.0  # the detector's floor (3 s)
    stalls = [a for a in snap["alerts"] if a["kind"] == "stall"]
    assert [a["id"] for a in stalls] == ["a1-stall-20"], snap["alerts"]
    assert "alive but stuck" in stalls[0]["message"] and "step 20" in stalls[0]["message"]
    # A reattach (a fresh observer in this process) sees the same alert under the same id.
    again = RunObserver(run_dir).refresh()
    assert again["stall"]["state"] == "stalled"
    assert [a["id"] for a in again["alerts"] if a["kind"] == "stall"] == ["a1-stall-20"]


@pytest.mark.slow  # a real training run / several seconds of a real process
def test_a_long_save_phase_is_not_a_stall(harness: Path):
    run_dir = launch(harness, sys.executable, "steps.py", "20", "0.02", "save-hang", name="saving")
    wait_until(lambda: events(run_dir, "phase"), 20, what="the save phase event")
    seen = []

    def past_the_stall_threshold():
        s = status_json(run_dir, harness)
        seen.append(s)
        assert s["stall"]["state"] == "ok", s["stall"]
        assert not [a for a in s["alerts"] if a["kind"] == "stall"], s["alerts"]
        el, p99 = s["stall"]["current_step_elapsed_s"], s["step_seconds"]["p99"]
        return el is not None and p99 is not None and el > max(4.0, 10 * p99 + 1.0)

    wait_until(past_the_stall_threshold, 15, interval_s=0.2, what="the save to outlast the stall threshold")
    assert seen[-1]["state"] == "running" and seen[-1]["step"]["global_step"] == 20
    assert seen[-1]["step_seconds"]["n"] == 19


# --- dynamo: the real recompile-limit warning ---------------------------------------------------------

@pytest.mark.parametrize("fixture, recompiles, graph_breaks", [
    ("dynamo_recompiles.log", 3, 1),       # TORCH_LOGS=recompiles,graph_breaks
    ("dynamo_limit_default.log", 0, 0),    # no TORCH_LOGS: the warning alone
])
@pytest.mark.system
def test_the_real_recompile_limit_warning_raises_an_alert(harness: Path, fixture: str, recompiles: int,
                                                          graph_breaks: int):
    run_dir = launch(harness, "cat", str(FIXTURES_REAL / fixture), name="dyn")
    assert wait_exit(run_dir)["returncode"] == 0
    assert (run_dir / "train.log").read_bytes() == (FIXTURES_REAL / fixture).read_bytes()
    snap = status_json(run_dir, harness)
    d = snap["dynamo"]
    assert (d["recompiles"], d["recompile_limit_hits"], d["graph_breaks"], d["source"]) == \
        (recompiles, 1, graph_breaks, "log"), d
    (al,) = snap["alerts"]
    assert al["kind"] == "recompile_limit" and al["id"].startswith("a1-recompile_limit-forward")
    assert "forward" in al["message"] and "EAGER" in al["message"].upper(), al
    r = stepwatch("watch", str(run_dir), "--plain", cwd=harness, timeout=30)
    assert r.returncode == 0, r.stderr
    assert re.search(r"ALERT \[recompile_limit\] .*forward", r.stdout), r.stdout


@pytest.mark.system
@pytest.mark.parametrize("fixture", ["hf_trainer_plain.log", "hf_trainer_compile.log"])
def test_a_log_without_the_warning_raises_no_alert(harness: Path, fixture: str):
    run_dir = launch(harness, "cat", str(FIXTURES_REAL / fixture), name="clean")
    assert wait_exit(run_dir)["returncode"] == 0
    snap = status_json(run_dir, harness)
    assert snap["alerts"] == []
    assert not snap["dynamo"]["recompile_limit_hits"]
    expected_steps = {"hf_trainer_plain.log": 60, "hf_trainer_compile.log": 40}[fixture]
    # the whole log arrived in one read (cat): the steps are known, their times are not
    assert snap["step"] == {"global_step": expected_steps, "max_steps": expected_steps, "source": "log",
                            "timing": None, "arrival": None}
    assert snap["step_seconds"]["n"] == 0
    # a detector that had nothing to judge says so: a default is never a verdict
    assert snap["fallback"]["state"] == "not judged" and snap["stall"]["state"] == "not judged"


# --- the fallback detector on real processes ----------------------------------------------------------

@pytest.mark.slow  # a real training run / several seconds of a real process
def test_slow_steps_after_a_fast_steady_state_are_flagged_and_saves_are_not(harness: Path, tmp_path: Path):
    pos = launch(harness, sys.executable, "fallback.py", "fallback", name="fallback")
    neg = launch(harness, sys.executable, "fallback.py", "saves", name="saves")
    seen = []

    def flagged():
        s = status_json(pos, harness)
        seen.append(s)
        return s["fallback"]["state"] == "flagged" and s

    snap = wait_until(flagged, 30, interval_s=0.2, what="fallback flagged")
    fb = snap["fallback"]
    assert fb["onset_step"] == 61 and fb["slow_steps"][:3] == [61, 62, 63], fb
    assert snap["warmup"]["state"] == "steady"
    assert [a["id"] for a in snap["alerts"] if a["kind"] == "fallback"] == ["a1-fallback-61"], snap["alerts"]
    early = [s for s in seen if (s["step"]["global_step"] or 0) <= 60]
    # before the fallback: "not judged" while warming up, "ok" once steady; never an alert
    assert all((s["fallback"]["state"] == "ok") == (s["warmup"]["state"] == "steady") and not s["alerts"]
               and s["fallback"]["state"] in ("ok", "not judged") for s in early), [s["fallback"] for s in early]
    assert any(s["fallback"]["state"] == "ok" for s in early)
    # When exactly: the snapshot of the run's files as they stood after each step (independent of how
    # fast this test polled). The bound for a full fallback: flagged by 3 slow steps.
    verdicts = {}
    for upto in (60, 61, 62, 63):
        cut = tmp_path / f"cut{upto}"
        cut.mkdir()
        shutil.copy(pos / "run.json", cut / "run.json")
        lines = [ln for ln in (pos / "events.jsonl").read_text().splitlines()
                 if json.loads(ln)["kind"] != "step" or json.loads(ln)["step"] <= upto]
        (cut / "events.jsonl").write_text("\n".join(lines) + "\n")
        last_t = json.loads(lines[-1])["t"]
        s = RunObserver(cut).refresh(now=last_t)
        verdicts[upto] = (s["fallback"]["state"], [a["kind"] for a in s["alerts"]])
    assert verdicts[60] == ("ok", []) and verdicts[61][0] == "suspected", verdicts
    assert verdicts[63] == ("flagged", ["fallback"]), verdicts

    # Negative control: the same 20x slower steps, each the cost of an announced checkpoint save.
    assert wait_exit(neg)["returncode"] == 0
    snap = status_json(neg, harness)
    assert [e["step"] for e in events(neg, "step") if "save" in e["flags"]] == [61, 62, 63, 64]
    saves = [e["dt"] for e in events(neg, "step") if "save" in e["flags"]]
    assert snap["step"]["global_step"] == 74 and min(saves) > 1.0  # the saves took seconds...
    assert snap["step_seconds"]["max"] < 1.0 and snap["step_seconds"]["n"] == 69, snap["step_seconds"]  # ...no step time (R18)
    assert snap["fallback"]["state"] == "ok", snap["fallback"]
    assert snap["alerts"] == []


# --- alert ids -------------------------------------------------------------------------------------

@pytest.mark.system
def test_alert_ids_are_stable_across_observers_and_views(harness: Path):
    (harness / "dyn_exit3.sh").write_text(f"cat {FIXTURES_REAL / 'dynamo_recompiles.log'}\nexit 3\n")
    subprocess.run(["git", "add", "dyn_exit3.sh"], cwd=harness, check=True)
    subprocess.run(["git", "commit", "-qm", "dyn"], cwd=harness, check=True)
    run_dir = launch(harness, "sh", "dyn_exit3.sh", name="ids")
    wait_exit(run_dir)
    first = RunObserver(run_dir).refresh()
    second = RunObserver(run_dir).refresh()
    again = RunObserver(run_dir)
    again.refresh()
    third = again.refresh()  # the same observer refreshed: no duplicate alerts
    cli = status_json(run_dir, harness)
    ids = [a["id"] for a in first["alerts"]]
    assert sorted(a["kind"] for a in first["alerts"]) == ["recompile_limit", "watchdog"], first["alerts"]
    assert len(set(ids)) == len(ids) and all(i.startswith("a1-") for i in ids)
    for other in (second, third, cli):
        assert [a["id"] for a in other["alerts"]] == ids
    # The watchdog alert's time is the recorded end, the same in every view.
    wd = [a["at"] for s in (first, second, cli) for a in s["alerts"] if a["kind"] == "watchdog"]
    assert len(set(wd)) == 1 and wd[0] == read_json(run_dir / "exit.json")["ended_at"]


@pytest.mark.system
def test_status_json_is_strict_json_even_with_a_nan_loss(tmp_path: Path):
    from stepwatch.monitors.snapshot.model import json_safe

    assert json_safe({"a": [float("nan"), float("inf"), -float("inf"), 1.5]}) == {"a": ["NaN", "Infinity", "-Infinity", 1.5]}
    run_dir = tmp_path / "nan"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"name": "nan", "attempt": 1, "process": {"pid": 2_147_483_000,
                                                  "create_time": 1.0, "pgid": 1}}))
    (run_dir / "events.jsonl").write_text('{"v":1,"kind":"log","t":1.0,"step":3,"rank":0,"logs":{"loss":NaN}}\n')
    r = stepwatch("status", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in status --json"))
    assert snap["last_logs"]["loss"] == "NaN"


@pytest.mark.system
def test_a_supervisor_that_died_before_recording_the_child_reads_ended(tmp_path: Path):
    run_dir = tmp_path / "lost"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({
        "name": "lost", "attempt": 1, "launched_at_unix": time.time() - 3600,
        "supervisor": {"pid": None, "create_time": None}, "process": {"pid": None, "create_time": None, "pgid": None}}))
    r = stepwatch("watch", str(run_dir), "--plain", timeout=30)
    assert r.returncode == 1 and "status unknown" in r.stdout


@pytest.mark.system
def test_status_warns_when_the_supervisor_is_gone_while_the_child_runs(repo: Path):
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "sleep.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    run = json.loads((run_dir / "run.json").read_text())
    s = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert s["state"] == "running" and s["supervisor_alive"] is True
    os.kill(run["supervisor"]["pid"], signal.SIGKILL)
    wait_until(lambda: json.loads(stepwatch("status", str(run_dir), "--json").stdout)["supervisor_alive"] is False,
               10, what="the supervisor to read dead")
    out = stepwatch("status", str(run_dir)).stdout
    assert "supervisor is gone" in out and "running" in out
    r = stepwatch("stop", str(run_dir), "--grace", "1")
    assert r.returncode == 0 and "supervisor" in r.stdout and "ended after SIGINT" in r.stdout


# --- what events.jsonl may hold that the emitter never writes ----------------------------------------

def _finished_run_dir(path: Path, lines: list[str], launched_at_unix: float = 1_780_000_000.0) -> Path:
    """A run dir as a finished attempt leaves it (the process long gone), events.jsonl = ``lines``."""
    from stepwatch.monitors.runfiles import write_json_atomic

    path.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_json_atomic(path / "run.json", {"v": 1, "name": path.name, "attempt": 1, "argv": ["python", "train.py"],
                                          "launched_at_unix": launched_at_unix,
                                          "process": {"pid": gone.pid, "create_time": 1.0, "pgid": gone.pid}})
    write_json_atomic(path / "exit.json", {"returncode": 0, "signal": None, "ended_at_unix": 1_780_100_000.0,
                                           "stop_requested": False, "error": None})
    (path / "events.jsonl").write_text("".join(ln + "\n" for ln in lines))
    return path


def _step(step: int, dt, t: float, **kw) -> dict:
    ev = {"v": 1, "kind": "step", "t": t, "step": step, "rank": 0, "dt": dt, "step_begin": t - 1.0, "step_end": t,
          "tokens": None, "padded_tokens": None, "flags": ["first"] if step == 1 else []}
    ev.update(kw)
    return ev


@pytest.mark.system
def test_step_lines_the_emitter_never_writes_are_counted_and_never_fatal(tmp_path: Path):
    t0 = 1_780_000_000.0
    good = [_step(i, 1.0 + (i % 5) / 100, t0 + i) for i in range(1, 41)]
    junk = [
        _step(41, float("inf"), t0 + 41), _step(42, float("nan"), t0 + 42), _step(43, -1.0, t0 + 43),
        _step(44, "1.0", t0 + 44), _step(45, True, t0 + 45), _step(46, None, t0 + 46), _step(46, 10**400, t0 + 46),
        _step(47, 1.0, t0 + 47, flags="first"), _step(48, 1.0, t0 + 48, flags=[1]),
        _step(49, 1.0, t0 + 49, flags={"save": 1}),
    ]
    odd_but_usable = [  # widths that read as unknown, a missing rank, a number too big for orjson
        _step(50, 1.01, t0 + 50, tokens=1e300, padded_tokens="x"), _step(51, 1.02, t0 + 51, tokens=-5, padded_tokens=2**70),
        {k: v for k, v in _step(52, 1.03, t0 + 52).items() if k not in ("rank", "t", "tokens")},
        _step(53, 1.04, t0 + 53, padded_tokens=123456789012345678901234567890),
    ]
    last = _step("fifty-four", 1.0, t0 + 54, step_end="later")  # a step that is not a number, an odd end
    lines = [json.dumps(e) for e in good + junk + odd_but_usable + [last]] + ["{not json", "[1, 2]"]
    run_dir = _finished_run_dir(tmp_path / "odd", lines)
    snap = RunObserver(run_dir).refresh()
    assert snap["events"]["unusable_steps"] == len(junk)
    assert snap["events"]["corrupt_lines"] == 2
    assert snap["step_seconds"]["n"] == len(good) - 1 + len(odd_but_usable) + 1
    assert snap["step"]["global_step"] is None  # the last step's number is not a number: unknown, no crash
    assert snap["state"] == "exited" and snap["fallback"]["state"] == "ok"
    cli = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(run_dir), "--json"], capture_output=True,
                         text=True, timeout=60)
    assert cli.returncode == 0 and json.loads(cli.stdout)["events"]["unusable_steps"] == len(junk), cli.stderr


def test_a_flagged_fallback_keeps_its_onset_time_however_many_slow_steps_follow(tmp_path: Path):
    """The fallback alert's time is its onset step's end, read from the file, even 3,000 slow steps
    (more than the slow-step ends kept) after it; and in one refresh or in many."""
    t, lines, onset_end = 1_780_000_000.0, [], None
    for i in range(1, 3201):
        dt = 1.0 + (i % 7) / 100 if i <= 200 else 20.0 + (i % 7) / 10
        t += dt
        if i == 201:
            onset_end = t
        lines.append(json.dumps(_step(i, dt, t)))
    run_dir = _finished_run_dir(tmp_path / "eager", lines)
    whole = RunObserver(run_dir).refresh()
    assert whole["fallback"]["state"] == "flagged" and whole["fallback"]["onset_step"] == 201
    (al,) = [a for a in whole["alerts"] if a["kind"] == "fallback"]
    from stepwatch.monitors.runfiles import utc_iso

    assert al["id"] == "a1-fallback-201" and al["at"] == utc_iso(onset_end)

    piecewise = _finished_run_dir(tmp_path / "eager-live", [])
    obs = RunObserver(piecewise)
    for k in range(0, len(lines), 250):  # appended as a live run writes it, refreshed in between
        with open(piecewise / "events.jsonl", "a") as f:
            f.write("".join(ln + "\n" for ln in lines[k : k + 250]))
        snap = obs.refresh()
    assert [a for a in snap["alerts"] if a["kind"] == "fallback"] == [al]


def _live_run_dir(path: Path, launched_at_unix: float) -> Path:
    """A running attempt: run.json names this test's own process (alive), no exit.json yet."""
    run_dir = _finished_run_dir(path, [], launched_at_unix)
    (run_dir / "exit.json").unlink()
    run = read_json(run_dir / "run.json") or {}
    run["process"] = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "pgid": os.getpgid(0)}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


def test_a_view_whose_clock_runs_a_day_ahead_of_the_run_reads_no_stall_while_it_steps(tmp_path: Path):
    """The step in progress is timed from the run's step_end (the run's clock) to the view's "now"
    (its own): a view a day ahead read "stalled for 86400 s". A view that saw the step begin times it
    on its monotonic clock too, and the wall-clock difference is clamped into that: no stall while
    the run steps, whatever the skew; a step that truly runs past the threshold on the monotonic
    clock is still a stall (the positive control), and says the clocks differ."""
    day, t0 = 86400.0, 1_780_000_000.0  # the run's clock; the view's reads t0 + a day
    run_dir = _live_run_dir(tmp_path / "skewed", t0)
    mono = [5000.0]
    obs = RunObserver(run_dir, monotonic=lambda: mono[0])
    snap = obs.refresh(now=t0 + day)  # attached before the first step: nothing to judge
    assert snap["state"] == "running" and snap["stall"]["state"] in ("ok", "not judged"), snap["stall"]
    t = t0
    for i in range(1, 41):  # one step a second, on both clocks; the view looks twice a step
        t += 1.0
        with open(run_dir / "events.jsonl", "a") as f:
            f.write(json.dumps(_step(i, 1.0, t)) + "\n")
        for _ in range(2):
            mono[0] += 0.5
            snap = obs.refresh(now=t + 0.5 + day)
            assert snap["stall"]["state"] != "stalled", (i, snap["stall"])
            assert not [a for a in snap["alerts"] if a["kind"] == "stall"], (i, snap["alerts"])
    elapsed = snap["stall"]["current_step_elapsed_s"]
    assert snap["stall"]["state"] == "ok" and elapsed is not None and elapsed <= 2.5, snap["stall"]
    assert "the run's step times are about 86" in snap["stall"]["reason"], snap["stall"]["reason"]
    for _ in range(30):  # the run stops stepping: 15 s on the monotonic clock, the threshold is 10 s
        mono[0] += 0.5
        snap = obs.refresh(now=t + 0.5 + day)  # the view's wall clock stands still: the monotonic one decides
    assert snap["stall"]["state"] == "stalled", snap["stall"]
    elapsed = snap["stall"]["current_step_elapsed_s"]
    assert elapsed is not None and 14.0 <= elapsed <= 17.0, snap["stall"]
    assert [a["id"] for a in snap["alerts"] if a["kind"] == "stall"] == ["a1-stall-40"], snap["alerts"]


def test_a_one_shot_look_has_only_the_wall_clock_and_a_hung_run_reads_stalled_at_once(tmp_path: Path):
    """The monotonic clock bounds only a step the observer saw begin: a view attached to a run hung
    for ten minutes (a one-shot ``status``) says stalled at its first look, as it always did."""
    t0 = 1_780_000_000.0
    run_dir = _live_run_dir(tmp_path / "hung", t0)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(_step(i, 1.0, t0 + i)) + "\n" for i in range(1, 21)))
    snap = RunObserver(run_dir, monotonic=lambda: 100.0).refresh(now=t0 + 20 + 600)
    assert snap["stall"]["state"] == "stalled" and snap["stall"]["current_step_elapsed_s"] == 600.0, snap["stall"]


def test_process_snapshot_is_the_watchdog_part_without_reading_events(tmp_path: Path):
    """`stepwatch runs` lists many runs: it takes the watchdog's keys from run.json / exit.json only."""
    from stepwatch.monitors.snapshot.observer import process_snapshot, snapshot

    src = Path(__file__).parent / "fixtures" / "runs" / "ended-sigkill"
    run_dir = tmp_path / "ended-sigkill"
    shutil.copytree(src, run_dir)
    full, part = snapshot(run_dir), process_snapshot(run_dir)
    keys = ("run", "run_dir", "attempt", "state", "pid", "alive", "returncode", "signal", "ended", "process_verdict",
            "launched_at_unix", "identity")
    assert {k: part[k] for k in keys} == {k: full[k] for k in keys}
    assert full["signal"] == "SIGKILL" and full["step_seconds"]["n"] > 0
    assert part["step_seconds"]["n"] == 0 and part["events"]["file"] is None  # events.jsonl not read
    assert process_snapshot(tmp_path / "nothing")["state"] == "unknown"


@pytest.mark.system
@pytest.mark.parametrize("live", [False, True])
def test_odd_values_in_every_event_kind_never_break_the_snapshot(tmp_path: Path, live: bool):
    """Numbers where objects belong and the reverse, in run_start, dynamo, log, phase and run_end
    events, and hostile step numbers / ends on the very steps alerts are built from (the fallback
    onset, a recompile storm's steps, the last step a stall is timed from): status still answers,
    and every alert time is a real date."""
    t0 = 1_780_000_000.0
    evs = [{"v": 1, "kind": "run_start", "t": t0, "rank": 0, "versions": [1], "attn_implementation": "sdpa",
            "max_steps": "x"},
           {"v": 1, "kind": "dynamo", "t": t0, "rank": 0, "counters": {"stats": [1], "graph_break": {"a": "x"}},
            "recompiles": "x", "recompile_limit_hits": [1]},
           {"v": 1, "kind": "log", "t": t0, "rank": 0, "logs": [1]},
           {"v": 1, "kind": "phase", "t": t0, "rank": 0, "name": ["save"], "state": "end"}]
    t = t0
    for i in range(1, 321):
        dt = 1.0 + (i % 7) / 100 if i <= 200 else 20.0 + (i % 7) / 10
        t += dt
        ev = _step(i, dt, t)
        ev["step"] = "one" if i == 1 else (float(i) if i % 2 else i)
        if i == 201:
            ev.update(step=[201], step_end=float("nan"))  # the onset of the fallback
        if 250 <= i < 256:
            ev.update(flags=["recompile"], step_end=1e300)
        evs.append(ev)
    evs[-1]["step_end"] = -1e300  # what a stall would be timed from
    evs.append({"v": 1, "kind": "run_end", "t": t, "rank": 0, "dynamo": {"recompiles": [3]}, "step_seconds": "x"})
    run_dir = _finished_run_dir(tmp_path / "odd", [json.dumps(e) for e in evs])
    if live:  # the process alive: eta and stall are computed too
        (run_dir / "exit.json").unlink()
        run = read_json(run_dir / "run.json")
        run["process"] = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "pgid": os.getpgid(0)}
        (run_dir / "run.json").write_text(json.dumps(run))
    snap = RunObserver(run_dir).refresh()
    assert snap["state"] == ("running" if live else "exited")
    assert snap["versions"]["torch"] is None and snap["step"]["max_steps"] is None
    assert snap["dynamo"]["recompiles"] is None or isinstance(snap["dynamo"]["recompiles"], int)
    assert snap["fallback"]["state"] == "flagged" and snap["fallback"]["onset_step"] is None
    assert all(isinstance(a["at"], str) and a["at"].startswith("20") for a in snap["alerts"]), snap["alerts"]
    assert snap["step"]["global_step"] == 320 and snap["step_seconds"]["n"] == 319  # ended at -1e300: counted
    cli = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(run_dir), "--json"], capture_output=True,
                         text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr


@pytest.mark.system
def test_values_nested_a_thousand_deep_are_cut_where_they_are_shown(tmp_path: Path):
    """orjson reads a line nested up to 1,024 deep; every writer of the snapshot (json.dumps with an
    indent, watch --json, the screen) recurses per level: what is shown as read (last_logs,
    versions, dropped_events) is cut at SHOWN_DEPTH levels."""
    from stepwatch.monitors.snapshot.model import SHOWN_DEPTH

    t0 = 1_780_000_000.0
    deep = "[" * 1000 + "]" * 1000
    lines = ['{"v": 1, "kind": "run_start", "t": %r, "rank": 0, "versions": {"torch": %s, "python": "3.11"}}' % (t0, deep),
             json.dumps(_step(1, 1.0, t0 + 1)),
             '{"v": 1, "kind": "log", "t": %r, "rank": 0, "logs": {"loss": 1.5, "x": %s}}' % (t0 + 1, deep),
             '{"v": 1, "kind": "run_end", "t": %r, "rank": 0, "dropped_events": %s}' % (t0 + 2, deep)]
    run_dir = _finished_run_dir(tmp_path / "deep", lines)
    snap = RunObserver(run_dir).refresh()
    assert snap["events"]["corrupt_lines"] == 0 and snap["versions"]["python"] == "3.11"
    assert snap["last_logs"]["loss"] == 1.5
    v = snap["last_logs"]["x"]
    for _ in range(SHOWN_DEPTH - 1):
        v = v[0]
    assert v == f"<nested deeper than {SHOWN_DEPTH} levels: not shown>"
    for args in (("status", str(run_dir), "--json"), ("watch", str(run_dir), "--json")):
        cli = subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", *args], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0 and "Traceback" not in cli.stderr, (args, cli.stderr[-500:])


@pytest.mark.parametrize("same_launch_time", [False, True])
def test_a_run_dir_launched_again_under_the_same_name_is_a_new_attempt(tmp_path: Path, same_launch_time: bool):
    """Removed and launched again (attempt 1 again): a kept observer (the home list, the run
    screen) must not add the new run's steps to the old one's. Told apart by the launch time, or,
    when even that is the same, by events.jsonl being another file."""
    t0 = 1_780_000_000.0
    old = _finished_run_dir(tmp_path / "r", [json.dumps(_step(i, 1.0, t0 + i)) for i in range(1, 501)])
    obs = RunObserver(old)
    assert obs.refresh()["step_seconds"]["n"] == 499
    shutil.rmtree(old)
    _finished_run_dir(tmp_path / "r", [json.dumps(_step(i, 0.25, t0 + 9000 + i)) for i in range(1, 4)],
                      launched_at_unix=t0 if same_launch_time else t0 + 9000)
    snap = obs.refresh()
    assert (snap["step_seconds"]["n"], snap["step_seconds"]["p50"], snap["step"]["global_step"]) == (2, 0.25, 3)
    fresh = RunObserver(old).refresh()
    assert {k: snap[k] for k in ("step_seconds", "fallback", "warmup", "events")} == \
        {k: fresh[k] for k in ("step_seconds", "fallback", "warmup", "events")}


def _line_break_run(path: Path, brk: str) -> Path:
    """A finished run whose strings (run.json's name, run_start's versions and attention backend, a log
    event's key, an alert record's kind and message) each hold ``brk``."""
    from stepwatch.monitors.runfiles import write_json_atomic

    t0 = 1_780_000_000.0
    run_start = {"v": 1, "kind": "run_start", "t": t0, "step": None, "rank": 0, "world_size": 1, "pid": 1, "max_steps": 9,
                 "versions": {"python": "3.11", "torch": f"2.4{brk}ALERT [stall] fake", "transformers": f"4.4{brk}"},
                 "attn_implementation": {"requested": f"sdpa{brk}GPU0 fake", "resolved": f"flash{brk}x"}}
    log = {"v": 1, "kind": "log", "t": t0 + 4, "step": 3, "rank": 0, "logs": {f"loss{brk}fake": 1.5}}
    run_dir = _finished_run_dir(path, [json.dumps(run_start), *(json.dumps(_step(i, 1.0, t0 + i)) for i in (1, 2, 3)),
                                       json.dumps(log)])
    run = read_json(run_dir / "run.json") or {}
    write_json_atomic(run_dir / "run.json", {**run, "name": f"nl{brk}fake"})
    (run_dir / "alerts.jsonl").write_text(json.dumps({
        "kind": "alert", "id": "a1", "alert_kind": f"stall{brk}x", "at": "2026-01-01T00:00:00Z",
        "message": f"stuck{brk}ALERT [fake] fake", "level": "warning"}) + "\n")
    return run_dir


@pytest.mark.parametrize("brk", ["\n", "\r\n", "\r", "\u2028"], ids=["LF", "CRLF", "CR", "LS"])
def test_a_line_break_in_what_a_run_wrote_never_starts_a_line_of_status(tmp_path: Path, brk: str):
    """``status`` (tui/plain.py): strings read from events.jsonl, run.json and alerts.jsonl that hold
    a line break print as many lines as the same run with none, the break shown; ``watch --plain``'s
    event lines stay one line each."""
    import io

    from stepwatch.tui.plain import Narrator, status_lines

    hostile = RunObserver(_line_break_run(tmp_path / "hostile", brk)).refresh()
    control = RunObserver(_line_break_run(tmp_path / "control", " ")).refresh()
    assert hostile["versions"]["torch"] == f"2.4{brk}ALERT [stall] fake"  # the snapshot keeps the data as read
    lines, want = status_lines(hostile), status_lines(control)
    text = "\n".join(lines)
    assert len(text.splitlines()) == len(lines) == len("\n".join(want).splitlines()), text
    shown = brk.replace("\n", "\u240a").replace("\r", "\u240d").replace("\u2028", "\u2424")
    assert f"torch 2.4{shown}ALERT [stall] fake" in text and f"stuck{shown}ALERT [fake] fake" in text, text
    assert text.startswith(f"nl{shown}fake attempt 1") and f"sdpa{shown}GPU0 fake" in text, text
    out = io.StringIO()
    Narrator(out, as_json=False, every_n_steps=1).feed(hostile)
    said = out.getvalue().splitlines()
    assert len(said) == 4 and all(ln.startswith("20") for ln in said), said  # attempt, step, alert, exit


def test_gc_pause_is_restored_when_refreshes_overlap_in_threads():
    """Two observers refreshing at once: the second must not take the first's pause for the
    collector's normal state (it would stay off for the life of the TUI)."""
    import gc
    import threading

    from stepwatch.monitors.fold.events import gc_paused as _gc_paused

    assert gc.isenabled()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with _gc_paused():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def second():
        a_in.wait(5)
        with _gc_paused():
            b_in.set()
            a_out.wait(5)  # the first leaves while this one is still inside
            seen["inside"] = gc.isenabled()

    ts = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert seen == {"inside": False} and gc.isenabled()
    gc.disable()
    try:
        with _gc_paused():
            pass
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()
