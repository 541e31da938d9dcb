"""The test suite's own hazards: the autouse reaper never signals the test run itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

INNER = '''
import json, os
import psutil

def test_a_run_json_naming_pytest_itself(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"v": 1, "process": {
        "pid": os.getpid(), "create_time": psutil.Process().create_time(), "pgid": os.getpgid(0)}}))
'''


@pytest.mark.system
def test_the_reaper_never_kills_a_pytest_that_leads_its_own_process_group(tmp_path: Path):
    assert shutil.which("setsid"), "util-linux's setsid is part of Debian's base system"
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "tests"))
    # setsid: the inner pytest leads its own session and group, as some CI runners start it
    r = subprocess.run(["setsid", "-w", sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), str(inner)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "1 passed" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
