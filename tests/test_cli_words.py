"""What a newcomer reads at the command line: every flag that works is
in --help, an empty runs dir says how to start a run."""

from __future__ import annotations

import re
from typing import Any

from pathlib import Path

import pytest

from conftest import stepwatch


@pytest.mark.system
def test_attach_with_no_runs_says_how_to_start_one(tmp_path: Path):
    for cmd in ("attach", "status"):
        r = stepwatch(cmd, cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.returncode)
        assert "start one with `stepwatch launch -- python train.py` (or try `stepwatch demo`)" in r.stderr, r.stderr
        assert "stepwatch status RUN" not in r.stderr


@pytest.mark.system
def test_demo_help_lists_every_flag_that_works():
    text = stepwatch("demo", "--help").stdout
    for flag in ("--steps", "--crash-at", "--hang-at", "--fallback-at", "--compile", "--gpu-recording", "--hidden",
                 "--layers", "--seq-len", "--save-every", "--low-bandwidth", "--no-tui", "--runs-dir"):
        assert flag in text, flag


@pytest.mark.system
def test_a_tui_that_launched_a_run_leaves_no_zombie_supervisor_behind(tmp_path: Path):
    """The TUI launches in its own process (launcher.launch.launch) and stays open after the run
    ends: its child, the supervisor, is reaped when it exits."""
    import sys

    import psutil

    from conftest import make_repo, wait_until
    from stepwatch.launcher.config import config_from_flags
    from stepwatch.launcher.launch import launch
    from stepwatch.monitors.runfiles import read_json

    repo = make_repo(tmp_path / "repo", {"t.py": "print('step 1 loss 1.0')\n"})
    cfg = config_from_flags([sys.executable, "t.py"], "z", str(repo), str(repo / "runs"))
    res = launch(cfg)
    sup_pid = read_json(res.run_dir / "run.json")["supervisor"]["pid"]
    assert psutil.Process(sup_pid).ppid() == psutil.Process().pid or not psutil.pid_exists(sup_pid)
    wait_until(lambda: read_json(res.run_dir / "exit.json"), 30, what="the run to end")

    def reaped() -> bool:
        try:
            return psutil.Process(sup_pid).status() != psutil.STATUS_ZOMBIE and psutil.Process(sup_pid).ppid() != psutil.Process().pid
        except psutil.NoSuchProcess:
            return True

    wait_until(reaped, 20, what="the supervisor to be reaped, not left a zombie")


def test_dynamo_counts_that_nothing_reported_read_unknown_not_a_dash():
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.tui.plain import status_lines

    snap = {**null_snapshot(), "run": "r"}
    text = "\n".join(status_lines(snap))
    assert "dynamo: no torch.compile output seen (recompiles unknown, not 0)" in text and "recompiles -" not in text
    snap["dynamo"] = {**snap["dynamo"], "recompiles": 0, "graph_breaks": None, "recompile_limit_hits": 0, "source": "log"}
    text = "\n".join(status_lines(snap))
    assert "dynamo: recompiles 0, graph breaks unknown, recompile-limit hits 0 (from log)" in text, text


def test_plain_status_names_each_channel_and_a_failures_reason_as_one_safe_line():
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.tui.plain import status_lines

    snap = null_snapshot()
    snap["run"] = "r"
    alerts: list[Any] = [{"id": "a1-stall-5", "kind": "stall", "at": "2026-12-03T18:00:00Z", "message": "alive but stuck",
                       "recorded": True, "active": True, "acknowledged": False, "delivered": {
                           "command": {"outcome": "failed", "detail": "exit code 127: sh: 1: ./alert_cmd.sh: not found\n\x1b[2J"},
                           "json://127.0.0.1": {"outcome": "delivered", "detail": "accepted by the endpoint"},
                           "json://127.0.0.1#2": {"outcome": None, "detail": "no delivery recorded"}}}]
    snap["alerts"] = alerts
    line = next(ln for ln in status_lines(snap) if "ALERT [stall]" in ln)
    assert ("[delivery command: failed (exit code 127: sh: 1: ./alert_cmd.sh: not found" in line
            and "json://127.0.0.1: delivered; json://127.0.0.1#2: not recorded]" in line), line
    assert "\x1b" not in line and "\n" not in line  # a reason read from alerts.jsonl never moves the cursor


TREE_PY = r'''
import subprocess, sys, time
busy = sys.argv[1] == "busy"
child = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                          "t = time.time()\n"
                          "while time.time() - t < 60:\n"
                          + ("    pass\n" if busy else "    time.sleep(0.5)\n")])
print("tree up", flush=True)
child.wait()
'''


