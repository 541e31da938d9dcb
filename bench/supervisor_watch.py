"""The supervisor's watching: log-derived step times against the run's own, alert latency with no
view attached, and the supervisor's CPU share.

    python bench/supervisor_watch.py [--quick] [--json FILE]

Each run is an un-instrumented script printing a real tqdm bar (tqdm's defaults), launched by
stepwatch's own CLI, recording its true step ends itself (``time.time()`` after each step):

- ``log_timing_p50_error_250ms`` / ``log_timing_p99_error_250ms``: |log-derived p50 (p99) /
  the truth's - 1|, status --json after the run, 0.2-0.3 s steps (target <= 0.05);
- ``log_timing_p50_error_20ms``: the same at ~20 ms steps, k steps per tqdm update (<= 0.10);
- ``alert_latency_kill_s``: SIGKILL of the child until the ``[alerts]`` command has written its line,
  no view attached (median of ``--kills``; target <= 2 s);
- ``supervisor_cpu_share``: CPU seconds per wall second of the supervisor process (all its threads:
  the log timer, the detector loop, the events fold, the GPU sampler) while the job makes 10 steps/s
  and prints 100 log lines/s (target <= 0.02). For scale, the job's own share is in ``details``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import make_repo, nearest_rank, new_result, write_json  # noqa: E402

TQ = r"""
import json, sys, time
from tqdm import tqdm
steps, dt, lines, truth = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ends = [time.time()]
bar = tqdm(total=steps)
for i in range(1, steps + 1):
    time.sleep(dt * (0.8 + 0.4 * ((i * 7919) % 11) / 10))
    for j in range(lines):
        print(f"step {i} line {j}: some words a training script prints, loss=0.{i % 97:02d}", flush=True)
    bar.update(1)
    ends.append(time.time())
    if i % 5 == 0 or i == steps:
        with open(truth, "w") as f:
            json.dump(ends, f)
bar.close()
"""
PING = r"""
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{time.time()} {os.environ['STEPWATCH_ALERT_KIND']}\n")
"""


def cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def launch(repo: Path, name: str, argv: list[str], alerts: dict | None = None) -> Path:
    lines = [f"name = {json.dumps(name)}", f"command = {json.dumps(argv)}"]
    if alerts:
        lines += ["[alerts]"] + [f"{k} = {json.dumps(v)}" for k, v in alerts.items()]
    (repo / f"{name}.toml").write_text("\n".join(lines) + "\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", name], cwd=repo, check=True)
    r = cli("launch", "--no-tui", f"{name}.toml", cwd=repo)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return repo / "runs" / name


def read_json(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def wait_for(cond, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    return None


def timing(repo: Path, name: str, steps: int, dt: float) -> dict:
    truth = repo.parent / f"{name}.truth.json"
    run_dir = launch(repo, name, [sys.executable, "tq.py", str(steps), str(dt), "0", str(truth)])
    wait_for(lambda: read_json(run_dir / "exit.json"), steps * dt * 3 + 30)
    snap = json.loads(cli("status", str(run_dir), "--json", cwd=repo).stdout)
    ends = json.loads(truth.read_text())
    dts = sorted([b - a for a, b in zip(ends, ends[1:])][1:])
    got = snap["step_seconds"]
    return {"n_log": got["n"], "n_truth": len(dts), "timing": snap["step"]["timing"],
            "log_p50": got["p50"], "truth_p50": nearest_rank(dts, 50), "log_p99": got["p99"],
            "truth_p99": nearest_rank(dts, 99)}


def kill_latency(repo: Path, i: int) -> float | None:
    out = repo.parent / f"pings{i}.txt"
    truth = repo.parent / f"kill{i}.truth.json"
    run_dir = launch(repo, f"kill{i}", [sys.executable, "tq.py", "1000", "0.1", "0", str(truth)],
                     alerts={"command": [sys.executable, str(repo / "ping.py"), str(out)]})
    if not wait_for(lambda: truth.exists(), 30):
        return None
    pid = (read_json(run_dir / "run.json") or {})["process"]["pid"]
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    line = wait_for(lambda: out.exists() and out.read_text().strip(), 15)
    return float(line.split()[0]) - t0 if line else None


def cpu_share(repo: Path, window_s: float) -> dict:
    import psutil

    truth = repo.parent / "cpu.truth.json"
    run_dir = launch(repo, "cpu", [sys.executable, "tq.py", str(int((window_s + 10) * 10)), "0.1", "10", str(truth)])
    run = wait_for(lambda: (r := read_json(run_dir / "run.json")) and r.get("process", {}).get("pid") and r, 30)
    if run is None:
        raise RuntimeError(f"{run_dir}: no training process recorded within 30 s")
    sup, job = psutil.Process(run["supervisor"]["pid"]), psutil.Process(run["process"]["pid"])
    time.sleep(3.0)  # warm-up: imports, the first folds

    def cpu(p) -> float:
        t = p.cpu_times()
        return t.user + t.system

    s0, j0, t0 = cpu(sup), cpu(job), time.monotonic()
    time.sleep(window_s)
    s1, j1, t1 = cpu(sup), cpu(job), time.monotonic()
    job.kill()
    return {"supervisor_cpu_share": (s1 - s0) / (t1 - t0), "job_cpu_share": (j1 - j0) / (t1 - t0),
            "window_s": t1 - t0, "log_lines_per_s": 100, "steps_per_s": 10}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--window", type=float, default=None)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    res = new_result("supervisor_watch", a.quick)
    kills = a.kills or (3 if a.quick else 7)
    window = a.window or (8.0 if a.quick else 30.0)
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "harness", {"tq.py": TQ, "ping.py": PING, ".gitignore": "runs/\n"})
        slow = timing(repo, "t250", 40 if a.quick else 120, 0.25)
        fast = timing(repo, "t20", 300 if a.quick else 1000, 0.02)
        lat = [x for x in (kill_latency(repo, i) for i in range(kills)) if x is not None]
        cpu = cpu_share(repo, window)
    f = res["figures"]
    def err(d: dict, p: str) -> float | None:
        return abs(d[f"log_{p}"] / d[f"truth_{p}"] - 1) if d[f"log_{p}"] and d[f"truth_{p}"] else None

    f["log_timing_p50_error_250ms"] = err(slow, "p50")
    f["log_timing_p99_error_250ms"] = err(slow, "p99")
    f["log_timing_p50_error_20ms"] = err(fast, "p50")
    f["alert_latency_kill_s"] = statistics.median(lat) if lat else None
    f["supervisor_cpu_share"] = cpu["supervisor_cpu_share"]
    res["baselines"]["log_timing_p50_error_250ms"] = {"what": "the run's own step times (time.time() per step)",
                                                       "value": slow["truth_p50"], "unit": "s"}
    res["baselines"]["log_timing_p50_error_20ms"] = {"what": "the run's own step times", "value": fast["truth_p50"],
                                                      "unit": "s"}
    res["spreads"]["alert_latency_kill_s"] = {"n": len(lat), "min": min(lat, default=None),
                                              "max": max(lat, default=None)}
    res["details"] = {"t250": slow, "t20": fast, "kill_latencies_s": lat, "cpu": cpu}
    write_json(a.json, res)
    for k, v in f.items():
        print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    print(f"  250 ms: {slow}\n  20 ms: {fast}\n  job cpu share {cpu['job_cpu_share']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
