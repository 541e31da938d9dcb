"""monitors/watch/warden.py in-process (unit tier): what the warden pages once the supervisor is
gone, and that it pages nothing when the supervisor saw the end. The real kill -9 of a supervisor,
with a push to a local endpoint, is in test_supervisor_watch.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from stepwatch.monitors.runfiles import write_json_atomic
from stepwatch.monitors.watch.warden import ward

GONE = {"pid": 999_999_999, "create_time": 1.0}  # no such process: ended long ago


def _run(run_dir: Path) -> dict:
    run = {"v": 1, "name": "w", "attempt": 1, "argv": ["python", "t.py"], "cwd": str(run_dir), "env": {},
           "config": {}, "launched_at_unix": time.time() - 60, "supervisor": GONE, "process": GONE}
    write_json_atomic(run_dir / "run.json", run)
    return run


def _alerts(run_dir: Path) -> list[str]:
    p = run_dir / "alerts.jsonl"
    lines = p.read_text().splitlines() if p.exists() else []
    return [r["alert_kind"] for r in map(json.loads, lines) if r["kind"] == "alert"]


def test_a_supervisor_gone_without_an_exit_record_is_paged_with_the_runs_end_once(tmp_path: Path):
    run = _run(tmp_path)
    logged: list[str] = []
    assert ward(tmp_path, run, logged.append, loop_s=0.01) == 0
    assert _alerts(tmp_path) == ["supervisor_lost", "watchdog"]
    assert any("ended without an exit record" in m for m in logged)


def test_a_supervisor_that_wrote_the_exit_record_leaves_the_warden_nothing_to_page(tmp_path: Path):
    run = _run(tmp_path)
    write_json_atomic(tmp_path / "exit.json", {"v": 1, "returncode": 0, "signal": None})
    assert ward(tmp_path, run, lambda m: None) == 0
    assert _alerts(tmp_path) == []


def test_a_record_naming_no_supervisor_is_not_warded(tmp_path: Path):
    run = {**_run(tmp_path), "supervisor": {"pid": None, "create_time": None}}
    assert ward(tmp_path, run, lambda m: None) == 2
    assert _alerts(tmp_path) == []
