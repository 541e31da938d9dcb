"""A full disk: the runs dir on a real, tiny file system (tmpfs, mounted by the test as
root) that the run fills. The end is recorded (exit.json from the space the supervisor reserved at
its start, the ENOSPC it hit written into it), no temp file is left, and no detector fires from the
silence of files that could not be written: a full disk is an alert of its own, and the stall
detector says it did not judge. The control: the same silence on a disk with room is a stall."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import git, make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json

FILL_PY = textwrap.dedent('''\
    import os, sys, time
    from pathlib import Path
    from stepwatch.telemetry import StepTelemetry

    fill, marker = sys.argv[1] == "fill", Path(sys.argv[2])
    tel = StepTelemetry(max_steps=1000)
    tel.step_begin()
    for _ in range(20):
        time.sleep(0.05)
        tel.step_end()
    print("20 steps", flush=True)
    if fill:  # something else on the machine fills the file system the runs dir is on
        try:
            with open(Path(os.environ["STEPWATCH_RUN_DIR"]).parent / "filler", "wb") as f:
                while True:
                    f.write(b"x" * 65536)
        except OSError:
            pass
    marker.write_text("silent from now on")
    for _ in range(140):  # 7 s: training goes on (fill), or the events fall silent (control)
        time.sleep(0.05)
        if fill:
            tel.step_end()
        try:
            print("still training", flush=True)
        except OSError:
            pass
    ''')


#: A job that prints with no try/except (most do): it must print on through a full disk and exit 0.
PRINTS_PY = textwrap.dedent('''\
    import os, sys, time
    from pathlib import Path

    from stepwatch.telemetry import StepTelemetry

    full_s = float(sys.argv[1])
    filler = Path(os.environ["STEPWATCH_RUN_DIR"]).parent / "filler"
    tel = StepTelemetry()
    tel.step_begin()
    time.sleep(0.05)
    tel.step_end()  # step 1, written before the disk fills
    tel.flush()
    print("before the disk fills", flush=True)
    log = Path(os.environ["STEPWATCH_RUN_DIR"]) / "train.log"
    t0 = time.monotonic()  # the line is in the log before the disk fills (the pump is another process)
    while b"before the disk fills" not in (log.read_bytes() if log.exists() else b""):
        assert time.monotonic() - t0 < 60, "the log pump never wrote the first line"
        time.sleep(0.01)
    try:  # something else on the machine fills the file system the runs dir is on
        with open(filler, "wb") as f:
            while True:
                f.write(b"x" * 65536)
    except OSError:
        pass
    t0, i = time.monotonic(), 0
    while time.monotonic() - t0 < full_s:
        print(f"line {i} " + "y" * 200, flush=True)
        i += 1
        time.sleep(0.01)
        tel.step_end()  # dropped while the disk is full (counted)
    filler.unlink()  # space returns
    for j in range(50):  # 3 s: the supervisor sees the room and pages the full disk's resolution
        print(f"after space returned {j}", flush=True)
        time.sleep(0.06)
        tel.step_end()  # the events resume within the emitter's retry interval
    tel.run_end()
    tel.close()
    print("done", flush=True)
    ''')


PING_PY = textwrap.dedent('''\
    import json, os, sys
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\\n")
    ''')


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root with CAP_SYS_ADMIN; CI has it): {r.stderr.strip()}")


@pytest.fixture
def small_runs(tmp_path: Path):
    """A repo whose runs dir is a 4 MiB tmpfs."""
    repo = make_repo(tmp_path / "repo", {"fill.py": FILL_PY, "prints.py": PRINTS_PY})
    runs = repo / "runs"
    _mount_tmpfs(runs, "4m")
    try:
        yield repo
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def _status(run_dir: Path) -> dict:
    r = stepwatch("status", str(run_dir), "--json")
    return json.loads(r.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("fill", [True, False], ids=["disk-full", "control-disk-with-room"])
def test_a_full_disk_records_the_end_and_fires_no_stall(small_runs: Path, tmp_path: Path, fill: bool):
    repo = small_runs
    marker = tmp_path / "silent"
    r = stepwatch("launch", "--no-tui", "--name", "r", "--override", "a tiny runs dir on purpose", "--",
                  sys.executable, "fill.py", "fill" if fill else "room", str(marker), cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    wait_until(marker.exists, 30, what="the run to reach the silence")
    # the events are silent from here: wait until the step in progress is long past the stall threshold
    snap = wait_until(lambda: (s := _status(run_dir))["state"] == "running"
                      and (s["stall"].get("current_step_elapsed_s") or 0) > 4.5 and s, 20, interval_s=0.3,
                      what="the silence to pass the stall threshold")
    kinds = [a["kind"] for a in snap["alerts"]]
    if fill:
        assert snap["disk"]["full"] is True and snap["disk"]["free_bytes"] < 1 << 20
        assert snap["stall"]["state"] == "not judged", snap["stall"]
        assert "file system is full" in snap["stall"]["reason"] and "ENOSPC" in snap["stall"]["reason"]
        assert "stall" not in kinds and "disk_full" in kinds, kinds
        text = stepwatch("status", str(run_dir)).stdout
        assert "disk: the run dir's file system is full" in text and "[disk_full]" in text, text
    else:  # the control: the same silence with room on the disk is a stall
        assert snap["disk"]["full"] is False
        assert snap["stall"]["state"] == "stalled" and "stall" in kinds and "disk_full" not in kinds, kinds
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 30, what="the end")
    assert ex["returncode"] == 0
    wait_until(lambda: not _status(run_dir)["supervisor_alive"], 90, what="the supervisor to finish")
    left = sorted(p.name for p in run_dir.iterdir() if p.name.endswith(".tmp") or "reserve" in p.name)
    assert left == [], left  # no temp file, and the reserve given back
    if fill:
        assert any("file system was full" in e and "ENOSPC" in e and "reserved at the start" in e
                   for e in ex["write_errors"]), ex
        text = stepwatch("status", str(run_dir)).stdout
        assert "exited with code 0" in text and "supervisor: exit.json: the file system was full" in text, text
    else:
        assert ex["write_errors"] == [] and ex["log_lost_bytes"] == 0


def test_exit_json_is_retried_until_the_disk_has_room(tmp_path: Path):
    """No reserve left and a full disk: the supervisor keeps trying (every retry_every_s) and writes
    exit.json once space is freed; each distinct failure is in its write_errors."""
    from stepwatch.launcher.exitrecord import record_exit

    fs = tmp_path / "fs"
    _mount_tmpfs(fs, "1m")
    try:
        filler = fs / "filler"
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"x" * 65536)
        except OSError:
            pass
        assert record_exit(fs, {"v": 1, "returncode": 0}, None, retry_every_s=0.05, retry_for_s=0.3) is False
        assert not (fs / "exit.json").exists() and not [p for p in fs.iterdir() if p.name.endswith(".tmp")]
        t = threading.Timer(0.3, filler.unlink)
        t.start()
        rec = {"v": 1, "returncode": 0}
        t0 = time.monotonic()
        assert record_exit(fs, rec, None, retry_every_s=0.05, retry_for_s=10) is True
        t.join()
        assert time.monotonic() - t0 < 5
        got = read_json(fs / "exit.json")
        assert got["returncode"] == 0 and len(got["write_errors"]) == 1 and "ENOSPC" in got["write_errors"][0]
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


@pytest.mark.slow
def test_a_job_that_prints_through_a_full_disk_for_a_minute_exits_0_and_the_lost_bytes_are_counted(
        small_runs: Path, tmp_path: Path):
    """The job's output goes through the supervisor's log pump: on a full disk its prints neither
    fail nor block, the bytes train.log could not take are counted (exit.json, status), and the log
    resumes when space returns; the pages (the full disk, its resolution, the finished page) say what was lost."""
    pings = tmp_path / "pings.jsonl"  # the [alerts] command's record, outside the full file system
    (small_runs / "ping.py").write_text(PING_PY)
    (small_runs / "run.toml").write_text(
        f'name = "p"\ncommand = [{json.dumps(sys.executable)}, "prints.py", "60"]\n[alerts]\n'
        f'command = [{json.dumps(sys.executable)}, {json.dumps(str(small_runs / "ping.py"))}, {json.dumps(str(pings))}]\n'
        'finished = true\n')
    git(small_runs, "add", "-A")
    git(small_runs, "commit", "-qm", "alerts")
    r = stepwatch("launch", "--no-tui", "run.toml", "--override", "a tiny runs dir on purpose", cwd=small_runs)
    assert r.returncode == 0, r.stderr
    run_dir = small_runs / "runs" / "p"
    ex = wait_until(lambda: read_json(run_dir / "exit.json"), 120, interval_s=0.5, what="the end")
    assert ex["returncode"] == 0 and ex["signal"] is None, ex
    assert ex["log_lost_bytes"] > 100_000 and ex["log_lost_reason"] == "No space left on device", ex
    log = (run_dir / "train.log").read_text(errors="replace")
    assert "before the disk fills" in log and "after space returned 49" in log and log.endswith("done\n"), log[-500:]
    snap = _status(run_dir)
    assert snap["disk"]["log_lost_bytes"] == ex["log_lost_bytes"]
    text = stepwatch("status", str(run_dir)).stdout
    assert "train.log lost " in text and f"({ex['log_lost_bytes']} bytes) of the run's output" in text, text
    assert "exited with code 0" in text
    # the events paused while the disk was full and resumed after: step 1, a gap, the last steps, run_end
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = [json.loads(ln) for ln in lines if ln.endswith("}")]
    assert len(lines) - len(events) <= 1, lines  # the line a write cut short when the disk filled, ended by the next
    steps = [e["step"] for e in events if e["kind"] == "step"]
    gaps = [(a, b) for a, b in zip(steps, steps[1:]) if b != a + 1]
    assert steps[0] == 1 and len(gaps) == 1 and gaps[0][1] - gaps[0][0] > 100, (steps[:10], gaps)
    assert events[-1]["kind"] == "run_end" and events[-1]["dropped_events"] == gaps[0][1] - gaps[0][0] - 1, events[-1]
    # the pages: the full disk, its resolution and the finished page say what train.log lost
    pages = {p["kind"]: p["message"].splitlines()[-1] for p in map(json.loads, pings.read_text().splitlines())}
    assert "the run dir's file system is full" in pages.get("disk_full", ""), pages
    assert pages.get("resolved", "").startswith("resolved after ") and "train.log lost " in pages["resolved"], pages
    assert f"({ex['log_lost_bytes']} bytes) of the run's output (No space left on device)" in pages.get("finished", ""), pages
