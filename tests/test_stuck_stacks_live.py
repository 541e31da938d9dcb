"""A run confirmed stuck gets the stacks of every process of its tree (issue 32), live: three gloo ranks under
torchrun where rank 1 sleeps before its ``all_reduce``. The stall's page names rank 1 as the odd one out
and says that ranks 0 and 2 wait in the collective; ``status`` shows the same line, and the stack record
holds rank 1's own stack. System tier: a real supervisor, torchrun, py-spy."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import git, make_repo, stepwatch, wait_until

TORCHRUN = str(Path(sys.executable).parent / "torchrun")

#: ours (the capture's script, step 21): rank 1 sleeps 60 s at step 20 before its all_reduce
POSES_PY = Path(__file__).parents[1] / "tools" / "capture_fixtures" / "stack_poses.py"

#: the [alerts] command: writes each page it is given (as the phone would get it) into a file
PAGE_PY = r'''
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
'''


@pytest.mark.slow
def test_a_stall_pages_with_every_ranks_stack_naming_the_rank_outside_the_collective(tmp_path: Path):
    pages = tmp_path / "pages.jsonl"
    repo = make_repo(tmp_path / "repo", {"stack_poses.py": POSES_PY.read_text(), "page.py": PAGE_PY})
    (repo / "gloo3.toml").write_text(
        'name = "gloo3"\n' + f"command = {json.dumps([TORCHRUN, '--nproc_per_node', '3', 'stack_poses.py', 'gloo'])}\n"
        + "[alerts]\n" + f"command = {json.dumps([sys.executable, str(repo / 'page.py'), str(pages)])}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "config")
    r = stepwatch("launch", "--no-tui", "gloo3.toml", cwd=repo, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "gloo3"
    try:
        page = wait_until(lambda: next((p for p in map(json.loads, pages.read_text().splitlines())
                                        if p["kind"] == "stall"), None) if pages.exists() else None,
                          90, interval_s=0.3, what="the stall's page")
        print(f"the page: {page['message']}")
        headline, _, body = page["message"].partition("\n")
        assert re.fullmatch(r"\S+ · gloo3 · RUNNING · step 19/\?", headline), page  # host · run · STATE · step N/M
        assert body.startswith("alive but stuck: no optimizer step") and "after step 19" in body, page
        assert "stacks: the odd one out: rank 1 in `<module>` (stack_poses.py:" in page["message"], page
        assert "ranks 0 and 2 waiting in a collective: `all_reduce`" in page["message"], page
        recs = [json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()]
        stack = next(rec for rec in recs if rec["kind"] == "stack")
        alert = next(rec for rec in recs if rec["kind"] == "alert" and rec["alert_kind"] == "stall")
        assert stack["alert_id"] == alert["id"] and "<module> (stack_poses.py:27)" in stack["stack"], stack
        assert [g["ranks"] for g in stack["groups"] if g["ranks"]] == [[1], [0, 2]], stack["groups"]
        text = stepwatch("status", str(run_dir)).stdout
        assert "stacks (py-spy): the odd one out: rank 1 in `<module>`" in text, text
        snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
        shown = next(a for a in snap["alerts"] if a["kind"] == "stall")
        assert shown["stacks_summary"].startswith("the odd one out: rank 1"), shown
    finally:
        stepwatch("stop", str(run_dir), timeout=60)
