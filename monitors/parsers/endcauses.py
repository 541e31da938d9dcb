"""Why an attempt ended: one cause from its exit record, its log's tail and what the run model saw, with the
evidence that decided it. The table of signatures lives here and nowhere else; each has a real captured example
in ``tests/fixtures/real/`` (``death_*.log``, README there). Pure: no I/O.

The causes, checked in this order (the first that fits wins):

- ``completed``: exit code 0 (and no stop asked for), even with Slurm's requeue after it;
- ``operator_stop``: ``stepwatch stop`` (stop.json) ended it;
- ``preempted`` / ``time_limit``: Slurm ended the job: slurmstepd's ``*** JOB N ON host CANCELLED AT t DUE TO
  JOB REQUEUE ***`` (or ``PREEMPTION``, ``TIME LIMIT``) in the job's output, the supervisor's log (checked before
  ``operator_stop``, as the supervisor takes Slurm's SIGTERM as a stop, and read when Slurm killed the supervisor
  before it recorded the end), or the scheduler's PREEMPTED or TIMEOUT;
- ``nonfinite_loss``: the loss went NaN or inf before the end (its alert);
- ``device_oom`` / ``host_oom`` / ``collective_timeout``: the traceback's text (a CUDA allocator's out of memory;
  the CPU allocator's or Python's MemoryError, or the kernel's OOM killer's SIGKILL where the cgroup counted one;
  a gloo or NCCL collective that timed out);
- ``save_crash``: it died while a checkpoint was being written (the run model's phase ``saving``);
- ``killed_by_signal``: a signal from outside (SIGKILL, SIGTERM ...), no traceback of its own, or the rank torchrun's
  failure table names as the root cause;
- ``config_error``: an exception before the first optimizer step (a bad argument, a missing file, a shape error) of
  an attempt that started from scratch (one that resumed ran its config before: an ``exception``, a device's error);
- ``exception``: an exception after training began;
- ``unknown``: nothing above fits (the supervisor gone, no exit record).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from stepwatch.monitors.parsers.torchrun import FailureTable, signal_name

CAUSES = ("completed", "operator_stop", "preempted", "time_limit", "nonfinite_loss", "device_oom", "host_oom",
          "collective_timeout", "save_crash", "killed_by_signal", "config_error", "exception", "unknown")
#: Causes a restart can never help: the run is done, the operator ended it, or the same code fails the same way.
NEVER_RESTART = frozenset({"completed", "operator_stop", "config_error"})

#: (cause, pattern over the log's last lines): the text a real failure prints (tests/fixtures/real/death_*.log).
SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("device_oom", re.compile(r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|HIP out of memory|"
                              r"XPU out of memory|MPS backend out of memory")),
    ("host_oom", re.compile(r"DefaultCPUAllocator: can't allocate memory|^MemoryError\b|\bMemoryError: |"
                            r"Unable to allocate [\d.]+ [KMGT]?i?B")),
    ("collective_timeout", re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout|"
                                      r"DistBackendError|[Gg]loo.*[Tt]imed out|[Tt]imed out .*(gloo|[Cc]ollective)|"
                                      r"NCCL communicator was aborted|Connection closed by peer")),
)
#: A collective's error that says a peer went away (another rank's end, not a hang of its own): when torchrun's root
#: cause is a rank ended by a signal, that rank's end is the cause (tests/fixtures/real/torchrun_sigkill_rank1_peer_closed.log).
PEER_GONE = re.compile(r"Connection closed by peer|NCCL communicator was aborted")
#: Slurm's words for an end the scheduler caused.
SCHEDULER_CAUSES = {"PREEMPTED": "preempted", "TIMEOUT": "time_limit", "DEADLINE": "time_limit"}
#: slurmstepd's line in the job's output when the scheduler ends it (tests/fixtures/real/slurm_requeue_supervisor.log).
SLURM_CANCELLED = re.compile(r"\*\*\* JOB (?P<job>\d+) ON (?P<host>\S+) CANCELLED AT (?P<at>\S+) "
                             r"DUE TO (?P<why>JOB REQUEUE|PREEMPTION|TIME LIMIT) \*\*\*")
_CANCEL_CAUSES = {"JOB REQUEUE": "preempted", "PREEMPTION": "preempted", "TIME LIMIT": "time_limit"}


def slurm_requeued(evidence: str | None) -> bool:
    """The evidence is slurmstepd's line for a requeue: Slurm runs the job's batch script again (launcher/requeue.py)."""
    m = SLURM_CANCELLED.search(evidence or "")
    return m is not None and m["why"] == "JOB REQUEUE"
#: How many of the log's last lines the signatures are matched against.
TAIL_LINES = 60


@dataclass(frozen=True, slots=True)
class EndFacts:
    """What is known of one attempt's end (from exit.json, stop.json, Slurm, the snapshot)."""

    returncode: int | None = None
    signal: str | None = None
    stop_requested: bool = False
    scheduler_state: str | None = None
    traceback_last_line: str | None = None
    log_tail: Sequence[str] = field(default_factory=tuple)
    step: int | None = None  # the last optimizer step reached (None: none)
    phase: str | None = None  # the run model's phase when it ended (``saving`` ...)
    alert_kinds: frozenset[str] = frozenset()
    oom_kills: int = 0  # the kernel's OOM kills counted during the attempt (monitors/oomkills.py)
    oom_where: str = "the run's cgroup"  # where they were counted
    scheduler_line: str | None = None  # slurmstepd's cancellation line for this attempt's job (SLURM_CANCELLED)
    ended: bool = True  # False: no exit record (the supervisor gone)
    resumed_step: int | None = None  # the checkpoint's step this attempt resumed from (a restart's), None: from scratch


