"""The pager's lifecycle (issue 33), live: a stall that clears pages once when it holds and once when it
resolves (how long it lasted); the run's exit 0 pages ``finished`` (steps, duration, final loss) because its
``[alerts]`` table asks; each page's first line is ``host · run · STATE · step N/M``. The control: a run that
does not ask gets no finished page. System tier: real supervisors and the alert command."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json

LOOP_PY = '''\
import time
for i in range(1, 81):
    time.sleep(0.1)
    if i == 40:
        time.sleep(20)  # idle: a stall, paged at the step budget; it clears when step 41 comes
    print(f"step {i}/80 loss {1 / i:.4f}", flush=True)
'''

PAGE_PY = r'''
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "level": os.environ["STEPWATCH_ALERT_LEVEL"],
                        "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
'''


@pytest.mark.slow
def test_a_stall_that_clears_pages_firing_then_resolved_and_exit_0_pages_finished(tmp_path: Path):
    files = {"loop.py": LOOP_PY, "page.py": PAGE_PY}
    pages = {}
    for name, finished in (("asks", True), ("quiet", False)):
        pages[name] = tmp_path / f"pages-{name}.jsonl"
        command = [sys.executable, str(tmp_path / "repo" / "page.py"), str(pages[name])]
        files[f"{name}.toml"] = (f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "loop.py"]\n[alerts]\n'
                                 f"command = {json.dumps(command)}\nfinished = {'true' if finished else 'false'}\n")
    repo = make_repo(tmp_path / "repo", files)
    for name in pages:
        r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo)
        assert r.returncode == 0, r.stderr
    for name in pages:
        ex = wait_until(lambda n=name: read_json(repo / "runs" / n / "exit.json"), 90, interval_s=0.5, what="the end")
        assert ex["returncode"] == 0, ex
    def _pages(p: Path, n: str) -> list[dict] | None:
        lines = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
        return lines if len(lines) >= (3 if n == "asks" else 2) else None

    got = {n: wait_until(lambda p=p, n=n: _pages(p, n), 30, what=f"the {n} run's pages") for n, p in pages.items()}
    for n, lines in got.items():
        print(f"{n}: " + " | ".join(f"{x['kind']}: {x['message']!r}" for x in lines))
    kinds = [x["kind"] for x in got["asks"]]
    assert kinds == ["stall", "resolved", "finished"], got["asks"]
    stall, resolved, finished = got["asks"]
    for page in got["asks"]:  # host · run · STATE · step N/M, then the message
        assert re.fullmatch(r"\S+ · asks · [A-Z]+ · step (\d+|\?)/(\d+|\?)", page["message"].split("\n")[0]), page
    assert stall["message"].split("\n")[0].endswith(" · RUNNING · step 39/80")
    lasted = re.search(r"resolved after (\d+) s: alive but stuck", resolved["message"])
    assert lasted and 12 <= int(lasted.group(1)) <= 22 and resolved["level"] == stall["level"] == "error", resolved
    assert finished["message"].split("\n")[0].endswith(" · EXITED · step 80/80"), finished
    assert re.search(r"finished: exit 0 after \d+ s, 80 steps; final loss 0\.0125", finished["message"]), finished
    assert [x["kind"] for x in got["quiet"]] == ["stall", "resolved"]  # the control: finished not asked for
