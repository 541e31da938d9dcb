"""Attach to a big train.log: LogFollower's first screenful against ``tail -n 200``.

Builds a train.log of realistic content (HF Trainer ``\\r`` progress updates, printed log dicts,
warnings) -- 2 GB by default, 500 MB with ``--quick`` -- in a temporary directory that is deleted
afterwards, then times, on the same file with a warm page cache:

* ``LogFollower(path, keep_lines=200).poll()`` until ``last_lines`` holds the last 200 lines
  (construct + first poll: the backwards tail read, splitting, decoding), in this process;
* ``tail -n 200 FILE > /dev/null`` as a subprocess (its time includes process start-up).

Each is run ``--repeat`` times alternately; the medians are printed with their ratio. ``--json FILE``
writes the common shape of bench/common.py (figure ``attach_log_s``, baseline ``tail -n 200``; the
old fields under ``details``). Needs about the file's size free on the temp directory's file system.

    python3 bench/attach_log.py --quick
    python3 bench/attach_log.py --json attach.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepwatch.monitors.readers.textlog import LogFollower  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)
from stepwatch.monitors.runfiles import TRAIN_LOG  # noqa: E402

SCREEN_LINES = 200


def make_block(start_step: int, total: int) -> bytes:
    """About 64 KiB of Trainer-like output for steps start_step.. (bars, a dict every 10 steps)."""
    out = []
    step = start_step
    size = 0
    while size < 64 * 1024:
        step += 1
        pct = 100 * (step % total) // total
        bar = f"\r{pct:3d}%|{'█' * (pct // 10):<10}| {step % total}/{total} [1:02:03<3:04:05,  1.23s/it]"
        out.append(bar)
        size += len(bar) + 20
        if step % 10 == 0:
            d = (
                "\r" + " " * 46 + "\r"
                + f"{{'loss': '{5.5 - (step % 1000) / 1000:.4g}', 'grad_norm': '0.6336', "
                f"'learning_rate': '0.0009273', 'epoch': '{step / total:.4g}'}}\n"
            )
            out.append(d)
            size += len(d)
        if step % 97 == 0:
            w = f"[transformers] step {step}: some warning printed by a library, with a path /x/y/z.py:{step}\n"
            out.append(w)
            size += len(w)
    return "".join(out).encode("utf-8")


def build(path: Path, target_bytes: int) -> int:
    blocks = [make_block(i * 1000, 100_000) for i in range(16)]
    written = 0
    i = 0
    with open(path, "wb", buffering=8 * 1024 * 1024) as f:
        while written < target_bytes:
            b = blocks[i % len(blocks)]
            f.write(b)
            written += len(b)
            i += 1
        f.write("\r 99%|█████████▉| 99999/100000 [3:00:00<00:01,  1.23s/it]".encode())  # a live bar at the end
    return os.path.getsize(path)


def time_follower(path: Path) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    f = LogFollower(path, keep_lines=SCREEN_LINES)
    f.poll()
    lines = list(f.last_lines)
    dt = time.perf_counter() - t0
    f.close()
    return dt, lines


def time_tail(path: Path) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    p = subprocess.run(["tail", "-n", str(SCREEN_LINES), str(path)], stdout=subprocess.PIPE, check=True)
    dt = time.perf_counter() - t0
    return dt, p.stdout.decode("utf-8", "replace").split("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500 MB instead of 2 GB")
    ap.add_argument("--repeat", type=int, default=7, help="runs of each (alternating); medians reported")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--dir", help="where to build the file (default: the system temp dir)")
    args = ap.parse_args(argv)
    if shutil.which("tail") is None:
        print("tail(1) not found", file=sys.stderr)
        return 2
    target = (500 if args.quick else 2000) * 1000 * 1000
    with tempfile.TemporaryDirectory(prefix="stepwatch-attach-", dir=args.dir) as d:
        path = Path(d) / TRAIN_LOG
        t0 = time.perf_counter()
        size = build(path, target)
        build_s = time.perf_counter() - t0
        print(f"built {path.name}: {size / 1e6:.0f} MB in {build_s:.1f} s")
        # warm both paths once (page cache, imports), then alternate
        time_follower(path)
        time_tail(path)
        fol, tai = [], []
        lines_f: list[str] = []
        for _ in range(args.repeat):
            dt, lines_f = time_follower(path)
            fol.append(dt)
            dt, _lines_t = time_tail(path)
            tai.append(dt)
        # sanity: the follower's screen is the last 200 complete lines (a note, not a crash)
        screen_ok = len(lines_f) == SCREEN_LINES
    med_f = statistics.median(fol)
    med_t = statistics.median(tai)
    res = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "file_bytes": size,
        "screen_lines": SCREEN_LINES,
        "repeat": args.repeat,
        "follower_first_screen_s": {"median": med_f, "min": min(fol), "max": max(fol)},
        "tail_n_200_s": {"median": med_t, "min": min(tai), "max": max(tai)},
        "ratio_follower_over_tail": med_f / med_t if med_t > 0 else None,
    }
    print(f"LogFollower first screen ({SCREEN_LINES} lines): median {med_f * 1000:.2f} ms "
          f"(min {min(fol) * 1000:.2f}, max {max(fol) * 1000:.2f})")
    print(f"tail -n {SCREEN_LINES} (subprocess):          median {med_t * 1000:.2f} ms "
          f"(min {min(tai) * 1000:.2f}, max {max(tai) * 1000:.2f})")
    print(f"ratio follower/tail: {res['ratio_follower_over_tail']:.2f}")
    if args.json:
        out = common.new_result("attach_log", args.quick)
        out["figures"]["attach_log_s"] = med_f
        out["spreads"]["attach_log_s"] = common.spread(fol)
        out["baselines"]["attach_log_s"] = {"what": f"tail -n {SCREEN_LINES} on the same file (subprocess, median)",
                                            "value": med_t, "unit": "s"}
        if not screen_ok:
            out["notes"]["attach_log_s"] = f"the follower's screen held {len(lines_f)} lines, not {SCREEN_LINES}"
        out["details"] = res
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
