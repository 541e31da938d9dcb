"""Launcher: clean-tree gate, identity at launch, rotation, supervisor, exit records, stop.

Real git repos in temp dirs, the real CLI in subprocesses, real child processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import git, make_repo, stepwatch, wait_until
from stepwatch.launcher.rotate import plan_rotation, rotate
from stepwatch.monitors.runfiles import read_json
from stepwatch.monitors.watchdog import ProcessRef, is_alive, probe


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def wait_exit(run_dir: Path, timeout_s: float = 20) -> dict:
    return wait_until(lambda: read_json(run_dir / "exit.json"), timeout_s, what=f"{run_dir}/exit.json")


def launch(repo: Path, *cmd: str, name: str = "r", extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return stepwatch("launch", "--no-tui", "--name", name, *extra, "--", *cmd, cwd=repo)


# --- clean-tree gate -------------------------------------------------------------------------------

def test_dirty_tracked_file_refuses_and_starts_nothing(repo: Path):
    (repo / "ok.py").write_text("print('changed')\n")
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 1, r.stderr
    assert "dirty" in r.stderr and "modified: ok.py" in r.stderr and "--allow-dirty" in r.stderr
    assert not (repo / "runs" / "r" / "run.json").exists()
    assert not (repo / "runs" / "r" / "train.log").exists()


def test_staged_only_change_refuses(repo: Path):
    (repo / "new_module.py").write_text("x = 1\n")
    git(repo, "add", "new_module.py")
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 1
    assert "staged: new_module.py" in r.stderr
    assert not (repo / "runs" / "r" / "run.json").exists()


def test_untracked_file_warns_and_launches(repo: Path):
    (repo / "notes.txt").write_text("scratch\n")
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 0, r.stderr
    assert "untracked" in r.stderr and "notes.txt" in r.stderr
    run = run_json(repo / "runs" / "r")
    assert run["identity"]["untracked"] == ["notes.txt"]
    assert run["identity"]["harness_dirty_at_launch"] is False


def test_a_runs_dir_linked_into_the_tree_is_not_an_untracked_file(repo: Path, tmp_path: Path):
    scratch = tmp_path / "scratch-runs"
    scratch.mkdir()
    (repo / "runs").symlink_to(scratch)  # runs -> /scratch/runs, not in .gitignore as a file
    (repo / "notes.txt").write_text("scratch\n")
    (repo / "loop").symlink_to(repo / "loop")  # odd links stay listed, and never break the launch
    (repo / "up").symlink_to(tmp_path)  # holds the runs dir, but is not it
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 0, r.stderr
    run = run_json(scratch / "r")
    assert run["identity"]["untracked"] == ["loop", "notes.txt", "up"], run["identity"]["untracked"]
    warning = next(ln for ln in r.stderr.splitlines() if "untracked files" in ln)
    assert warning.endswith("(not part of harness_commit): loop, notes.txt, up"), warning


def test_launch_into_a_pipe_opens_no_tui(repo: Path):
    r = stepwatch("launch", "--name", "r", "--", sys.executable, "ok.py", cwd=repo)  # no --no-tui; stdout a pipe
    assert r.returncode == 0, r.stderr
    assert "stdout is not a terminal: no TUI; the run goes on" in r.stdout
    assert "\x1b[" not in r.stdout + r.stderr  # no escape codes in the pipe
    assert wait_exit(repo / "runs" / "r")["returncode"] == 0


def test_a_gpu_recording_named_relative_to_the_run_cwd_is_replayed(repo: Path):
    """The run config's env may name a GPU recording relative to the run's cwd (where the command
    runs), though the supervisor itself works in the run dir."""
    import shutil

    from stepwatch.monitors.gpu.recorded import bundled_recording

    (repo / "recs").mkdir()
    shutil.copy(bundled_recording("synthetic_h100_idle.jsonl"), repo / "recs" / "mine.jsonl")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a recording")
    r = launch(repo, sys.executable, "-c", "import time; time.sleep(2.5)",
               extra=("--env", "STEPWATCH_GPU_RECORDING=recs/mine.jsonl"))
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    wait_exit(run_dir)
    recs = [json.loads(ln) for ln in (run_dir / "gpu.jsonl").read_text().splitlines() if ln.strip()]
    assert recs and {r["backend"] for r in recs} == {"recorded:mine.jsonl"}
    assert all(r["gpu_error"] is None and r["devices"] for r in recs), recs[0]  # not "recording unavailable"


def test_allow_dirty_launches_and_records_reason(repo: Path):
    (repo / "ok.py").write_text("print('changed')\n")
    r = launch(repo, sys.executable, "ok.py", extra=("--allow-dirty", "hotfix for the lr schedule"))
    assert r.returncode == 0, r.stderr
    run = run_json(repo / "runs" / "r")
    assert run["allow_dirty_reason"] == "hotfix for the lr schedule"
    assert run["identity"]["harness_dirty_at_launch"] is True
    assert run["identity"]["modified"] == ["ok.py"]
    assert run["identity"]["describe"].endswith("-dirty")
    assert run["preflight"]["items"][0]["status"] == "fail" and run["preflight"]["items"][0]["overridden"]


def test_not_a_git_repo_refuses_with_a_clear_line(tmp_path: Path):
    d = tmp_path / "plain"
    d.mkdir()
    (d / "ok.py").write_text("print(1)\n")
    r = launch(d, sys.executable, "ok.py")
    assert r.returncode == 1
    assert "not inside a git work tree" in r.stderr
    assert not (d / "runs" / "r" / "run.json").exists()
    r = launch(d, sys.executable, "ok.py", extra=("--allow-dirty", "scratch experiment"))
    assert r.returncode == 0, r.stderr
    assert run_json(d / "runs" / "r")["identity"]["harness_commit"] is None


def test_clean_tree_passes_the_gate(repo: Path):
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 0, r.stderr
    run = run_json(repo / "runs" / "r")
    assert run["preflight"]["items"][0]["status"] == "pass"
    assert run["allow_dirty_reason"] is None


# --- identity --------------------------------------------------------------------------------------

def test_identity_is_sampled_at_launch_not_later(repo: Path):
    head = git(repo, "rev-parse", "HEAD")
    r = launch(repo, sys.executable, "tick.py")
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    (repo / "later.py").write_text("y = 2\n")
    git(repo, "add", "later.py")
    git(repo, "commit", "-q", "-m", "a commit that lands while the run trains")
    assert git(repo, "rev-parse", "HEAD") != head
    assert is_alive(ProcessRef.from_json(run_json(run_dir)["process"]))
    ident = run_json(run_dir)["identity"]
    assert ident["harness_commit"] == head
    assert ident["branch"] == "main"
    assert ident["harness_dirty_at_launch"] is False


def test_run_json_is_present_and_null(repo: Path):
    launch(repo, sys.executable, "ok.py")
    run_dir = repo / "runs" / "r"
    ex = wait_exit(run_dir)
    run = run_json(run_dir)
    for key in ("v", "name", "argv", "cwd", "env", "config_path", "config_sha256", "attempt", "launched_at",
                "launched_at_unix", "identity", "preflight", "allow_dirty_reason", "supervisor", "process"):
        assert key in run, key
    assert run["config_path"] is None and run["config_sha256"] is None
    assert set(run["process"]) == {"pid", "create_time", "pgid", "host"}
    assert run["process"]["host"] == run["supervisor"]["host"] == socket.gethostname()  # where pid means this process
    assert run["process"]["pgid"] == run["process"]["pid"]
    assert set(run["supervisor"]) >= {"pid", "create_time"}
    assert run["supervisor"]["pid"] != run["process"]["pid"]
    assert set(ex) >= {"returncode", "signal", "ended_at", "duration_s"}
    assert run["env"]["STEPWATCH_RUN_DIR"] == str(run_dir) and run["env"]["STEPWATCH_ATTEMPT"] == "1"
    assert run["env"]["PYTHONUNBUFFERED"] == "1"


# --- supervisor, exit records ----------------------------------------------------------------------

def test_exit_json_carries_the_real_exit_code(repo: Path):
    launch(repo, sys.executable, "exit3.py")
    ex = wait_exit(repo / "runs" / "r")
    assert ex["returncode"] == 3 and ex["signal"] is None
    assert ex["duration_s"] >= 0 and ex["ended_at"].endswith("Z")


def test_sigkilled_child_is_recorded_as_sigkill(repo: Path):
    launch(repo, sys.executable, "sleep.py")
    run_dir = repo / "runs" / "r"
    pid = run_json(run_dir)["process"]["pid"]
    os.kill(pid, signal.SIGKILL)
    ex = wait_exit(run_dir)
    assert ex["returncode"] is None and ex["signal"] == "SIGKILL"


def test_child_environment_and_process_group(repo: Path):
    (repo / "env.py").write_text(
        "import os\nprint(os.environ['STEPWATCH_RUN_DIR'], os.environ['STEPWATCH_ATTEMPT'],"
        " os.environ.get('PYTHONUNBUFFERED'), os.environ.get('EXTRA'), os.getpgid(0) == os.getpid(),"
        " 'PYTHONPATH' in os.environ)\n")
    git(repo, "add", "env.py")
    git(repo, "commit", "-q", "-m", "env")
    r = launch(repo, sys.executable, "env.py", extra=("--env", "EXTRA=yes"))
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    wait_exit(run_dir)
    out = (run_dir / "train.log").read_text().split()
    assert out == [str(run_dir), "1", "1", "yes", "True", str("PYTHONPATH" in os.environ)]


def test_first_line_of_a_slow_printer_lands_within_two_seconds(repo: Path):
    r = launch(repo, sys.executable, "tick.py")
    assert r.returncode == 0
    t0 = time.monotonic()
    log = repo / "runs" / "r" / "train.log"
    wait_until(lambda: log.exists() and b"tick 0\n" in log.read_bytes(), timeout_s=2.0,
               what="the first line in train.log (PYTHONUNBUFFERED must be set)")
    assert time.monotonic() - t0 < 2.0


def test_log_bytes_land_unmodified(repo: Path):
    payload = b"progress 1/3\rprogress 2/3\rprogress 3/3\n\xff\xfe not utf-8 \xc3\x28\nno trailing newline"
    (repo / "bytes.py").write_text(
        f"import sys\nsys.stdout.buffer.write({payload!r})\nsys.stdout.buffer.flush()\n"
        "sys.stderr.buffer.write(b'')\n")
    git(repo, "add", "bytes.py")
    git(repo, "commit", "-q", "-m", "bytes")
    launch(repo, sys.executable, "bytes.py")
    run_dir = repo / "runs" / "r"
    assert wait_exit(run_dir)["returncode"] == 0
    assert (run_dir / "train.log").read_bytes() == payload


def test_missing_command_is_refused_before_anything_starts(repo: Path):
    r = launch(repo, "no-such-program-xyz", "--flag")
    assert r.returncode == 2
    assert "command not found" in r.stderr and "no-such-program-xyz" in r.stderr
    assert not (repo / "runs").exists()


def test_run_survives_cli_exit_and_sighup_to_the_launching_process_group(repo: Path):
    # The launching "terminal": a shell that leads its own process group and session, as an SSH
    # login shell does. An SSH drop sends SIGHUP to that group.
    shell = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -m stepwatch.tui.cli launch --no-tui --name r -- {sys.executable} tick.py; "
                       "sleep 300"],
        cwd=repo, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        # a login shell's SIGHUP is the default, whatever the test runner's (under nohup it is ignored,
        # and an ignored signal stays ignored in every child: the hangup would reach nothing)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    try:
        run_dir = repo / "runs" / "r"
        wait_until(lambda: (read_json(run_dir / "run.json") or {}).get("process", {}).get("pid"), 20,
                   what="the child's pid in run.json")
        ref = ProcessRef.from_json(run_json(run_dir)["process"])
        os.killpg(shell.pid, signal.SIGHUP)
        shell.wait(timeout=10)
        assert shell.returncode == -signal.SIGHUP  # the terminal's group did get the hangup
        lines_before = (run_dir / "train.log").read_bytes().count(b"\n")
        wait_until(lambda: (run_dir / "train.log").read_bytes().count(b"\n") > lines_before + 1, 5,
                   what="the run to keep printing after the hangup")
        assert probe(ref) == "alive"
        assert read_json(run_dir / "exit.json") is None
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)


# --- guard -----------------------------------------------------------------------------------------

def test_guard_refuses_a_second_launch_while_alive(repo: Path):
    assert launch(repo, sys.executable, "sleep.py").returncode == 0
    pid = run_json(repo / "runs" / "r")["process"]["pid"]
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 1
    assert f"pid {pid}" in r.stderr and "stepwatch stop" in r.stderr
    assert not list((repo / "runs" / "r").glob("train.*.log"))  # nothing rotated


def test_stale_run_json_whose_pid_was_reused_does_not_block(repo: Path):
    run_dir = repo / "runs" / "r"
    run_dir.mkdir(parents=True)
    me = psutil.Process()  # alive, but not the process the stale run.json captured
    stale = {"v": 1, "name": "r", "attempt": 1, "launched_at_unix": time.time() - 3600,
             "process": {"pid": me.pid, "create_time": me.create_time() - 1000.0, "pgid": me.pid},
             "supervisor": {"pid": me.pid, "create_time": me.create_time() - 1000.0}}
    (run_dir / "run.json").write_text(json.dumps(stale))
    assert probe(ProcessRef.from_json(stale["process"])) == "reused"
    r = launch(repo, sys.executable, "ok.py")
    assert r.returncode == 0, r.stderr
    assert run_json(run_dir)["attempt"] == 2


# --- rotation and relaunch -------------------------------------------------------------------------

def test_crash_then_relaunch_keeps_old_log_and_new_log_is_clean(repo: Path):
    r = launch(repo, sys.executable, "crash.py")
    assert r.returncode == 0
    run_dir = repo / "runs" / "r"
    assert wait_exit(run_dir)["returncode"] == 1
    first_log = (run_dir / "train.log").read_bytes()
    assert b"Traceback" in first_log
    stamp_t = run_json(run_dir)["launched_at_unix"]
    (repo / "crash.py").write_text("print('step 1')\nprint('step 2 fine')\n")
    git(repo, "commit", "-qam", "fix the crash")
    r = stepwatch("relaunch", "--no-tui", "r", "--runs-dir", str(repo / "runs"), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert wait_exit(run_dir)["returncode"] == 0
    from stepwatch.monitors.runfiles import utc_stamp

    old = run_dir / f"train.{utc_stamp(stamp_t)}.log"
    assert old.read_bytes() == first_log
    assert (run_dir / "train.log").read_bytes().count(b"Traceback") == 0
    assert b"step 2 fine" in (run_dir / "train.log").read_bytes()
    assert (run_dir / f"exit.{utc_stamp(stamp_t)}.json").exists()
    assert run_json(run_dir)["attempt"] == 2


def test_two_rotations_in_the_same_second_never_collide(tmp_path: Path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    t = 1_780_000_000.0
    for i in range(3):
        (run_dir / "run.json").write_text(json.dumps({"launched_at_unix": t}))
        (run_dir / "train.log").write_text(f"attempt {i}\n")
        rotate(run_dir)
    names = sorted(p.name for p in run_dir.glob("train.*.log"))
    assert names == ["train.20260528T202640Z-1.log", "train.20260528T202640Z-2.log", "train.20260528T202640Z.log"]
    assert (run_dir / "train.20260528T202640Z-2.log").read_text() == "attempt 2\n"
    assert (run_dir / "run.20260528T202640Z-2.json").exists()
    assert plan_rotation(run_dir) == []


def test_relaunch_from_a_config_file_says_what_changed(repo: Path):
    cfg = repo / "run.toml"
    cfg.write_text(f'name = "cfgrun"\ncommand = ["{sys.executable}", "ok.py"]\nenv = {{ LR = "1e-4" }}\n')
    git(repo, "add", "run.toml")
    git(repo, "commit", "-qm", "config")
    r = stepwatch("launch", "--no-tui", "run.toml", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "cfgrun"
    wait_exit(run_dir)
    run = run_json(run_dir)
    assert run["config_path"] == str(cfg.resolve()) and len(run["config_sha256"]) == 64
    cfg.write_text(f'name = "cfgrun"\ncommand = ["{sys.executable}", "ok.py"]\nenv = {{ LR = "3e-4" }}\n')
    git(repo, "commit", "-qam", "new lr")
    old, new = run["identity"]["harness_commit"], git(repo, "rev-parse", "HEAD").strip()
    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "config changed since the last attempt:" in r.stdout and "3e-4" in r.stdout
    assert f"commit {old[:7]} → {new[:7]} since the last attempt (1 file changed: run.toml)" in r.stdout, r.stdout
    assert run_json(run_dir)["env"]["LR"] == "3e-4"
    wait_exit(run_dir)  # the control: nothing new, nothing said
    r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
    assert r.returncode == 0 and "config unchanged since the last attempt" in r.stdout, r.stdout
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("commit ")], r.stdout


def test_relaunch_refused_while_alive(repo: Path):
    launch(repo, sys.executable, "sleep.py")
    r = stepwatch("relaunch", "--no-tui", "r", "--runs-dir", str(repo / "runs"), cwd=repo)
    assert r.returncode == 1 and "stepwatch stop" in r.stderr


# --- config ----------------------------------------------------------------------------------------

def test_unknown_config_key_is_named_with_the_accepted_ones(repo: Path):
    cfg = repo / "bad.toml"
    cfg.write_text('name = "x"\ncommand = ["python3", "ok.py"]\nwarmup_ratio = 0.1\n')
    r = stepwatch("launch", "--no-tui", str(cfg), cwd=repo)
    assert r.returncode == 2
    assert "'warmup_ratio'" in r.stderr and "accepted keys are" in r.stderr and "command" in r.stderr


def test_unknown_preflight_key_is_named(repo: Path):
    cfg = repo / "bad.toml"
    cfg.write_text('name = "x"\ncommand = ["python3", "ok.py"]\n[preflight]\ntest_cmd = ["pytest"]\n')
    r = stepwatch("launch", "--no-tui", str(cfg), cwd=repo)
    assert r.returncode == 2 and "'test_cmd'" in r.stderr and "test_command" in r.stderr


def test_config_paths_are_relative_to_the_file(tmp_path: Path):
    repo = make_repo(tmp_path / "h", {"sub/ok.py": "print(1)\n"})
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    (cfg_dir / "run.toml").write_text(
        f'name = "rel"\ncommand = ["{sys.executable}", "ok.py"]\ncwd = "../h/sub"\nruns_dir = "../myruns"\n')
    r = stepwatch("launch", "--no-tui", str(cfg_dir / "run.toml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "myruns" / "rel"
    assert wait_exit(run_dir)["returncode"] == 0
    assert run_json(run_dir)["cwd"] == str((repo / "sub").resolve())


# --- stop ------------------------------------------------------------------------------------------

def test_stop_escalates_and_records_each_signal(repo: Path):
    (repo / "stubborn.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\nwhile True:\n    time.sleep(0.1)\n")
    git(repo, "add", "stubborn.py")
    git(repo, "commit", "-qm", "stubborn")
    launch(repo, sys.executable, "stubborn.py")
    run_dir = repo / "runs" / "r"
    wait_until(lambda: b"ready" in (run_dir / "train.log").read_bytes(), 10, what="the child to install its handlers")
    r = stepwatch("stop", "r", "--runs-dir", str(repo / "runs"), "--grace", "0.5", "--reason", "test")
    assert r.returncode == 0, r.stderr
    assert "SIGKILL" in r.stdout
    stop = read_json(run_dir / "stop.json")
    assert [s["signal"] for s in stop["signals"]] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert stop["reason"] == "test" and stop["grace_s"] == 0.5
    assert read_json(run_dir / "exit.json")["signal"] == "SIGKILL"
    assert stop["ended_by"]["signal"] == "SIGKILL"
    assert b"SIG" not in (run_dir / "train.log").read_bytes()  # nothing written into the child's log


def test_stop_with_sigint_honoured_ends_at_sigint(repo: Path):
    launch(repo, sys.executable, "tick.py")
    run_dir = repo / "runs" / "r"
    wait_until(lambda: b"tick 0" in (run_dir / "train.log").read_bytes(), 10, what="first tick")
    r = stepwatch("stop", str(run_dir), "--grace", "5")
    assert r.returncode == 0, r.stderr
    stop = read_json(run_dir / "stop.json")
    assert [s["signal"] for s in stop["signals"]] == ["SIGINT"]
    ex = read_json(run_dir / "exit.json")
    # Python ends an unhandled KeyboardInterrupt by re-raising SIGINT on itself.
    assert ex["signal"] == "SIGINT" and ex["returncode"] is None and ex["stop_requested"] is True
    assert b"KeyboardInterrupt" in (run_dir / "train.log").read_bytes()
    # a stop the operator asked for reads as stopped, raises no alert, and watch exits 0 for it
    w = stepwatch("watch", str(run_dir), "--plain")
    assert w.returncode == 0, (w.stdout, w.stderr)
    import pwd

    me = pwd.getpwuid(os.geteuid()).pw_name
    assert stop["requested_by_user"] == me
    assert f"stopped as requested (SIGINT) by {me} at {stop['requested_at'][:16]}" in w.stdout, w.stdout
    assert "ALERT" not in w.stdout, w.stdout
    assert f"by {me} at " in stepwatch("status", str(run_dir)).stdout  # who asked, and when, everywhere
    s = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert s["alerts"] == [] and s["ended"]["stop_requested"] is True


def test_stop_survives_the_stopping_cli_being_killed(repo: Path):
    (repo / "slowstop.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
        "while True:\n    time.sleep(0.1)\n")
    git(repo, "add", "slowstop.py")
    git(repo, "commit", "-qm", "slowstop")
    launch(repo, sys.executable, "slowstop.py")
    run_dir = repo / "runs" / "r"
    wait_until(lambda: b"ready" in (run_dir / "train.log").read_bytes(), 10, what="ready")
    r = stepwatch("stop", str(run_dir), "--grace", "1", "--no-wait")
    assert r.returncode == 0
    ex = wait_exit(run_dir)
    assert ex["signal"] == "SIGTERM"
    assert [s["signal"] for s in read_json(run_dir / "stop.json")["signals"]] == ["SIGINT", "SIGTERM"]


def test_stopping_an_ended_run_says_so_and_exits_0(repo: Path):
    launch(repo, sys.executable, "exit3.py")
    run_dir = repo / "runs" / "r"
    wait_exit(run_dir)
    r = stepwatch("stop", str(run_dir))
    assert r.returncode == 0 and "already ended" in r.stdout and "code 3" in r.stdout


def test_unknown_run_is_a_usage_error(tmp_path: Path):
    r = stepwatch("stop", "nope", "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and "no run 'nope'" in r.stderr


def test_runs_lists_one_line_per_run(repo: Path):
    launch(repo, sys.executable, "exit3.py", name="a")
    launch(repo, sys.executable, "sleep.py", name="b")
    wait_exit(repo / "runs" / "a")
    r = stepwatch("runs", "--runs-dir", str(repo / "runs"))
    assert r.returncode == 0
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert "exited" in lines["a"] and "code 3" in lines["a"]
    assert "running" in lines["b"] and str(run_json(repo / "runs" / "b")["process"]["pid"]) in lines["b"]


def test_survivors_of_an_ended_run_are_listed_and_can_be_killed(repo: Path):
    (repo / "orphan.py").write_text(
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('worker', p.pid, flush=True)\n")  # the parent exits; its 'DataLoader worker' lives on
    git(repo, "add", "orphan.py")
    git(repo, "commit", "-qm", "orphan")
    launch(repo, sys.executable, "orphan.py")
    run_dir = repo / "runs" / "r"
    assert wait_exit(run_dir)["returncode"] == 0
    worker = int((run_dir / "train.log").read_text().split()[1])
    try:
        assert psutil.pid_exists(worker)
        r = stepwatch("stop", str(run_dir))
        assert r.returncode == 0 and "already ended" in r.stdout
        assert f"{worker}" in r.stderr and "--survivors" in r.stderr
        r = stepwatch("status", str(run_dir), "--json")
        assert [p["pid"] for p in json.loads(r.stdout)["survivors"]] == [worker]
        r = stepwatch("relaunch", "--no-tui", str(run_dir), "--allow-dirty", "x")
        assert f"{worker}" in r.stderr and "survive" in r.stderr
        assert r.returncode == 0, r.stderr
        wait_exit(run_dir)  # attempt 2 leaves a worker of its own
        worker2 = int((run_dir / "train.log").read_text().split()[1])
        r = stepwatch("stop", "--survivors", str(run_dir))  # survivors of every attempt, rotated ones too
        assert r.returncode == 0 and f"pid {worker}" in r.stdout and f"pid {worker2}" in r.stdout
        for w in (worker, worker2):
            wait_until(lambda: not psutil.pid_exists(w) or psutil.Process(w).status() == psutil.STATUS_ZOMBIE,
                       5, what="the survivors to die")
    finally:
        for w in (worker, locals().get("worker2")):
            if w and psutil.pid_exists(w):
                os.kill(w, signal.SIGKILL)


def test_a_launch_in_progress_holds_the_run_and_a_second_one_is_refused(repo: Path):
    import fcntl

    (repo / "runs").mkdir()
    fd = os.open(repo / "runs" / ".r.launch.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a first launch holds while its checklist runs
    try:
        r = launch(repo, sys.executable, "ok.py")
        assert r.returncode == 1 and "another launch" in r.stderr
        assert not (repo / "runs" / "r" / "run.json").exists()
    finally:
        os.close(fd)
    assert launch(repo, sys.executable, "ok.py").returncode == 0


def test_the_tree_is_sampled_again_after_a_slow_checklist(repo: Path):
    cfg = repo / "t.toml"
    cfg.write_text(f'name = "t"\ncommand = ["{sys.executable}", "ok.py"]\n[preflight]\n'
                   f'test_command = ["sh", "-c", "echo edited >> exit3.py; echo 1 passed"]\n')
    git(repo, "add", "t.toml")
    git(repo, "commit", "-qm", "cfg")
    r = stepwatch("launch", "--no-tui", "t.toml", cwd=repo)
    assert r.returncode == 1 and "changed while the checklist ran" in r.stderr and "exit3.py" in r.stderr
    assert not (repo / "runs" / "t" / "run.json").exists()


def test_a_second_stop_never_overwrites_the_first(repo: Path):
    (repo / "trap.py").write_text("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                  "print('ready', flush=True)\nwhile True:\n    time.sleep(0.1)\n")
    git(repo, "add", "trap.py")
    git(repo, "commit", "-qm", "trap")
    launch(repo, sys.executable, "trap.py")
    run_dir = repo / "runs" / "r"
    wait_until(lambda: b"ready" in (run_dir / "train.log").read_bytes(), 10, what="ready")
    assert stepwatch("stop", str(run_dir), "--grace", "3", "--no-wait").returncode == 0
    wait_until(lambda: (read_json(run_dir / "stop.json") or {}).get("signals"), 5, what="SIGINT recorded")
    r = stepwatch("stop", str(run_dir), "--grace", "0")
    assert r.returncode == 0 and "already in progress" in r.stdout
    stop = read_json(run_dir / "stop.json")
    assert stop["grace_s"] == 3.0 and stop["signals"][0]["signal"] == "SIGINT"
    assert wait_exit(run_dir)["signal"] == "SIGTERM"


def test_run_files_are_readable_by_other_users(repo: Path):
    launch(repo, sys.executable, "ok.py")
    run_dir = repo / "runs" / "r"
    wait_exit(run_dir)
    for f in ("run.json", "exit.json", "train.log"):
        assert (run_dir / f).stat().st_mode & 0o044 == 0o044, f


@pytest.mark.parametrize("body, word", [
    ('env = { "A=B" = "1" }', "not a valid environment variable name"),
    ('[preflight]\nmin_free_bytes = "abc"', "min_free_bytes must be a positive number"),
    ('[preflight]\ntest_timeout_s = -1', "test_timeout_s must be a positive number"),
    ('[alerts]\ncommand = 5', "command must be an argv list"),
])
def test_ill_typed_config_values_are_usage_errors(repo: Path, body: str, word: str):
    cfg = repo / "bad.toml"
    cfg.write_text(f'name = "x"\ncommand = ["{sys.executable}", "ok.py"]\n{body}\n')
    r = stepwatch("launch", "--no-tui", str(cfg), cwd=repo)
    assert r.returncode == 2 and word in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_grace_must_be_finite_and_not_negative(repo: Path):
    launch(repo, sys.executable, "exit3.py")
    for g in ("-5", "inf", "nan"):
        r = stepwatch("stop", "r", "--runs-dir", str(repo / "runs"), "--grace", g)
        assert r.returncode == 2 and "--grace" in r.stderr, g


def test_an_empty_override_reason_is_a_usage_error(repo: Path):
    (repo / "ok.py").write_text("print('changed')\n")
    r = launch(repo, sys.executable, "ok.py", extra=("--allow-dirty", "  "))
    assert r.returncode == 2 and "non-empty REASON" in r.stderr
    assert not (repo / "runs" / "r" / "run.json").exists()


STUBBORN_PY = """\
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
                           "signal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
                           "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                           "time.sleep(600)\\n"], start_new_session=True)
