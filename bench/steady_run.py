"""A steady fake training run, launched for real by stepwatch's launcher, for the monitor benchmarks.

The job (``WRITER`` below, committed into a throwaway git repo so the clean-tree gate passes) writes,
on an absolute 100 Hz schedule, one log line per tick to stdout (so 100 lines/s into train.log, through
the supervisor) and, every 10th tick, one ``StepTelemetry.step_end`` (10 step events/s into
events.jsonl). It runs at most ``max_s`` seconds (a safety net), and :func:`steady_run` kills its
process group, the supervisor and the GPU sampler on the way out, and deletes the temp dir.

    python bench/steady_run.py --seconds 5     # launch, report what it wrote, clean up
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, make_repo  # noqa: E402

RUN_NAME = "swbench-steady-run"

WRITER = r'''
import os, random, sys, time
sys.path.insert(0, {root!r})   # stepwatch from the checkout (a job would `pip install stepwatch`)
from stepwatch.telemetry import StepTelemetry

MAX_S = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
HZ, STEP_EVERY = 100, 10        # 100 log lines/s, a step event every 10th line: 10 steps/s
tel = StepTelemetry(max_steps=10**7, attn_implementation_requested="sdpa")
rng = random.Random(0)
t0 = time.monotonic()
i = 0
while True:
    i += 1
    due = t0 + i / HZ
    now = time.monotonic()
    if now - t0 > MAX_S:
        break
    if due > now:
        time.sleep(due - now)
    micro = i % STEP_EVERY
    step = i // STEP_EVERY
    print(f"[train] step {{step:>8d}} micro {{micro}} loss={{rng.uniform(1.5, 3.0):.4f}} "
          f"lr=3.0e-04 grad_norm={{rng.uniform(0.2, 1.8):.3f}} tok/s={{rng.randint(90000, 130000)}}", flush=True)
    if micro == 0:
        tel.step_end(tokens=26048, padded_tokens=26112)
tel.close()
'''


@contextlib.contextmanager
def steady_run(max_s: float = 600.0, name: str = RUN_NAME) -> Iterator[Path]:
    """Launch the steady fake run with stepwatch's launcher; yield its run dir; kill and clean up."""
    from stepwatch.launcher.config import config_from_flags
    from stepwatch.launcher.launch import launch
    from stepwatch.monitors.runfiles import RUN_JSON, read_json

    tmp = Path(tempfile.mkdtemp(prefix="stepwatch-bench-run-"))
    run_dir = None
    try:
        repo = make_repo(tmp / "harness", {"writer.py": WRITER.format(root=str(ROOT))})
        cfg = config_from_flags([sys.executable, "writer.py", str(max_s)], name, str(repo), str(tmp / "runs"))
        res = launch(cfg)
        run_dir = res.run_dir
        yield run_dir
    finally:
        if run_dir is not None:
            run = read_json(run_dir / RUN_JSON) or {}
            pgid = (run.get("process") or {}).get("pgid") or (run.get("process") or {}).get("pid")
            sup = (run.get("supervisor") or {}).get("pid")
            for target, fn in ((pgid, os.killpg), (sup, os.killpg), (sup, os.kill)):
                if target:
                    try:
                        fn(int(target), signal.SIGKILL)
                    except (ProcessLookupError, PermissionError, OSError):
                        pass
            if sup:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:  # the supervisor is our child: reap it
                    try:
                        pid, _ = os.waitpid(int(sup), os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid:
                        break
                    time.sleep(0.02)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args(argv)
    with steady_run() as rd:
        t0 = time.monotonic()
        time.sleep(a.seconds)
        dt = time.monotonic() - t0
        ev = (rd / "events.jsonl").read_bytes().count(b"\n")
        log = (rd / "train.log").read_bytes().count(b"\n")
        print(json.dumps({"run_dir": str(rd), "seconds": round(dt, 2), "event_lines": ev, "log_lines": log,
                          "files": sorted(p.name for p in rd.iterdir())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
