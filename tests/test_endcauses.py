"""Why an attempt ended (monitors/parsers/endcauses.py), on real captured ends (tests/fixtures/real/): each cause
of the table with its evidence, and the order that decides between them."""

from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT
from stepwatch.monitors.parsers.endcauses import EndFacts, classify, slurm_requeued
from stepwatch.monitors.parsers.traceback import traceback_last_line

REAL = REPO_ROOT / "tests" / "fixtures" / "real"


def facts_of(name: str, **kw: object) -> EndFacts:
    lines = (REAL / name).read_text().replace("\r", "\n").splitlines()
    return EndFacts(log_tail=tuple(lines), traceback_last_line=traceback_last_line(lines), **kw)  # type: ignore[arg-type]


def test_torchruns_root_cause_names_the_killed_rank_not_the_launchers_exception():
    got = classify(facts_of("torchrun_sigkill_rank1.log", returncode=1, step=30))
    assert (got.cause, got.evidence) == ("killed_by_signal", "rank 1 (pid 28129) killed by SIGKILL, torchrun's root "
                                                             "cause, at step 30")


def test_a_rank_that_saw_its_killed_peers_connection_close_is_not_the_cause_the_killed_rank_is():
    """Rank 1 SIGKILLed at step 45; rank 0's all_reduce failed first with gloo's 'Connection closed by peer' before
    torchrun tore it down (a race: CI run 24 of 2026-12-05 caught it in tests/test_restart_budget_live.py). The root
    cause torchrun names is the end; a gloo timeout of a rank's own (death_gloo_timeout.log) stays a collective's."""
    got = classify(facts_of("torchrun_sigkill_rank1_peer_closed.log", returncode=1, step=45))
    assert (got.cause, got.evidence) == ("killed_by_signal", "rank 1 (pid 21838) killed by SIGKILL, torchrun's root "
                                                             "cause, at step 45")
    assert classify(facts_of("death_gloo_timeout.log", returncode=1, step=5)).cause == "collective_timeout"


def test_a_run_killed_mid_bar_with_no_traceback_of_its_own_is_killed_from_outside():
    got = classify(facts_of("tqdm_sigkill.log", signal="SIGKILL", step=2))
    assert (got.cause, got.evidence) == ("killed_by_signal", "killed by SIGKILL from outside at step 2")


@pytest.mark.parametrize("facts, cause", [
    (EndFacts(returncode=0), "completed"),
    (EndFacts(signal="SIGINT", stop_requested=True), "operator_stop"),
    (EndFacts(returncode=0, stop_requested=True), "operator_stop"),
    (EndFacts(signal="SIGTERM", scheduler_state="PREEMPTED"), "preempted"),
    (EndFacts(signal="SIGTERM", scheduler_state="TIMEOUT"), "time_limit"),
    (EndFacts(returncode=1, alert_kinds=frozenset({"nonfinite_loss"}), step=9), "nonfinite_loss"),
    (EndFacts(signal="SIGKILL", oom_kills=1, step=9), "host_oom"),
    (EndFacts(signal="SIGKILL", phase="saving", step=9), "save_crash"),
    (EndFacts(returncode=1, traceback_last_line="ValueError: x", step=None), "config_error"),
    (EndFacts(returncode=1, traceback_last_line="ValueError: x", step=10), "exception"),
    (EndFacts(ended=False), "unknown"),
])
def test_the_order_of_the_table(facts: EndFacts, cause: str):
    assert classify(facts).cause == cause


def test_an_error_before_the_first_step_of_a_resumed_attempt_is_no_configuration_error():
    """A CUDA error right after a resume read as a configuration error (issue 44), which the policy never restarts:
    the config ran in the attempts before. Before the first step of an attempt from scratch it still is one."""
    cuda = "RuntimeError: CUDA error: an illegal memory access was encountered"
    resumed = classify(EndFacts(returncode=1, traceback_last_line=cuda, step=None, resumed_step=200))
    assert (resumed.cause, resumed.evidence) == ("exception", f"after resuming from step 200, before its first step: {cuda}")
    assert classify(EndFacts(returncode=1, step=None, resumed_step=200)).cause == "exception"
    assert classify(EndFacts(returncode=1, traceback_last_line=cuda, step=None)).cause == "config_error"  # the control


EXITS = json.loads((REAL / "death_exits.json").read_text())


