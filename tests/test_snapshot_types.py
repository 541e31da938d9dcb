"""The snapshot's declared types hold for what the observer really builds (unit tier: in-process,
no process started, no sleep).

Every key a snapshot carries is declared in :mod:`stepwatch.monitors.snapshot.types`, every
required key is there and each value has a JSON type its declaration allows: for the null
snapshot, and for snapshots the observer builds from run dirs as runs leave them (the captured
ended run of tests/fixtures/runs, a GPU recording, two ranks, a Slurm job Slurm ended, a flagged
fallback) and from the hostile corpus. The walker (tests/snapshot_types.py) is the one the system
tests also run on a real ``status --json`` (test_e2e, test_ranks, test_slurm).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import get_args, get_type_hints, is_typeddict

import pytest

from conftest import REPO_ROOT, hostile_runs
from snapshot_types import as_printed, assert_declared, problems
from stepwatch.monitors.runfiles import write_json_atomic
from stepwatch.monitors.snapshot.model import null_snapshot
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.snapshot.types import Snapshot

ENDED_SIGKILL = Path(__file__).parent / "fixtures" / "runs" / "ended-sigkill"
GPU_RECORDING = REPO_ROOT / "assets" / "gpu_recordings" / "synthetic_h100_sm_busy_tensor_idle.jsonl"
T0 = 1_780_000_000.0


def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _ended_sigkill(d: Path) -> None:
    shutil.copytree(ENDED_SIGKILL, d)


def _with_gpu(d: Path) -> None:
    shutil.copytree(ENDED_SIGKILL, d)
    shutil.copy(GPU_RECORDING, d / "gpu.jsonl")


def _two_ranks(d: Path) -> None:
    """An ended torchrun run: procs.json with both ranks (their pids long gone), each rank's events,
    rank 1 killed by SIGKILL after fewer steps (a rank death, a root cause)."""
    d.mkdir()
    agent, r0, r1 = _gone_pid(), _gone_pid(), _gone_pid()
    for rank, name, steps in ((0, "events.jsonl", 20), (1, "events.rank1.jsonl", 12)):
        lines = [{"v": 1, "kind": "run_start", "t": T0, "step": None, "rank": rank, "world_size": 2,
                  "pid": (r0, r1)[rank]}]
        for s in range(1, steps + 1):
            end = T0 + s * 0.3 + 0.2 * rank
            lines.append({"v": 1, "kind": "step", "t": end, "step": s, "rank": rank, "dt": 0.3, "step_begin": end - 0.3,
                          "step_end": end, "flags": ["first"] if s == 1 else []})
        (d / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    procs = [{"pid": agent, "create_time": 1.0, "ppid": 1, "rank": None, "ended_at_unix": T0 + 7, "exit": None},
             {"pid": r0, "create_time": 1.0, "ppid": agent, "rank": 0, "local_rank": 0, "ended_at_unix": T0 + 7,
              "exit": {"returncode": 0, "signal": None}, "restart_count": 0, "max_restarts": 3},
             {"pid": r1, "create_time": 1.0, "ppid": agent, "rank": 1, "local_rank": 1, "ended_at_unix": T0 + 4,
              "exit": {"returncode": None, "signal": "SIGKILL"}, "restart_count": 0, "max_restarts": 3}]
    write_json_atomic(d / "procs.json", {"v": 1, "processes": procs})
    (d / "train.log").write_text("[rank1]: killed\n")
    gone = {"pid": agent, "create_time": 1.0}
    write_json_atomic(d / "run.json", {"v": 1, "name": d.name, "attempt": 1, "argv": ["torchrun"], "cwd": str(d),
                                       "launched_at_unix": T0, "supervisor": gone, "process": {**gone, "pgid": agent}})
    write_json_atomic(d / "exit.json", {"returncode": 1, "ended_at_unix": T0 + 8, "duration_s": 8.0})


def _slurm_timeout(d: Path) -> None:
    """A Slurm run Slurm ended (TIMEOUT) before the supervisor wrote exit.json, with a stop request,
    the supervisor's recorded alert, its delivery and its stack."""
    d.mkdir()
    write_json_atomic(d / "run.json", {
        "v": 1, "name": d.name, "attempt": 2, "launched_at_unix": T0,
        "scheduler": {"kind": "slurm", "job_id": "4242", "poll_s": 5, "previous_job_ids": ["4241"]},
        "config": {"alerts": {"channels": ["ntfy"], "command": ["notify-send"]}}})
    write_json_atomic(d / "scheduler.json", {
        "job_id": "4242", "state": "TIMEOUT", "reason": "TimeLimit", "nodes": "n1", "exit_code": "0:15",
        "time_limit_s": 600, "time_left_s": 0, "start_unix": T0 + 10, "end_unix": T0 + 610, "polled_at_unix": T0 + 620,
        "source": "sacct"})
    write_json_atomic(d / "stop.json", {"requested_by_user": "alice", "requested_at_unix": T0 + 500})
    aid = "a2-job_end-4242-TIMEOUT"
    (d / "alerts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"v": 1, "kind": "alert", "id": aid, "alert_kind": "job_end", "at": "2026-05-28T00:10:10Z", "message": "m",
         "level": "critical"},
        {"v": 1, "kind": "delivery", "alert_id": aid, "channel": "ntfy", "outcome": "sent", "detail": "200",
         "attempts": 1, "t": T0 + 611},
        {"v": 1, "kind": "stack", "alert_id": aid, "stack": "Thread 1 (idle)"})))
    (d / "train.log").write_text("step 1/10 loss=2.5\nstep 2/10 loss=nan\n")


