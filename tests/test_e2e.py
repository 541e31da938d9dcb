"""End to end on a real tiny transformers run: launch from a config -> watch -> crash ->
edit the config -> relaunch (re-reads it, says what changed, rotates) -> a clean completed attempt."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, git, make_repo, stepwatch, wait_until
from snapshot_types import assert_declared
from stepwatch.monitors.runfiles import read_json, utc_stamp

pytestmark = pytest.mark.slow  # a real tiny transformers run, twice

TINY = ["--steps", "12", "--hidden", "64", "--layers", "2", "--seq-len", "64", "--save-every", "0"]


def write_config(repo: Path, extra: list[str]) -> None:
    argv = [sys.executable, "demo_train.py", *TINY, *extra]
    (repo / "run.toml").write_text(f'name = "tiny"\ncommand = {json.dumps(argv)}\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"run config {' '.join(extra) or 'clean'}")


def test_crash_then_relaunch_without_the_flag(tmp_path: Path):
    repo = make_repo(tmp_path / "harness", {})
    shutil.copy(REPO_ROOT / "assets" / "demo_train.py", repo / "demo_train.py")
    write_config(repo, ["--crash-at", "5"])
    runs = repo / "runs"
    run_dir = runs / "tiny"

    r = stepwatch("launch", "--no-tui", "run.toml", cwd=repo)
    assert r.returncode == 0, r.stderr
    w = stepwatch("watch", str(run_dir), "--plain", timeout=300)
    assert w.returncode == 1
    assert "exited with code 1" in w.stdout and "RuntimeError: demo crash at step 5" in w.stdout
    ex1 = read_json(run_dir / "exit.json")
    assert ex1["returncode"] not in (0, None)
    steps = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    assert 4 <= len([e for e in steps if e["kind"] == "step"]) <= 5
    first_log = (run_dir / "train.log").read_bytes()
    assert b"Traceback" in first_log
    stamp = utc_stamp(read_json(run_dir / "run.json")["launched_at_unix"])

    write_config(repo, [])  # the fix: the flag is gone from the config file
    r = stepwatch("relaunch", "--no-tui", "tiny", "--runs-dir", str(runs), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "config changed" in r.stdout and "--crash-at" in r.stdout
    w = stepwatch("watch", str(run_dir), "--plain", timeout=300)
    assert w.returncode == 0, w.stdout

    assert (run_dir / f"train.{stamp}.log").read_bytes() == first_log  # the crashed attempt's evidence
    # the supervisor's saved fold of attempt 1 went with it, and attempt 2 has its own
    old_state = json.loads((run_dir / f"events.{stamp}.state.json").read_text())
    assert old_state["attempt"][0] == 1 and old_state["events"]["offset"] == (run_dir / f"events.{stamp}.jsonl").stat().st_size
    wait_until(lambda: (read_json(run_dir / "events.state.json") or {}).get("attempt", [None])[0] == 2,
               timeout_s=60, what="attempt 2's last events state")
    assert (run_dir / "train.log").read_bytes().count(b"Traceback") == 0
    s = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    assert s["attempt"] == 2 and s["state"] == "exited" and s["returncode"] == 0
    assert_declared(s)  # every key status --json printed for the demo run is declared in the snapshot's types
    assert s["step_seconds"]["n"] == 11  # 12 steps, the first excluded
    assert s["versions"]["torch"] and s["versions"]["transformers"]
    assert s["attn_implementation"] == {"requested": "sdpa", "resolved": "sdpa"}
    assert s["alerts"] == []
    assert s["events"]["resume"] == {"file": "events.state.json", "from_offset": (run_dir / "events.jsonl").stat().st_size,
                                     "from_line": s["events"]["lines"], "refused": None}