@dataclass(frozen=True, slots=True)
class EndCause:
    """``cause`` one of CAUSES; ``evidence`` one line saying what decided it."""

    cause: str
    evidence: str


def _matched(lines: Sequence[str]) -> tuple[str, str] | None:
    for line in reversed(lines[-TAIL_LINES:]):
        for cause, pattern in SIGNATURES:
            if pattern.search(line):
                return cause, line.strip()[:300]
    return None


def classify(f: EndFacts) -> EndCause:
    """The cause of one attempt's end and its evidence (see the module's docstring for the order)."""
    how = f"killed by {f.signal}" if f.signal else f"exit code {f.returncode}" if f.ended else "no exit record"
    if f.ended and f.returncode == 0 and not f.signal and not f.stop_requested:
        return EndCause("completed", "exit code 0")
    if f.scheduler_line and (m := SLURM_CANCELLED.search(f.scheduler_line)):  # Slurm ended the job (its SIGTERM
        return EndCause(_CANCEL_CAUSES[m["why"]], f"Slurm: {m[0]} ({how})")  # reads as a stop, or no record left)
    if not f.ended:
        return EndCause("unknown", "no exit record: the supervisor is gone")
    if f.stop_requested:
        return EndCause("operator_stop", f"stepwatch stop ({how})")
    if (sch := SCHEDULER_CAUSES.get(str(f.scheduler_state or ""))) is not None:
        return EndCause(sch, f"Slurm: {f.scheduler_state} ({how})")
    if "nonfinite_loss" in f.alert_kinds:
        return EndCause("nonfinite_loss", f"the loss went NaN or inf before the end ({how})")
    lines = list(f.log_tail) + ([f.traceback_last_line] if f.traceback_last_line else [])
    table = FailureTable()  # torchrun's failure table: its root cause is the rank's own end, not the launcher's
    for line in lines[-TAIL_LINES:]:
        table.feed(line)
    root = next((e for e in reversed(table.entries) if e.root_cause), None)
    hit = _matched(lines)
    if hit is not None and not (hit[0] == "collective_timeout" and PEER_GONE.search(hit[1]) and root is not None
                                and signal_name(root.exitcode)):
        return EndCause(hit[0], hit[1])  # (a rank whose peer was killed sees the peer gone: the kill is the cause)
    oom = f"the kernel's OOM killer ran {f.oom_kills} time(s) in {f.oom_where}"
    if root is not None and signal_name(root.exitcode):
        rank = f"rank {root.rank} (pid {root.pid}) {root.how()}"
        if signal_name(root.exitcode) == "SIGKILL" and f.oom_kills > 0:
            return EndCause("host_oom", f"{rank}, torchrun's root cause; {oom}")
        return EndCause("killed_by_signal", f"{rank}, torchrun's root cause"
                        + (f", at step {f.step}" if f.step is not None else ""))
    if f.signal == "SIGKILL" and f.oom_kills > 0:
        return EndCause("host_oom", f"killed by SIGKILL; {oom}")
    if f.phase == "saving":
        return EndCause("save_crash", f"{how} while a checkpoint was being written")
    if f.signal:
        return EndCause("killed_by_signal", f"killed by {f.signal} from outside" + (
            f" at step {f.step}" if f.step is not None else ""))
    # before the first step of an attempt that resumed, the config has run before: a device's error, not the config's
    resumed = f"after resuming from step {f.resumed_step}, before its first step" if f.resumed_step is not None else None
    if f.traceback_last_line:
        if f.step is None:
            return EndCause("exception" if resumed else "config_error",
                            f"{resumed or 'before the first step'}: {f.traceback_last_line.strip()[:300]}")
        return EndCause("exception", f"at step {f.step}: {f.traceback_last_line.strip()[:300]}")
    if f.returncode is not None:
        if f.step is None:
            return EndCause("exception" if resumed else "config_error",
                            f"exit code {f.returncode} {resumed or 'before the first step'}")
        return EndCause("exception", f"exit code {f.returncode} at step {f.step}")
    return EndCause("unknown", how)