def _flagged_fallback(d: Path) -> None:
    """An ended run whose steps went ~20x slower at step 201 (a flagged fallback), with token counts
    and batch shapes (throughput, padding, the scaling fit)."""
    d.mkdir()
    t, lines = T0, []
    for i in range(1, 401):
        dt = 1.0 + (i % 7) / 100 if i <= 200 else 20.0 + (i % 7) / 10
        t += dt
        width = 256 + 128 * (i % 4)
        lines.append({"v": 1, "kind": "step", "t": t, "step": i, "rank": 0, "dt": dt, "step_begin": t - dt, "step_end": t,
                      "tokens": 3 * width - i % 5, "padded_tokens": 4 * width, "flags": ["first"] if i == 1 else [],
                      "batch_size": 4, "width": width})
    (d / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    pid = _gone_pid()
    write_json_atomic(d / "run.json", {"v": 1, "name": d.name, "attempt": 1, "argv": ["python", "train.py"],
                                       "launched_at_unix": T0, "process": {"pid": pid, "create_time": 1.0, "pgid": pid}})
    write_json_atomic(d / "exit.json", {"returncode": 0, "signal": None, "ended_at_unix": t + 1, "stop_requested": False,
                                        "error": None})


RUN_DIRS: dict[str, Callable[[Path], None]] = {
    "ended-sigkill": _ended_sigkill, "with-gpu": _with_gpu, "two-ranks": _two_ranks, "slurm-timeout": _slurm_timeout,
    "flagged-fallback": _flagged_fallback,
}


def test_the_null_snapshot_has_every_declared_key_in_the_declared_order():
    snap = null_snapshot()
    assert_declared(snap)
    assert list(snap) == list(Snapshot.__annotations__)  # status --json prints the keys in this order


@pytest.mark.parametrize("name", sorted(RUN_DIRS))
def test_what_the_observer_builds_from_a_run_dir_is_declared(tmp_path: Path, name: str):
    run_dir = tmp_path / name
    RUN_DIRS[name](run_dir)
    obs = RunObserver(run_dir)
    first = obs.refresh()
    assert first["state"] == "exited" and first["attempt"] is not None  # run.json was read: not an empty run dir
    assert_declared(first)
    assert_declared(obs.refresh())  # a second refresh, from what the observer kept


def test_the_parts_a_plain_run_leaves_out_are_there_in_these_run_dirs(tmp_path: Path):
    """The run dirs above do reach the optional parts (else the walk would prove little)."""
    snaps = {}
    for name, build in RUN_DIRS.items():
        build(tmp_path / name)
        snaps[name] = as_printed(RunObserver(tmp_path / name).refresh())
    assert snaps["with-gpu"]["gpu"] and snaps["with-gpu"]["gpu_history"]
    assert len(snaps["two-ranks"]["ranks"]) == 2 and any(a["kind"] == "rank_death" for a in snaps["two-ranks"]["alerts"])
    slurm = snaps["slurm-timeout"]
    assert slurm["scheduler"]["state"] == "TIMEOUT" and slurm["stop"] and slurm["metrics"]["loss"]["finite"] is False
    recorded = next(a for a in slurm["alerts"] if a["recorded"])
    assert recorded["level"] == "critical" and recorded["stack"] and recorded["delivered"]["ntfy"]["attempts"] == 1
    fb = snaps["flagged-fallback"]
    assert fb["fallback"]["state"] == "flagged" and fb["padding"]["share"] is not None
    assert fb["throughput"]["tokens_per_s"] is not None and fb["scaling"]["steps"] > 0


@pytest.mark.parametrize("third", [0, 1, 2])  # a third of the corpus a test: each well under the unit tier's 2 s
def test_every_hostile_run_dir_gives_a_declared_snapshot(tmp_path: Path, third: int):
    corpus = hostile_runs().make_hostile_runs(tmp_path / "runs", tmp_path / "outside")
    assert len(corpus) >= 10
    for name, run_dir in sorted(corpus.items())[third::3]:
        found = problems(as_printed(RunObserver(run_dir).refresh()))
        assert not found, (name, found[:10])


@pytest.mark.parametrize(("change", "reported"), [
    (lambda s: s.update(surprise=1), "snapshot.surprise: key not declared in Snapshot"),
    (lambda s: s["stall"].update(since=3.0), "snapshot.stall.since: key not declared in Stall"),
    (lambda s: s["alerts"].append({"id": "a1-x-1", "kind": "x", "at": "t", "message": "m", "recorded": False,
                                   "active": True, "delivered": None, "acknowledged": False, "colour": "red"}),
     "snapshot.alerts[0].colour: key not declared in Alert"),
    (lambda s: s["metrics"].update(loss={"step": 1, "value": 2.0, "finite": True, "unit": "nats"}),
     "snapshot.metrics['loss'].unit: key not declared in Metric"),
    (lambda s: s["step"].update(global_step="12"), "snapshot.step.global_step: '12' where"),
    (lambda s: s["fallback"].update(state="maybe"), "snapshot.fallback.state: 'maybe' is none of"),
    (lambda s: s["eta"].pop("basis"), "snapshot.eta.basis: required key of Eta missing"),
    (lambda s: s.update(ranks=[{"rank": 0}]), "snapshot.ranks[0].pid: required key of Rank missing"),
])
def test_the_walker_reports_what_is_not_declared(change: Callable[[dict], object], reported: str):
    snap: dict = dict(null_snapshot())
    assert problems(as_printed(snap)) == []  # control: the same snapshot unchanged is declared
    change(snap)
    found = problems(as_printed(snap))
    assert any(p.startswith(reported) for p in found), found
    with pytest.raises(AssertionError, match="departs from its declared types"):
        assert_declared(snap)


def test_a_free_key_of_a_declared_map_is_no_finding():
    """``metrics`` and ``gpu_history`` are maps by name: any name is fine, their values are typed."""
    snap = dict(null_snapshot())
    snap["metrics"] = {"eval/any name": {"step": None, "value": None, "finite": False, "nonfinite_count": 1,
                                          "first_nonfinite_step": None}}
    snap["gpu_history"] = {"3": {"util_pct": [None, 50.0], "power_share": [0.5]}}
    assert problems(as_printed(snap)) == []


def _declared_keys(tp: object = Snapshot, seen: set | None = None) -> set[str]:
    """Every key declared anywhere in the snapshot's types (the parts' parts too)."""
    seen = set() if seen is None else seen
    keys: set[str] = set()
    if is_typeddict(tp) and tp not in seen:
        seen.add(tp)
        for k, v in get_type_hints(tp).items():
            keys |= {k} | _declared_keys(v, seen)
    for arg in get_args(tp):
        keys |= _declared_keys(arg, seen)
    return keys


def _keys_read(source: str) -> set[str]:
    """The string keys a module reads: ``x.get("k")`` and ``x["k"]``."""
    out = set()
    for n in ast.walk(ast.parse(source)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args
                and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)):
            out.add(n.args[0].value)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            out.add(n.slice.value)
    return out