print("worker", worker.pid, flush=True)
time.sleep(600)
"""


def test_a_relaunch_during_a_stop_waits_for_its_ladder_and_no_worker_runs_beside_the_new_attempt(repo: Path):
    """The command ends at SIGINT, its worker ignores INT and TERM: the relaunch waits for the
    supervisor's KILL rung; the old worker is gone before attempt 2 starts."""
    (repo / "stubborn.py").write_text(STUBBORN_PY)
    git(repo, "add", "stubborn.py")
    git(repo, "commit", "-qm", "stubborn")
    launch(repo, sys.executable, "stubborn.py")
    run_dir = repo / "runs" / "r"
    printed: list[str] = wait_until(lambda: (run_dir / "train.log").read_text().split()[1:2], 10, what="the worker")
    worker = int(printed[0])
    workers = [worker]
    try:
        wait_until(lambda: worker in [p.get("pid") for p in (read_json(run_dir / "procs.json") or {}).get("processes", [])],
                   10, what="the worker in the recorded tree")
        r = stepwatch("stop", str(run_dir), "--grace", "9", "--no-wait")  # a ladder (18 s) longer than
        # the 15 s a relaunch waits for a supervisor that is not stopping anything
        assert r.returncode == 0, r.stderr
        wait_exit(run_dir)  # the command took the INT; its worker did not
        assert psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE
        r = stepwatch("relaunch", "--no-tui", str(run_dir), cwd=repo)
        assert r.returncode == 0, r.stderr
        assert "waiting for the stop of attempt 1 to finish its ladder" in r.stderr
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
        rotated = [read_json(p) for p in run_dir.glob("stop.*.json")]
        assert [s["signal"] for s in rotated[0]["signals"]] == ["SIGINT", "SIGTERM", "SIGKILL"], rotated  # type: ignore[index]
        assert run_json(run_dir)["attempt"] == 2
        # attempt 2 starts a worker of its own that ignores INT and TERM: the stop's KILL rung ends it too
        # (the suite fails on any process a test leaves behind, tests/session_guards.py)
        log = run_dir / "train.log"
        second: list[str] = wait_until(lambda: log.read_text().split()[1:2] if log.exists() else None, 10,
                                       what="attempt 2's worker")
        worker2 = int(second[0])
        workers.append(worker2)
        wait_until(lambda: worker2 in [p.get("pid") for p in (read_json(run_dir / "procs.json") or {}).get("processes", [])],
                   10, what="attempt 2's worker in the recorded tree")
        r = stepwatch("stop", str(run_dir), "--grace", "1")
        assert r.returncode == 0, r.stderr
        wait_until(lambda: not psutil.pid_exists(worker2) or psutil.Process(worker2).status() == psutil.STATUS_ZOMBIE,
                   10, what="attempt 2's worker to be gone after the stop")
    finally:
        for pid in workers:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
