"""A save is a save however its time is spent (issue 44): a loop whose saves print nothing and leave the CPU idle
(a slow file system: ``torch.save`` into a file whose every write sleeps) pages nothing — the step past its budget
gets its stacks taken, they show the run saving, and the step is judged against the save budget; the ledger books
the time `saving`. The same save frozen by SIGSTOP pages `frozen` (the freeze is the cause). System tier: a real
supervisor, torch, py-spy, the alert command."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json
from test_restart_observe_live import PAGE_PY  # the alert command that writes each page to a file

SAVES = 4  # silent saves of SAVE_S each, every 10 steps
SAVE_S = 5.0

TRAIN_PY = r'''
import os, sys, time
import torch

class SlowFile:  # a slow network file system: every write waits, the CPU idles
    def __init__(self, path, seconds):
        self.f, self.per_write = open(path, "wb"), seconds
    def write(self, b):
        time.sleep(self.per_write)
        return self.f.write(b)
    def flush(self):
        self.f.flush()
    def close(self):
        self.f.close()

saves, save_s = int(sys.argv[1]), float(sys.argv[2])
state = {"w": torch.zeros(4)}
for step in range(1, 10 * saves + 6):
    time.sleep(0.05)
    print(f"step {step}/{10 * saves + 5} loss {1.0 / step:.4f}", flush=True)
    if step % 10 == 0:
        out = SlowFile(f"ckpt_{step}.pt", 0)
        writes = [0]
        def write(b, out=out, w=writes):
            w[0] += 1
            time.sleep(save_s / 4 if w[0] <= 4 else 0)  # the first four writes take the save's time
            return out.f.write(b)
        out.write = write
        if os.environ.get("PAUSE_AT") == str(step):
            open("saving", "w").close()
        torch.save(state, out)
        out.close()
'''


def _launch(tmp_path: Path, name: str, env: dict[str, str] | None = None) -> tuple[Path, Path]:
    pages = tmp_path / f"pages-{name}.jsonl"
    config = (f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "train.py", "{SAVES}", "{SAVE_S}"]\n'
              f"[alerts]\ncommand = {json.dumps([sys.executable, str(tmp_path / 'repo' / 'page.py'), str(pages)])}\n")
    repo = tmp_path / "repo"
    if not repo.exists():
        make_repo(repo, {"train.py": TRAIN_PY, "page.py": PAGE_PY, ".gitignore": "ckpt_*\nsaving\n"})
    (repo / f"{name}.toml").write_text(config)
    os.system(f"cd {repo} && git add {name}.toml && git commit -qm {name}")
    r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo, env={"OMP_NUM_THREADS": "1", **(env or {})})
    assert r.returncode == 0, r.stderr
    return repo / "runs" / name, pages


def _pages(pages: Path) -> list[dict]:
    return [json.loads(x) for x in pages.read_text().splitlines()] if pages.exists() else []


@pytest.mark.slow
def test_silent_idle_saves_page_nothing_and_the_ledger_books_them_saving(tmp_path: Path):
    run_dir, pages = _launch(tmp_path, "saves")
    ended = wait_until(lambda: read_json(run_dir / "exit.json"), 30 + SAVES * (SAVE_S + 5), interval_s=0.5,
                       what="the run's end")
    assert ended["returncode"] == 0, ended
    time.sleep(1)  # (the alert command of a page already handed over would have written by now)
    assert _pages(pages) == [], _pages(pages)
    recs = [json.loads(x) for x in (run_dir / "alerts.jsonl").read_text().splitlines()]
    held = [r for r in recs if r.get("kind") == "delivery" and "the stacks show the run saving" in str(r.get("detail"))]
    assert held, recs  # the positive control: each save did run past the step budget and its stacks were read
    snap = json.loads(stepwatch("status", str(run_dir), "--json").stdout)
    booked = (snap.get("ledger") or {}).get("phases_s") or {}
    print(booked)
    assert (booked.get("saving") or 0) >= SAVE_S, snap.get("ledger")
    assert (booked.get("stalled") or 0) < SAVE_S, snap.get("ledger")


@pytest.mark.slow
def test_a_save_frozen_by_sigstop_pages_frozen(tmp_path: Path):
    run_dir, pages = _launch(tmp_path, "frozen", env={"PAUSE_AT": "20"})
    flag = tmp_path / "repo" / "saving"
    wait_until(flag.exists, 60, what="the second save to begin")
    pid = (read_json(run_dir / "run.json") or {})["process"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        page = wait_until(lambda: next((p for p in _pages(pages) if p["kind"] == "frozen"), None), 30, interval_s=0.2,
                          what="the frozen page")
        print(f"frozen paged {time.monotonic() - t0:.1f} s after SIGSTOP: {page['message']}")
        assert time.monotonic() - t0 < 15
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: read_json(run_dir / "exit.json"), 30 + SAVES * (SAVE_S + 5), interval_s=0.5, what="the end")