#: The views of the snapshot, and the keys each reads from something else (run.json, a stop's outcome).
VIEWS = {"tui/format.py": set(), "tui/screens/run.py": set(), "tui/screens/modals.py": set(),
         "tui/screens/home.py": {"_open_alerts"},  # the home screen's own key (tui/messages.py HomeRow)
         "tui/plain.py": {"preflight", "signals", "ended_by", "job_cancelled_while"},  # launch_lines, stop_lines
         "monitors/export/prometheus.py": set(), "monitors/export/families.py": set(),
         "monitors/snapshot/metrics.py": set(),
         **{f"tui/widgets/{p.name}": set() for p in (REPO_ROOT / "tui" / "widgets").glob("*.py")}}


def test_every_key_a_view_reads_is_declared():
    """pyright checks ``snap["k"]`` against the types but not ``snap.get("k")``: a key renamed in the
    types and left in a view is caught here (by name, wherever the view reads it)."""
    declared = _declared_keys()
    assert _keys_read('snap.get("eta_seconds"); snap["stall"]["sate"]') - declared == {"eta_seconds", "sate"}  # control
    for path, elsewhere in VIEWS.items():
        unknown = _keys_read((REPO_ROOT / path).read_text()) - declared - elsewhere
        assert not unknown, f"{path} reads keys the snapshot's types do not declare: {sorted(unknown)}"


