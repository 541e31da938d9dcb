"""A corpus of hostile run dirs (issue 15): what an attacker, or an unlucky run, can leave in a run
dir. Built at test time (FIFOs and symlinks cannot be committed) by :func:`make_hostile_runs`;
every view must open each of them without crashing, hanging or emitting a raw control byte.

- ``markup``: Rich markup where text belongs: a tqdm postfix ``lr=[1e-05]``, ``saving to
  [/data/ckpt-4]``, a traceback whose last line holds ``[/x]``, markup in the run's name, versions,
  attention backend and log dict keys;
- ``escapes``: terminal control in every string: OSC 52 (clipboard write), OSC 0 (window title),
  OSC 8 (link), ``ESC[2J``, ``ESC c``, a C1 CSI, a bidi override, in the log, the traceback, the
  events' strings and the GPU name;
- ``fifo-run-json``, ``fifo-exit-json``, ``fifo-acks``, ``fifo-events``: a FIFO where a file belongs;
- ``acks-symlink``: acks.jsonl a symlink to a file outside the run dir;
- ``crafted-pids``: run.json naming pid 1 with another create time, and a pid beyond pid_max;
- ``huge-values``: step numbers, durations and counters far past any real run, nesting 40 deep.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OSC52 = "\x1b]52;c;cHduZWQ=\x07"
OSC0 = "\x1b]0;PWNED-TITLE\x07"
OSC8 = "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J"
RESET = "\x1bc"
C1_CSI = "\x9b2J"
BIDI = "\u202e"
ESCAPES = OSC52 + OSC0 + OSC8 + CLEAR + RESET + C1_CSI + BIDI
#: what must never reach the operator's terminal from a run dir (as raw bytes)
PAYLOADS = [b"\x1b]52;", b"PWNED-TITLE\x07", b"\x1b]8;;http://evil", b"\x1bc", "\x9b2J".encode()]

DEAD_PID = 2_147_483_000  # above any pid_max: never alive
T0 = 1_780_000_000.0


def _run_json(name: str, **extra) -> dict:
    run = {"v": 1, "name": name, "attempt": 1, "launched_at_unix": T0, "argv": ["python", "train.py"],
           "cwd": "/nonexistent", "env": {}, "identity": {"harness_commit": "[bold]deadbeef[/]" + CLEAR,
                                                        "harness_dirty_at_launch": False, "branch": OSC0},
           "process": {"pid": DEAD_PID, "create_time": T0, "pgid": DEAD_PID},
           "supervisor": {"pid": DEAD_PID - 1, "create_time": T0, "sid": DEAD_PID - 1},
           "config": {"alerts": {"command": ["/bin/sh", "-c", "id > /tmp/stepwatch-pwned"]}}}
    run.update(extra)
    return run


def _write(run_dir: Path, name: str, data: str | dict | list) -> None:
    p = run_dir / name
    if isinstance(data, (dict, list)):
        data = "\n".join(json.dumps(x) for x in data) + "\n" if isinstance(data, list) else json.dumps(data)
    p.write_text(data, encoding="utf-8")


def _events(strings: str) -> list[dict]:
    evs = [{"v": 1, "kind": "run_start", "t": T0, "step": None, "rank": 0, "world_size": 1, "pid": DEAD_PID,
            "max_steps": 30, "versions": {"python": "3.11", "torch": strings, "transformers": "[/x]"},
            "attn_implementation": {"requested": strings, "resolved": "[bold]sdpa[/bold]"}}]
    t = T0
    for s in range(1, 31):
        dt = 1.0 if s < 25 else 20.0
        evs.append({"v": 1, "kind": "step", "t": t + dt, "step": s, "rank": 0, "dt": dt, "step_begin": t,
                    "step_end": t + dt, "tokens": None, "padded_tokens": None, "flags": ["first"] if s == 1 else []})
        t += dt
    evs.append({"v": 1, "kind": "log", "t": t, "step": 30, "rank": 0, "logs": {"loss" + strings: strings,
                                                                               "[red]lr[/red]": 1e-5}})
    return evs


def _log(strings: str) -> str:
    bar = "\r 40%|████      | 4/10 [00:04<00:06, 1.00it/s, loss=0.5, lr=[1e-05]]"
    return (f"saving to [/data/ckpt-4]\n{strings} a line with escapes\n{bar}\n"
            "Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
            f"RuntimeError: boom [/x] {strings}\n")


def make_hostile_runs(runs_dir: Path, outside: Path) -> dict[str, Path]:
    """Build the corpus under ``runs_dir``; ``outside`` is a directory for symlink targets."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}

    def new(name: str) -> Path:
        d = runs_dir / name
        d.mkdir()
        made[name] = d
        return d

    exit_rec = {"v": 1, "returncode": 1, "signal": None, "ended_at": "2026-05-28T00:00:00Z",
                "ended_at_unix": T0 + 100, "duration_s": 100.0, "stop_requested": False, "error": None}
    for name, strings in (("markup", "[bold red]x[/] [/]"), ("escapes", ESCAPES)):
        d = new(name)
        _write(d, "run.json", _run_json("[bold]run[/bold]" if name == "markup" else "run" + OSC0))
        _write(d, "train.log", _log(strings))
        _write(d, "events.jsonl", _events(strings))
        _write(d, "exit.json", dict(exit_rec, error=None))
        _write(d, "gpu.jsonl", [{"v": 1, "t": T0 + 50, "backend": "recorded:" + strings, "gpu_error": None,
                                 "devices": [{"index": 0, "name": "H100 " + strings, "uuid": "GPU-" + strings,
                                              "util_pct": 100, "power_w": 300.0, "power_limit_w": 700.0}]}])
        _write(d, "alerts.jsonl", [{"v": 1, "kind": "alert", "id": "a1-watchdog-x", "alert_kind": strings,
                                    "level": "error", "message": "recorded " + strings, "at": strings, "t": T0},
                                   {"v": 1, "kind": "delivery", "alert_id": "a1-watchdog-x", "channel": strings,
                                    "outcome": strings, "detail": strings, "attempts": 1, "t": T0}])
    for name, fifo in (("fifo-run-json", "run.json"), ("fifo-exit-json", "exit.json"), ("fifo-acks", "acks.jsonl"),
                       ("fifo-events", "events.jsonl")):
        d = new(name)
        if fifo != "run.json":
            _write(d, "run.json", _run_json(name))
        _write(d, "train.log", "hello\n")
        os.mkfifo(d / fifo)
    d = new("acks-symlink")
    _write(d, "run.json", _run_json("acks-symlink"))
    _write(d, "exit.json", exit_rec)
    _write(d, "train.log", "Traceback (most recent call last):\nRuntimeError: x\n")
    target = outside / "precious.txt"
    target.write_text("precious\n")
    os.symlink(target, d / "acks.jsonl")
    d = new("crafted-pids")
    _write(d, "run.json", _run_json("crafted-pids", process={"pid": 1, "create_time": 12345.0, "pgid": 1},
                                    supervisor={"pid": 4_000_000_000, "create_time": None, "sid": 1}))
    _write(d, "train.log", "x\n")
    _write(d, "exit.json", dict(exit_rec, write_errors=[ESCAPES, "[bold]x[/]", 7, None] * 50))
    _write(d, "procs.json", {"v": 1, "processes": [  # init and this machine's own processes, misnamed
        {"pid": 1, "create_time": 12345.0, "uid": 0, "name": ESCAPES, "rank": -1},
        {"pid": 1, "create_time": None}, {"pid": -1, "create_time": 1.0}, {"pid": 2**40, "create_time": 1.0},
        {"pid": "1", "create_time": "x"}, [1, 2], None, {"pid": True, "create_time": float("nan")}]})
    d = new("procs-not-a-list")
    _write(d, "run.json", _run_json("procs-not-a-list"))
    _write(d, "exit.json", exit_rec)
    _write(d, "procs.json", {"v": 1, "processes": {"pid": 1}})
    d = new("huge-values")
    nested: object = "deep"
    for _ in range(40):
        nested = {"n": nested}
    _write(d, "run.json", _run_json("huge-values", attempt=10**30, launched_at_unix=1e300))
    _write(d, "events.jsonl", [
        {"v": 1, "kind": "step", "t": 1e300, "step": 10**40, "rank": 0, "dt": 1e300, "step_begin": 0, "step_end": 1e300,
         "tokens": 10**40, "padded_tokens": -5, "flags": ["first"]},
        {"v": 1, "kind": "log", "t": T0, "step": 1, "rank": 0, "logs": nested},
        {"v": 1, "kind": "dynamo", "t": T0, "step": 1, "rank": 0, "counters": {"stats": {"unique_graphs": 10**50}},
         "recompiles": 1e308, "recompile_limit_hits": -1}])
    _write(d, "exit.json", dict(exit_rec, returncode=10**20, duration_s=1e308))
    _write(d, "train.log", ("\r" + "9" * 5000 + "/1 [00:00<00:00, 1e308it/s]") * 3 + "\n")
    return made