@pytest.mark.parametrize("name, step, cause, evidence", [
    ("death_valueerror_step10.log", 9, "exception", "at step 9: ValueError: demo: bad batch at step 10"),
    ("death_before_first_step.log", None, "config_error", "before the first step: IndexError: index out of range in self"),
    ("death_cpu_oom.log", 3, "host_oom", "DefaultCPUAllocator: can't allocate memory: you tried to allocate"),
    ("death_gloo_timeout.log", 5, "collective_timeout", "Timed out waiting 5000ms for recv operation to complete"),
])
def test_each_real_death_is_classified_with_its_evidence(name: str, step: int | None, cause: str, evidence: str):
    got = classify(facts_of(name, returncode=EXITS[name]["returncode"], signal=EXITS[name]["signal"], step=step))
    assert got.cause == cause and evidence in got.evidence, got


def test_a_real_nan_loss_run_is_flagged_and_its_death_is_the_nan_not_the_signal(tmp_path):
    import shutil

    from stepwatch.monitors.snapshot.observer import snapshot

    run_dir = tmp_path / "run"
    shutil.copytree(REAL.parent / "runs" / "ended-sigkill", run_dir)
    (run_dir / "events.jsonl").write_text("")  # the log alone speaks
    shutil.copyfile(REAL / "death_nan_loss.log", run_dir / "train.log")
    kinds = frozenset(a["kind"] for a in snapshot(run_dir)["alerts"])
    assert "nonfinite_loss" in kinds, kinds
    assert classify(EndFacts(signal="SIGKILL", alert_kinds=kinds, step=20)).cause == "nonfinite_loss"
    assert classify(EndFacts(returncode=EXITS["death_nan_loss.log"]["returncode"], alert_kinds=kinds)).cause == "completed"


def _slurm_lines() -> list[str]:
    return (REAL / "slurm_cancelled.log").read_text().splitlines()


@pytest.mark.parametrize("job, cause", [("3", "preempted"), ("2", "time_limit")])
def test_slurmstepds_line_in_the_jobs_output_names_the_schedulers_end_before_the_stop_it_looks_like(job, cause):
    """The supervisor takes Slurm's SIGTERM as a stop (stop_requested), and the child ends 143: the real line
    slurmstepd wrote into the job's output still says the scheduler ended it."""
    line = next(ln for ln in _slurm_lines() if f"*** JOB {job} ON" in ln)
    got = classify(EndFacts(returncode=143, stop_requested=True, step=52, scheduler_line=line))
    assert got.cause == cause and line.split("error: ")[1] in got.evidence, got
    assert slurm_requeued(got.evidence) is (cause == "preempted")  # a requeue: the job's batch script runs again


def test_a_plain_scancel_line_is_not_the_scheduler_and_a_stop_stays_the_operators():
    line = next(ln for ln in _slurm_lines() if "*** JOB 4 ON" in ln)  # scancel 4: no "DUE TO"
    got = classify(EndFacts(returncode=143, stop_requested=True, step=52, scheduler_line=line))
    assert got.cause == "operator_stop" and not slurm_requeued(got.evidence), got


def test_a_run_that_completed_before_the_requeue_completed_and_one_whose_supervisor_slurm_killed_was_preempted():
    line = next(ln for ln in _slurm_lines() if "*** JOB 3 ON" in ln)
    assert classify(EndFacts(returncode=0, step=200, scheduler_line=line)).cause == "completed"  # never rerun
    got = classify(EndFacts(ended=False, step=45, scheduler_line=line))  # no exit record: Slurm's kill took it
    assert got.cause == "preempted" and got.evidence.endswith("(no exit record)"), got
    assert classify(EndFacts(ended=False, step=45)).cause == "unknown"  # without the line: nobody knows


def test_a_cuda_allocators_out_of_memory_is_the_devices_memory_not_the_hosts():
    """No GPU is lent here, so no capture: the line is torch's own, its message laid out as
    c10/cuda/CUDACachingAllocator.cpp builds it (torch 2.x: "Tried to allocate …. GPU N has a total capacity of …")
    under the exception's real name on this torch (``torch.OutOfMemoryError``). To be replaced by a capture on a GPU."""
    tail = ("Traceback (most recent call last):",
            '  File "train.py", line 41, in <module>',
            "    loss = model(batch).loss",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 3.21 GiB is free. Including non-PyTorch memory, this process has 75.88 GiB memory in "
            "use. Of the allocated memory 74.12 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but "
            "unallocated.")
    got = classify(EndFacts(returncode=1, step=217, log_tail=tail, traceback_last_line=tail[-1], oom_kills=0))
    assert got.cause == "device_oom" and got.evidence.startswith("torch.OutOfMemoryError: CUDA out of memory."), got
    # the control: the CPU allocator's own words (a real capture) are the host's
    cpu = facts_of("death_cpu_oom.log", returncode=1, step=3)
    assert classify(cpu).cause == "host_oom"