def _health_run(tmp_path: Path, mode: str):
    import json
    import sys

    from conftest import make_repo, wait_until

    repo = make_repo(tmp_path / mode, {"tree.py": TREE_PY})
    r = stepwatch("launch", "--no-tui", "--name", mode, "--", sys.executable, "tree.py", mode, cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / mode
    snap = wait_until(lambda: (s := json.loads(stepwatch("status", str(run_dir), "--json").stdout))["health"]
                      ["processes"] >= 2 and s, 20, what="both processes recorded")
    return run_dir, snap


@pytest.mark.system
def test_the_runs_whole_tree_cpu_and_memory_and_the_hosts_load_in_one_line(tmp_path: Path):
    import json

    from conftest import wait_until

    idle_dir, _ = _health_run(tmp_path, "idle")
    busy_dir, _ = _health_run(tmp_path, "busy")
    try:
        busy = wait_until(lambda: ((s := json.loads(stepwatch("status", str(busy_dir), "--json").stdout))["health"]
                                   ["cpu_cores"] or 0) > 0.3 and s, 20, what="the busy tree's CPU")
        idle = json.loads(stepwatch("status", str(idle_dir), "--json").stdout)
        b, i = busy["health"], idle["health"]
        # a one-shot status looks twice, 0.25 s apart: the CPU the tree uses now (busy but silent reads it)
        assert b["processes"] == 2 and b["cpu_cores_basis"].startswith("last 0.") and b["rss_bytes"] > 5 * 2**20, b
        assert b["cpu_cores"] > 0.3 and i["cpu_cores"] < 0.2, (b, i)  # the busy child, against the idle control
        assert b["host_load_1m"] is not None and b["host_cores"] >= 1
        text = stepwatch("status", str(busy_dir)).stdout
        assert "run: 2 procs, CPU " in text and re.search(r" cores \(last 0\.\d s\), RSS ", text) and " · load " in text, text
        assert " · started " in text
    finally:
        for d in (busy_dir, idle_dir):
            stepwatch("stop", str(d), "--grace", "1", timeout=30)
    text = stepwatch("status", str(busy_dir)).stdout
    assert "run not running · started " in text, text


def test_the_checklist_reads_no_fifo_nor_symlink_left_as_an_earlier_log(tmp_path: Path):
    import os
    import sys

    from stepwatch.launcher.config import config_from_flags
    from stepwatch.launcher.preflight import check_log_format

    cfg = config_from_flags([sys.executable, "t.py"], "r", str(tmp_path), str(tmp_path / "runs"))
    cfg.run_dir.mkdir(parents=True)
    os.mkfifo(cfg.run_dir / "train.20261201T000000Z.log")  # no writer: a blocking open would hang here
    item = check_log_format(cfg)
    assert item.status == "pass" and item.detail["lines_tried"] == 0, item
    (tmp_path / "secret.txt").write_text("step 1 loss 0.5\n" * 30)
    os.unlink(cfg.run_dir / "train.20261201T000000Z.log")
    os.symlink(tmp_path / "secret.txt", cfg.run_dir / "train.20261201T000000Z.log")
    item = check_log_format(cfg)
    assert item.detail["lines_tried"] == 0 and item.detail["format"] is None, item  # never followed
    os.unlink(cfg.run_dir / "train.20261201T000000Z.log")
    (cfg.run_dir / "train.20261201T000000Z.log").write_text("step 1 loss 0.5\n" * 30)  # control: a real one is read
    item = check_log_format(cfg)
    assert item.detail["lines_tried"] == 30 and item.detail["format"] == "step_line", item


def test_log_lines_keep_only_the_last_drawing_of_a_bar_that_never_ends_its_line(tmp_path: Path):
    from stepwatch.monitors.readers.loglines import PARTIAL_MAX_BYTES, LogLines

    log = tmp_path / "train.log"
    log.write_bytes(b"first\n" + b"".join(b"\r %5d/99999 [00:00<00:00]" % i for i in range(200_000)))
    ll = LogLines(log)
    ll.refresh()
    assert ll.lines == ["first"] and len(ll._partial) <= PARTIAL_MAX_BYTES
    with open(log, "ab") as f:
        f.write(b"\n")
    ll.refresh()
    assert ll.lines[-1] == " 199999/99999 [00:00<00:00]"  # the bar as a terminal shows it


def test_status_names_every_channel_with_its_last_outcome_even_when_all_were_delivered():
    """Plain ``status`` named a push channel only when its delivery failed (``all 2 channels: delivered``), where each
    channel with its last outcome was asked (issue 44)."""
    from stepwatch.monitors.snapshot.types import Delivery
    from stepwatch.tui.plain import delivery_words

    ok: Delivery = {"outcome": "delivered", "detail": "", "attempts": 1, "t": 1.0}
    failed: Delivery = {"outcome": "failed", "detail": "HTTP 500", "attempts": 3, "t": 2.0}
    assert delivery_words({"ntfy://ntfy.sh": ok, "command": ok}) == "ntfy://ntfy.sh, command: delivered"
    assert delivery_words({"ntfy://ntfy.sh": ok, "json://127.0.0.1": failed, "command": ok}) == \
        "ntfy://ntfy.sh, command: delivered; json://127.0.0.1: failed (HTTP 500)"
