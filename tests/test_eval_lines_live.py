"""A run's own words for an evaluation (issue 44): a plain loop prints ``running eval...`` and computes for 75 s
(the CPU busy, nothing printed), then trains on. With ``[log] eval_lines = ["running eval"]`` the stretch is an
evaluation, judged against that phase's budget: no page, and the ledger books it ``evaluating``. The control, the
same loop without the words, is a busy but silent stall paged at the busy budget (60 s). System tier: real
supervisors, the alert command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until

LOOP_PY = '''\
import time
for i in range(1, 31):
    time.sleep(0.1)
    print(f"step {i}/60 loss {1 / i:.4f}", flush=True)
print("running eval...", flush=True)
t = time.monotonic()
while time.monotonic() - t < 75:  # the evaluation: the CPU busy, nothing printed
    sum(range(1000))
for i in range(31, 61):
    time.sleep(0.1)
    print(f"step {i}/60 loss {1 / i:.4f}", flush=True)
'''
PING_PY = '''\
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "id": os.environ["STEPWATCH_ALERT_ID"]}) + "\\n")
'''


def _toml(name: str, pings: Path, eval_lines: bool) -> str:
    ping = [sys.executable, str(pings.parent / "repo" / "ping.py"), str(pings)]  # the command runs in the run dir
    return (f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "loop.py"]\n'
            f"[alerts]\ncommand = {json.dumps(ping)}\n"
            + ('[log]\neval_lines = ["running eval"]\n' if eval_lines else ""))


@pytest.mark.slow
def test_a_75_s_busy_evaluation_named_by_eval_lines_pages_nothing_and_is_booked_evaluating(tmp_path: Path):
    pings = {"named": tmp_path / "named.jsonl", "control": tmp_path / "control.jsonl"}
    repo = make_repo(tmp_path / "repo", {"loop.py": LOOP_PY, "ping.py": PING_PY,
                                         "named.toml": _toml("named", pings["named"], True),
                                         "control.toml": _toml("control", pings["control"], False)})
    for name in pings:
        r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo)
        assert r.returncode == 0, r.stdout + r.stderr
    runs = {name: repo / "runs" / name for name in pings}

    def ended(d: Path) -> dict | None:
        snap = json.loads(stepwatch("status", str(d), "--json").stdout)
        return snap if snap["state"] == "exited" else None

    snaps = {name: wait_until(lambda d=d: ended(d), 150, interval_s=1, what=f"{name} to end") for name, d in runs.items()}
    got = {name: [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else [] for name, p in pings.items()}
    print(got)
    assert snaps["named"]["returncode"] == 0 and snaps["named"]["step"]["global_step"] == 60
    assert got["named"] == [], got["named"]  # the evaluation, named: no page
    assert [p["kind"] for p in got["control"]] == ["stall", "resolved"], got["control"]  # the control: paged
    ledger = snaps["named"]["ledger"]
    assert ledger is not None and ledger["phases_s"] is not None
    assert ledger["phases_s"]["evaluating"] >= 70, ledger["phases_s"]
    assert ledger["phases_s"]["stalled"] == 0, ledger["phases_s"]
