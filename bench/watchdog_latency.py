"""SIGKILL of a watched child -> the watchdog reports it dead: stepwatch's ``wait_for_exit`` with a
pidfd, and with the ``kill -0`` poll alone, beside a bare ``pidfd_open`` + poll and a bare
``kill -0`` every 0.1 s, all on the same kills.

    python bench/watchdog_latency.py [--trials 20] [--quick] [--json FILE]

The harness the process-death floors were measured with (2-core development VM, 2026-11-30): this process plays the supervisor (it
starts the victim ``sleep 3600`` with ``subprocess.Popen`` and a thread reaps it, as the real
supervisor does); four watcher processes -- not the victim's parent -- each get the pid, set up and
answer "ready". After a random U(0.2, 0.7) s (seeded; it covers a whole 0.5 s poll period, so the
polling phase is random) this process takes ``monotonic_ns()`` and sends SIGKILL; each watcher takes
``monotonic_ns()`` when it notices and reports it. Latency = that minus the kill time. Watchers:

* ``stepwatch_pidfd``: ``stepwatch.monitors.watchdog.wait_for_exit(ProcessRef.of_pid(pid), poll_s=0.5)`` (what
  ``stepwatch watch`` calls between refreshes): the figure ``watchdog_latency_s``;
* ``stepwatch_poll``: the same with ``os.pidfd_open`` removed in that process, so only the
  ``kill -0`` + create_time probe every 0.5 s runs: ``watchdog_latency_poll_s``;
* ``bare_pidfd``: ``os.pidfd_open`` + ``select.poll()`` without timeout (the floor, ~0.4 ms there);
* ``bare_kill0_100ms``: ``os.kill(pid, 0)`` every 0.1 s (~60 ms there).

The four run at the same time on the same kills (on 2 cores they share the CPU when they wake).
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, kill_group, new_result, spread, write_json  # noqa: E402

TARGET_PIDFD_S = 0.01
TARGET_POLL_S = 1.0
POLL_S = 0.5

WATCHER = r'''
import os, select, sys, time
sys.path.insert(0, sys.argv[2])
METHOD = sys.argv[1]
if METHOD == "stepwatch_poll" and hasattr(os, "pidfd_open"):
    del os.pidfd_open                      # wait_for_exit falls back to the kill -0 poll
from stepwatch.monitors.watchdog import ProcessRef, wait_for_exit
POLL_S = float(sys.argv[3])
for line in sys.stdin:
    pid = int(line)
    if METHOD.startswith("stepwatch"):
        ref = ProcessRef.of_pid(pid)
        print("ready", flush=True)
        ok = wait_for_exit(ref, timeout_s=5.0, poll_s=POLL_S)
        t = time.monotonic_ns()
    elif METHOD == "bare_pidfd":
        fd = os.pidfd_open(pid)
        p = select.poll(); p.register(fd, select.POLLIN)
        print("ready", flush=True)
        ok = bool(p.poll(5000)); t = time.monotonic_ns(); os.close(fd)
    else:  # bare_kill0_100ms
        print("ready", flush=True)
        ok = False
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                ok = True
                break
            time.sleep(0.1)
        t = time.monotonic_ns()
    print(f"{t if ok else -1}", flush=True)
'''

METHODS = ("stepwatch_pidfd", "stepwatch_poll", "bare_pidfd", "bare_kill0_100ms")


def _readline(proc: subprocess.Popen, timeout_s: float) -> str | None:
    out = proc.stdout
    if out is None:  # (never: every watcher is started with stdout=PIPE)
        return None
    r, _, _ = select.select([out], [], [], timeout_s)
    if not r:
        return None
    line = out.readline()
    return line.decode().strip() if line else None


def measure(trials: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    watchers = {m: subprocess.Popen([sys.executable, "-c", WATCHER, m, str(ROOT), str(POLL_S)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
                for m in METHODS}
    lat: dict[str, list[float]] = {m: [] for m in METHODS}
    missed: dict[str, int] = {m: 0 for m in METHODS}
    try:
        for _ in range(trials):
            victim = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
            reaper = threading.Thread(target=victim.wait, daemon=True)
            reaper.start()
            try:
                for w in watchers.values():
                    if w.stdin is not None:  # (always: started with stdin=PIPE)
                        w.stdin.write(f"{victim.pid}\n".encode())
                        w.stdin.flush()
                for m, w in watchers.items():
                    if _readline(w, 10.0) != "ready":
                        raise RuntimeError(f"watcher {m} did not answer ready")
                time.sleep(rng.uniform(0.2, 0.7))
                t_kill = time.monotonic_ns()
                os.kill(victim.pid, signal.SIGKILL)
                for m, w in watchers.items():
                    line = _readline(w, 8.0)
                    t = int(line) if line and line.lstrip("-").isdigit() else -1
                    if t < 0:
                        missed[m] += 1
                    else:
                        lat[m].append((t - t_kill) / 1e9)
            finally:
                if victim.poll() is None:
                    victim.kill()
                reaper.join(5)
    finally:
        for w in watchers.values():
            try:
                if w.stdin is not None:
                    w.stdin.close()
            except OSError:
                pass
            kill_group(w)
    return {"trials": trials, "poll_s": POLL_S, "missed": missed,
            "latency_s": {m: spread(v) for m, v in lat.items()},
            "p99_or_max_s": {m: (max(v) if v else None) for m, v in lat.items()},
            "samples_s": lat}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="same as the default (20 trials, ~20 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    res = new_result("watchdog_latency", a.quick)
    F, N, B = res["figures"], res["notes"], res["baselines"]
    F["watchdog_latency_s"] = F["watchdog_latency_poll_s"] = None
    try:
        r = measure(a.trials, a.seed)
        res["details"] = {k: v for k, v in r.items()}
        L = r["latency_s"]
        for key, m in (("watchdog_latency_s", "stepwatch_pidfd"), ("watchdog_latency_poll_s", "stepwatch_poll")):
            if L[m]["n"]:
                F[key] = L[m]["median"]
                res["spreads"][key] = L[m]
            if r["missed"][m]:
                N[key] = f"{r['missed'][m]} of {a.trials} kills not noticed within 5 s"
        B["watchdog_latency_s"] = {"what": "bare pidfd_open + poll (same kills, median)",
                                   "value": L["bare_pidfd"]["median"], "unit": "s"}
        B["watchdog_latency_poll_s"] = {"what": "bare kill -0 every 0.1 s (same kills, median)",
                                        "value": L["bare_kill0_100ms"]["median"], "unit": "s"}
        for m in METHODS:
            s = L[m]
            if s["n"]:
                print(f"{m:18} median {s['median'] * 1e3:8.2f} ms  p90 {s['p90'] * 1e3:8.2f}  max {s['max'] * 1e3:8.2f} "
                      f"(n={s['n']}, missed {r['missed'][m]})")
            else:
                print(f"{m:18} nothing noticed (missed {r['missed'][m]})")
    except Exception as e:
        for k in ("watchdog_latency_s", "watchdog_latency_poll_s"):
            if F[k] is None:
                N[k] = f"{type(e).__name__}: {e}"
        print(f"watchdog_latency failed: {e!r}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
