"""Attach to a finished run with 100,000 step events: the full status snapshot against json.loads.

    python bench/attach_events.py [--quick] [--steps 100000] [--pairs N] [--budget S] [--json FILE]

Generates, in a temporary directory deleted afterwards, a finished run dir as stepwatch writes it:
run.json (the captured process long gone), exit.json (code 0), a short train.log, an events.jsonl
with ``run_start``, ``--steps`` ``step`` events (lognormal durations around 19.5 s, the first flagged
``first``, a save every 500 steps with its ``phase`` begin/end and the next step flagged ``save``),
a ``log`` event every 10 steps, one ``dynamo`` event and ``run_end`` -- the lines ``StepTelemetry``
writes -- and events.state.json, saved by the very function the supervisor runs beside a run
(``stepwatch.monitors.fold.savedstate.follow``, here its last save, made once the run has ended). Then, in
interleaved rounds (the order rotates; page cache warm):

* A, the baseline: read events.jsonl and ``json.loads`` every line, nothing else;
* B, what an operator's attach does: ``RunObserver(run_dir).refresh()``, a new observer each time:
  it loads the saved state (checking the SHA-256 of the events bytes it stands on, the attempt and
  the code), reads what follows it, reads train.log, and builds the snapshot;
* C, the cold attach (a run without stepwatch's supervisor, or a state refused):
  ``RunObserver(run_dir, use_saved_state=False).refresh()`` parses every line and feeds the step
  statistics and the fallback detector from step 1.

Rounds: ``--pairs`` (default 10; ``--quick`` 4), but no new round starts once ``--budget`` seconds
have been spent, if at least 2 are done. Figures: ``attach_events_s`` (median of B, target <= 1 s),
``attach_events_ratio`` (median of the per-round B/A, target <= 3), ``attach_events_cold_s`` (median
of C, target <= 1 s: the same full story when there is no saved state). Details (no target): C/A,
the supervisor's cost (the fold of the whole file, and one save), the state file's size, and
``stepwatch status RUN --json`` as a whole process (interpreter start, imports, the refresh, the JSON
out; median of 3), beside ``python -c pass``. Every snapshot B and C gave is checked to be the same.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, new_result, spread, write_json  # noqa: E402

TARGET_S, TARGET_RATIO = 1.0, 3.0


def event_lines(steps: int, rng: random.Random, pid: int, t0: float, end: dict | None = None) -> Iterator[str]:
    """The lines of the events.jsonl of a finished run with ``steps`` step events, one at a time
    (a ~1 GB file for bench/cold_status.py is never held whole); ``end["t"]``: the last step's end."""
    enc = json.JSONEncoder(separators=(",", ":"))
    yield enc.encode({"v": 1, "kind": "run_start", "t": t0, "step": None, "rank": 0, "world_size": 1,
                      "pid": pid, "max_steps": steps,
                      "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.24.0"},
                      "attn_implementation": {"requested": "flex_attention", "resolved": "flex_attention"}})
    t = t0
    dts = []
    pending_save = False
    for s in range(1, steps + 1):
        dt = 45.79 if s == 1 else round(19.5 * rng.lognormvariate(0.0, 0.08), 6)
        flags = ["first"] if s == 1 else []
        if pending_save:
            flags.append("save")
            dt = round(dt + 8.0, 6)
            pending_save = False
        begin, t = t, t + dt
        if s > 1:
            dts.append(dt)
        yield enc.encode({"v": 1, "kind": "step", "t": t, "step": s, "rank": 0, "dt": dt, "step_begin": begin,
                          "step_end": t, "tokens": 26048, "padded_tokens": 26112, "flags": flags})
        if s % 10 == 0:
            yield enc.encode({"v": 1, "kind": "log", "t": t + 0.01, "step": s, "rank": 0,
                              "logs": {"loss": round(rng.uniform(1.5, 3.0), 4), "grad_norm": 0.63,
                                       "learning_rate": 2e-05, "epoch": s / steps}})
        if s % 500 == 0:
            yield enc.encode({"v": 1, "kind": "phase", "t": t + 0.02, "step": s, "rank": 0, "name": "save",
                              "state": "begin"})
            yield enc.encode({"v": 1, "kind": "phase", "t": t + 7.9, "step": s, "rank": 0, "name": "save",
                              "state": "end"})
            pending_save = True
        if s == 50:
            yield enc.encode({"v": 1, "kind": "dynamo", "t": t + 0.03, "step": s, "rank": 0,
                              "counters": {"stats": {"unique_graphs": 4}, "frames": {"total": 5, "ok": 4}},
                              "recompiles": 3, "recompile_limit_hits": 0})
    dts.sort()
    from stepwatch.telemetry import step_summary

    if end is not None:
        end["t"] = t
    yield enc.encode({"v": 1, "kind": "run_end", "t": t + 1, "step": steps, "rank": 0,
                      "step_seconds": step_summary(dts),
                      "dynamo": {"recompiles": 3, "recompile_limit_hits": 0}, "dropped_events": 0})


