"""Units of the supervisor's watching that need no run: its attempt files and a bounded command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepwatch.monitors.watch.delivery import STDERR_TAIL_BYTES, _wait_bounded
from stepwatch.monitors.watch.loop import AttemptFile


def test_an_attempt_file_keeps_writing_where_it_was_opened(tmp_path: Path):
    """Renamed by a relaunch, or replaced by a symlink: the attempt's records stay in its file."""
    path = tmp_path / "alerts.jsonl"
    f = AttemptFile(path, print)
    f.append_json({"n": 1})
    os.rename(path, tmp_path / "alerts.20260101T000000Z.jsonl")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, path)
    f.append_json({"n": 2})
    f.close()
    rotated = [json.loads(x) for x in (tmp_path / "alerts.20260101T000000Z.jsonl").read_text().splitlines()]
    assert rotated == [{"n": 1}, {"n": 2}] and victim.read_text() == "precious\n"


def test_an_attempt_file_never_opens_through_a_symlink_or_a_fifo(tmp_path: Path):
    os.symlink(tmp_path / "elsewhere", tmp_path / "a.jsonl")
    os.mkfifo(tmp_path / "b.jsonl")
    said = []
    for name in ("a.jsonl", "b.jsonl"):
        f = AttemptFile(tmp_path / name, said.append)
        assert f.fd is None
    assert len(said) == 2 and not (tmp_path / "elsewhere").exists()


@pytest.mark.system
def test_a_chatty_command_costs_a_bounded_tail_of_its_stderr():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('x' * 20_000_000 + 'last words'); sys.exit(4)"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    rc, tail = _wait_bounded(p, 30)
    assert rc == 4 and len(tail) <= STDERR_TAIL_BYTES and tail.endswith(b"last words")