def test_the_state_words_module_imports_only_the_standard_library_typing():
    """monitors/states.py is imported by detectors the training process may load: stdlib only."""
    tree = ast.parse((REPO_ROOT / "monitors" / "states.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "typing"}, imported


#: The state words no module but monitors/states.py may spell as a string in its code (docstrings aside).
#: Left out, because other things share the spelling: "alive" (also the snapshot's key), "unknown",
#: "running", "exited", "pending" (Slurm's, a checklist's and the GPU probe's words too).
ONE_HOME_WORDS = {"ok", "suspected", "flagged", "stalled", "not judged", "warming", "steady", "dead", "zombie",
                  "reused", "never_recorded", "observe", "enforce", "RESTART", "STOP"}


def _state_words_spelled(source: str) -> list[tuple[int, str]]:
    """(line, word) of each string constant in ``source``'s code that is a one-home state word."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return sorted((n.lineno, n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in ONE_HOME_WORDS
                  and id(n) not in docstrings)


def test_a_state_word_is_spelled_only_in_the_state_words_module():
    planted = 'def f(v):\n    """Says "ok" in a docstring: fine."""\n    return v == "suspected"\n'
    assert _state_words_spelled(planted) == [(3, "suspected")]  # control: a literal is found, a docstring is not
    # launcher/demo.py's "reused" is the demo harness repository's fate ("reused" / "updated"), no state;
    # monitors/export/families.py's "stalled" is the metric stepwatch_stalled's name after the prefix, no state
    allowed = {("launcher/demo.py", "reused"), ("monitors/export/families.py", "stalled")}
    found = []
    for folder in ("monitors", "launcher", "tui"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel == "monitors/states.py":
                continue
            found += [f"{rel}:{line}: {word!r}" for line, word in _state_words_spelled(path.read_text())
                      if (rel, word) not in allowed]
    assert not found, "import the word from stepwatch.monitors.states instead:\n" + "\n".join(found)