def build_run(run_dir: Path, steps: int, seed: int = 0) -> dict:
    """Write a finished run dir with ``steps`` step events; return counts."""
    from stepwatch.monitors.runfiles import write_json_atomic

    run_dir.mkdir(parents=True)
    rng = random.Random(seed)
    dead = subprocess.Popen(["true"])
    dead.wait()
    t0 = 1_780_000_000.0
    n_lines = 0
    end: dict = {}
    with open(run_dir / "events.jsonl", "w") as f:
        buf: list[str] = []
        for line in event_lines(steps, rng, dead.pid, t0, end):
            buf.append(line)
            if len(buf) >= 65536:
                f.write("\n".join(buf) + "\n")
                n_lines += len(buf)
                buf = []
        n_lines += len(buf)
        f.write("\n".join(buf) + "\n")
    t = end["t"]
    (run_dir / "train.log").write_text("".join(
        f"{{'loss': '{rng.uniform(1.5, 3.0):.4g}', 'grad_norm': '0.6336', 'learning_rate': '2e-05'}}\n"
        for _ in range(200)) + "done\n")
    write_json_atomic(run_dir / "run.json", {
        "v": 1, "name": run_dir.name, "attempt": 1, "argv": ["python", "train.py"], "cwd": str(run_dir),
        "env": {}, "config_path": None, "config_sha256": None, "config": None,
        "launched_at": None, "launched_at_unix": t0, "identity": None, "preflight": None,
        "allow_dirty_reason": None, "supervisor": {"pid": dead.pid, "create_time": 1.0, "sid": None},
        "process": {"pid": dead.pid, "create_time": 1.0, "pgid": dead.pid}, "start_error": None})
    write_json_atomic(run_dir / "exit.json", {"returncode": 0, "signal": None, "ended_at": None,
                                              "ended_at_unix": t + 1, "duration_s": t + 1 - t0,
                                              "stop_requested": False, "error": None})
    return {"event_lines": n_lines, "step_events": steps,
            "events_bytes": os.path.getsize(run_dir / "events.jsonl")}


