"""Why an attempt ended (monitors/parsers/endcauses.py), on real captured ends (tests/fixtures/real/): each cause
of the table with its evidence, and the order that decides between them."""

from __future__ import annotations


import pytest

from conftest import REPO_ROOT
from stepwatch.monitors.parsers.endcauses import EndFacts, classify
from stepwatch.monitors.parsers.traceback import traceback_last_line

REAL = REPO_ROOT / "tests" / "fixtures" / "real"


def facts_of(name: str, **kw: object) -> EndFacts:
    lines = (REAL / name).read_text().replace("\r", "\n").splitlines()
    return EndFacts(log_tail=tuple(lines), traceback_last_line=traceback_last_line(lines), **kw)  # type: ignore[arg-type]


def test_torchruns_root_cause_names_the_killed_rank_not_the_launchers_exception():
    got = classify(facts_of("torchrun_sigkill_rank1.log", returncode=1, step=30))
    assert (got.cause, got.evidence) == ("killed_by_signal", "rank 1 (pid 28129) killed by SIGKILL, torchrun's root "
                                                             "cause, at step 30")


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
