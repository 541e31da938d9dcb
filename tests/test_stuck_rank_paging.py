"""When a stuck rank pages (issue 44): its stack is taken first, and the page rests on a look after the stack, never on
the look before it. py-spy can take seconds on a loaded host; a rank that ended or stepped again meanwhile is no stuck
rank (CI once paged a rank whose silent save had ended while py-spy ran). In-process: the run's looks are scripted
snapshots, the stack is handed in at once."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from stepwatch.monitors.watch import loop as loop_mod
from stepwatch.monitors.watch.loop import AlertRecorder

SAVING_STACK = """Thread 101 (idle): "MainThread"
    _save (torch/serialization.py:880)
    save (torch/serialization.py:650)
    save_shard (early.py:17)
    <module> (early.py:19)
"""
STEPPING_STACK = """Thread 101 (active): "MainThread"
    forward (train.py:40)
    <module> (train.py:60)
"""


def _looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stack: str) -> tuple[AlertRecorder, list[dict[str, Any]],
                                                                                 dict[str, Any]]:
    rec = AlertRecorder(tmp_path, {"name": "early", "attempt": 1, "config": {"alerts": {"command": ["true"]}}},
                        lambda _m: None)  # one channel: the outcomes are recorded per channel
    base = rec.observer.refresh()
    state: dict[str, Any] = {"stuck": True}

    def look() -> Any:
        snap = json.loads(json.dumps(base))
        snap["state"], snap["phase"]["name"] = "running", "training"
        snap["ranks"] = [{"rank": r, "pid": 100 + r, "alive": True} for r in (0, 1)]
        if state["stuck"]:
            snap["straggler"]["stuck"] = [{"rank": 1, "last_step": 55}]
        snap["alerts"] = [{"id": "a1-stuck_rank-1-55", "kind": "stuck_rank", "at": "2026-12-07T00:00:00+00:00",
                           "active": state["stuck"], "message": "rank 1 (pid 101) stopped stepping"}]
        return snap

    def stack_now(alert_id: str, pid: int, append: Any, log: Any, then: Any = None) -> None:
        if then is not None:
            then(stack)  # the stack thread, at once

    paged: list[dict[str, Any]] = []
    monkeypatch.setattr(rec.observer, "refresh", look)
    monkeypatch.setattr(loop_mod, "record_stack_later", stack_now)
    monkeypatch.setattr(rec.deliverer, "submit", paged.append)
    return rec, paged, state


def _outcomes(tmp_path: Path) -> list[tuple[str, str]]:
    lines = (tmp_path / "alerts.jsonl").read_text().splitlines()
    return [(r["outcome"], r["detail"]) for r in map(json.loads, lines) if r["kind"] == "delivery"]


def test_a_stuck_rank_that_ends_while_its_stack_is_taken_is_not_paged(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    rec, paged, state = _looks(tmp_path, monkeypatch, STEPPING_STACK)
    rec.detect()  # shown; its stack is taken (at once here)
    assert paged == []  # the look before the stack never pages
    state["stuck"] = False  # the rank ended (or stepped) while py-spy ran
    rec.detect()
    assert paged == []
    assert ("not_confirmed", "cleared while its stack was taken (the rank stepped again or ended)") in \
        _outcomes(tmp_path)


def test_a_stuck_rank_still_stuck_after_its_stack_pages_at_the_next_look(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    rec, paged, state = _looks(tmp_path, monkeypatch, STEPPING_STACK)
    rec.detect()
    assert paged == []
    rec.detect()  # the control: it still holds after its stack, not in a save: paged, once
    rec.detect()
    assert [p["id"] for p in paged] == ["a1-stuck_rank-1-55"]
    state["stuck"] = False
    rec.detect()
    assert [p["id"] for p in paged] == ["a1-stuck_rank-1-55", "a1-stuck_rank-1-55-resolved"]


def test_a_stuck_rank_whose_stack_shows_a_save_waits_for_the_save_budget(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    rec, paged, state = _looks(tmp_path, monkeypatch, SAVING_STACK)
    rec.detect()
    rec.detect()
    assert paged == []  # inside the save's budget
    assert any(o == "pending" and "shows it saving" in d for o, d in _outcomes(tmp_path))
    rec.pending["a1-stuck_rank-1-55"] = time.monotonic() - 1  # the budget has passed (no sleep)
    rec.detect()  # a save past its budget: paged
    assert [p["id"] for p in paged] == ["a1-stuck_rank-1-55"]
    state["stuck"] = False
    rec.detect()
    assert paged[-1]["id"] == "a1-stuck_rank-1-55-resolved"