def time_json_loads(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    for line in data.splitlines():
        if line:
            json.loads(line)
    return time.perf_counter() - t0


def time_refresh(run_dir: Path, use_saved_state: bool = True) -> tuple[float, dict]:
    from stepwatch.monitors.snapshot.observer import RunObserver

    t0 = time.perf_counter()
    snap = RunObserver(run_dir, use_saved_state=use_saved_state).refresh()
    return time.perf_counter() - t0, snap


def save_state(run_dir: Path) -> dict:
    """What the supervisor leaves: its last save of events.state.json; returns its costs."""
    import threading

    from stepwatch.monitors.fold.events import EventsFold
    from stepwatch.monitors.fold.savedstate import follow, save
    from stepwatch.monitors.readers.jsonl import EventReader
    from stepwatch.monitors.runfiles import read_json

    run = read_json(run_dir / "run.json") or {}
    key = (run.get("attempt"), run.get("launched_at_unix"))
    done = threading.Event()
    done.set()
    t0 = time.perf_counter()
    follow(run_dir, key, done, every_s=0)  # fold the whole file, save once
    t1 = time.perf_counter()
    fold, reader = EventsFold(), EventReader(run_dir / "events.jsonl", digest=True)
    fold.fold(reader)
    t2 = time.perf_counter()
    save(run_dir, fold, reader, key)  # one periodic save of a 100,000-step state, alone
    t3 = time.perf_counter()
    reader.close()
    return {"supervisor_fold_and_save_s": t1 - t0, "one_save_s": t3 - t2,
            "state_bytes": os.path.getsize(run_dir / "events.state.json")}


def _comparable(snap: dict) -> str:
    snap = json.loads(json.dumps(snap))
    snap["events"]["resume"] = None
    snap["log"]["last_byte_age_s"] = None
    if snap.get("disk"):
        snap["disk"]["free_bytes"] = None  # read at each refresh: it moves
    snap["health"]["host_load_1m"] = None  # the machine's load average, read at each refresh: it moves
    for al in snap["alerts"]:
        al["at"] = al["at"] if al["kind"] in ("fallback", "watchdog") else None
    return json.dumps(snap, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 rounds instead of 10")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--pairs", type=int, help="rounds of (A, B, C)")
    ap.add_argument("--budget", type=float, help="seconds of rounds after which no new one starts (min 2 rounds)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    rounds = a.pairs or (4 if a.quick else 10)
    res = new_result("attach_events", a.quick)
    F, N = res["figures"], res["notes"]
    F["attach_events_s"] = F["attach_events_ratio"] = F["attach_events_cold_s"] = None
    tmp = Path(tempfile.mkdtemp(prefix="stepwatch-bench-events-"))
    try:
        run_dir = tmp / "finished-run"
        t0 = time.perf_counter()
        info = build_run(run_dir, a.steps)
        info["build_s"] = time.perf_counter() - t0
        import stepwatch.monitors.fold.savedstate  # noqa: F401  (imports outside the timings)
        import stepwatch.monitors.snapshot.observer  # noqa: F401  (imports outside the timings)

        info.update(save_state(run_dir))
        ev = run_dir / "events.jsonl"
        snaps: dict[str, set[str]] = {"B": set(), "C": set()}
        resume: list = []

        def run_b() -> float:
            dt, snap = time_refresh(run_dir)
            snaps["B"].add(_comparable(snap))
            resume.append(snap["events"]["resume"])
            return dt

        def run_c() -> float:
            dt, snap = time_refresh(run_dir, use_saved_state=False)
            snaps["C"].add(_comparable(snap))
            return dt

        runs = {"A": lambda: time_json_loads(ev), "B": run_b, "C": run_c}
        got: list[dict[str, float]] = []
        t_rounds = time.monotonic()
        for i in range(rounds):
            if a.budget is not None and i >= 2 and time.monotonic() - t_rounds > a.budget:
                break
            order = "ABC"[i % 3:] + "ABC"[: i % 3]
            got.append({k: runs[k]() for k in (order if i % 2 == 0 else order[::-1])})
        a_s, b_s, c_s = ([g[k] for g in got] for k in "ABC")
        rat = spread(g["B"] / g["A"] for g in got)
        cold_rat = spread(g["C"] / g["A"] for g in got)
        F["attach_events_s"] = statistics.median(b_s)
        F["attach_events_ratio"] = rat["median"]
        F["attach_events_cold_s"] = statistics.median(c_s)
        res["spreads"].update({"attach_events_s": spread(b_s), "attach_events_ratio": rat,
                               "attach_events_cold_s": spread(c_s)})
        base = {"what": "json.loads of every line of events.jsonl (median)", "value": statistics.median(a_s), "unit": "s"}
        for k in ("attach_events_s", "attach_events_ratio", "attach_events_cold_s"):
            res["baselines"][k] = base
        cli, bare = [], []
        for _ in range(3):
            t1 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            t2 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "stepwatch.tui.cli", "status", str(run_dir), "--json"], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            bare.append(t2 - t1)
            cli.append(time.perf_counter() - t2)
        info["cli_status_json_s"], info["python_startup_s"] = spread(cli), spread(bare)
        last = json.loads(next(iter(snaps["B"])))
        sc = last.get("step_seconds") or {}
        info.update({"rounds": len(got), "ratios": sorted(g["B"] / g["A"] for g in got if g["A"] > 0),
                     "json_loads_s": spread(a_s), "cold_ratio": cold_rat,
                     "resume": resume[-1], "snapshot_state": last.get("state"), "snapshot_step_n": sc.get("n"),
                     "snapshot_events_lines": (last.get("events") or {}).get("lines")})
        if sc.get("n") != a.steps - 1:
            N["attach_events_s"] = f"the snapshot counted {sc.get('n')} steps, expected {a.steps - 1}"
        if any(r is None or r.get("from_offset") is None for r in resume):
            N["attach_events_s"] = f"the saved state was not used: {resume[-1]}"
        if len(snaps["B"]) != 1 or snaps["B"] != snaps["C"]:
            N["attach_events_s"] = N["attach_events_cold_s"] = "the attaches with and without the saved state differ"
        res["details"] = info
        print(f"finished run: {info['step_events']:,} step events, {info['event_lines']:,} lines, "
              f"{info['events_bytes'] / 1e6:.1f} MB (built in {info['build_s']:.1f} s); the supervisor's fold "
              f"and last save {info['supervisor_fold_and_save_s']:.2f} s, one save {info['one_save_s']:.3f} s, "
              f"events.state.json {info['state_bytes'] / 1e6:.1f} MB")
        print(f"attach (RunObserver.refresh(), from the saved state): median {F['attach_events_s']:.3f} s "
              f"(target <= {TARGET_S}); ratio to json.loads of every line ({statistics.median(a_s):.3f} s): "
              f"median {rat['median']:.2f} (p10 {rat['p10']:.2f}, p90 {rat['p90']:.2f}; target <= {TARGET_RATIO})")
        print(f"cold attach (every line folded, no saved state): median {F['attach_events_cold_s']:.3f} s "
              f"(target <= {TARGET_S}), ratio median {cold_rat['median']:.2f}; {len(got)} rounds; "
              f"snapshots {'identical' if snaps['B'] == snaps['C'] else 'DIFFER'}")
        print(f"stepwatch status --json, the whole process: median {statistics.median(cli):.3f} s "
              f"(python -c pass: {statistics.median(bare):.3f} s)")
    except Exception as e:
        for k in ("attach_events_s", "attach_events_ratio", "attach_events_cold_s"):
            if F[k] is None:
                N[k] = f"{type(e).__name__}: {e}"
        print(f"attach_events failed: {e!r}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
