"""Where a stuck run's processes stand (monitors/parsers/pystacks.py), read from py-spy dumps captured from
real processes (tests/fixtures/real/pyspy_*.txt, capture step 21): grouped by the frames of each main
thread, the odd one out named first, the phase the stacks show. Unit tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwatch.monitors.parsers.pystacks import ProcessStack, group_stacks, main_frames

REAL = Path(__file__).parent / "fixtures" / "real"


def _gloo(rank: int) -> ProcessStack:
    return {"pid": 700 + rank, "rank": rank, "name": "python", "stack": (REAL / f"pyspy_gloo3_rank{rank}.txt").read_text()}


def _one(name: str, rank: int | None = None, pid: int = 900) -> ProcessStack:
    return {"pid": pid, "rank": rank, "name": "python", "stack": (REAL / name).read_text()}


def test_the_rank_outside_the_collective_its_peers_wait_in_is_named_first():
    launcher = _one("pyspy_gloo3_launcher.txt", pid=699)
    got = group_stacks([launcher, _gloo(0), _gloo(1), _gloo(2)])
    assert got["summary"].startswith("the odd one out: rank 1 in `<module>` (stack_poses.py:27); "
                                     "ranks 0 and 2 waiting in a collective: `all_reduce` (distributed_c10d.py:3252) "
                                     "from `<module>` (stack_poses.py:28); the launcher (pid 699) in "), got["summary"]
    assert got["attached_pid"] == 701 and got["phase"] is None
    assert [(g["ranks"], g["odd"]) for g in got["groups"]] == [([1], True), ([0, 2], False), ([], False)]


def test_ranks_that_all_stand_in_one_place_have_no_odd_one_out():
    same: list[ProcessStack] = [{"pid": 800 + r, "rank": r, "name": "python", "stack": _gloo(0)["stack"]}
                                for r in range(3)]  # the control: every rank where rank 0 is, in all_reduce
    got = group_stacks(same)
    assert not any(g["odd"] for g in got["groups"]) and not got["summary"].startswith("the odd one out")
    assert got["summary"].startswith("ranks 0, 1 and 2 waiting in a collective: `all_reduce`"), got["summary"]


def test_two_ranks_apart_name_the_one_outside_the_collective_and_no_majority_names_none():
    assert group_stacks([_gloo(0), _gloo(1)])["summary"].startswith("the odd one out: rank 1 in `<module>`")
    apart = group_stacks([{**_gloo(1), "rank": 0}, _one("pyspy_save.txt", rank=1)])  # neither in a collective
    assert not any(g["odd"] for g in apart["groups"]), apart


@pytest.mark.parametrize("name, words, phase", [
    ("pyspy_save.txt", "saving: `save` (serialization.py:1002) from `<module>` (stack_poses.py:37) "
                       "(the stacks show the run saving)", "saving"),
    ("pyspy_loader_main.txt", "waiting for a batch: `_BaseDataLoaderIter.__next__` (dataloader.py:725)", None),
    ("pyspy_loader_worker.txt", "making a batch: `Slow.__getitem__` (stack_poses.py:45)", None),
])
def test_a_single_process_says_what_it_is_doing_and_the_phase_it_shows(name, words, phase):
    got = group_stacks([_one(name)])
    assert words in got["summary"] and got["phase"] == phase, got


def test_a_dump_is_read_for_its_main_thread_innermost_frame_first():
    frames = main_frames((REAL / "pyspy_gloo3_launcher.txt").read_text())  # two threads: MainThread first
    assert frames[0].function == "SimpleElasticAgent._invoke_run" and frames[-1].function == "<module>"
    assert "_PeriodicTimer._run" not in [f.function for f in frames]  # the rendezvous keep-alive thread's


def test_a_process_without_a_stack_and_hostile_text_are_said_as_text():
    got = group_stacks([{"pid": 5, "rank": 0, "name": "x", "stack": "no stack: py-spy is not installed (pip install py-spy)"},
                        {"pid": 6, "rank": 1, "name": "x", "stack": "Thread 1 (idle): \"MainThread\"\n    [red]f\x1b[2J (a.py:1)\n"}])
    assert "no stack of 1 process(es): no stack: py-spy is not installed" in got["summary"]
    assert "rank 1 in `[red]f\x1b[2J` (a.py:1)" in got["summary"]  # returned as text; the views escape it
    assert len(group_stacks([{"pid": 1, "rank": 0, "name": "x", "stack": "Thread 1 (idle): \"MainThread\"\n" + "    f (a.py:1)\n" * 9
                              + "    " + "g" * 5000 + " (b.py:2)\n"}])["summary"]) <= 600
