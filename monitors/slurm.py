"""What only Slurm knows about a run's job, read from the login node with Slurm's own commands.

:func:`query_job` asks ``squeue`` first (pending and running jobs, and ended ones the controller still
holds: ``-t all``), then ``scontrol show job`` (the same controller, every field), then ``sacct``
(accounting: the only source once the controller forgot the job; a common cluster setting disables
it, and sacct then fails: the state is then ``unknown`` with sacct's own words). COMPLETING and
CONFIGURING are not ended.

The result is the snapshot's ``scheduler`` object: ``{kind, job_id, state, reason, nodes,
exit_code, time_limit_s, time_left_s, start_unix, end_unix, source, error, polled_at_unix}``.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Any
from collections.abc import Callable

#: Job states after which nothing more happens (Slurm's squeue/sacct names).
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                          "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
#: Ends that leave the supervisor no chance to say what happened (an alert names them).
ABNORMAL_ENDS = frozenset({"CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
#: Not ended yet, whatever else they look like.
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
SLURM_TIMEOUT_S = 20.0
#: Seconds between two looks at the scheduler from the login node (``[slurm] poll_s``).
DEFAULT_POLL_S = 5.0
_SQUEUE_FMT = "%i|%T|%r|%N|%l|%L|%S|%e"

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _default_runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)


def duration_s(text: str | None) -> float | None:
    """Seconds of a Slurm duration (``minutes``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``);
    None for ``UNLIMITED``, ``INVALID``, ``N/A`` or anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", (text or "").strip())
    if not m:
        return None
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        h, mi, s = int(a), int(b or 0), int(c or 0)
        return float(((int(days) * 24 + h) * 60 + mi) * 60 + s)
    h, mi, s = (int(a), int(b), int(c)) if c is not None else (0, int(a), int(b)) if b is not None else (0, int(a), 0)
    return float((h * 60 + mi) * 60 + s)


def _unix(text: str | None) -> float | None:
    """Slurm's local ``YYYY-MM-DDTHH:MM:SS`` as unix seconds; None for ``N/A``, ``Unknown``, ``None``."""
    try:
        return time.mktime(time.strptime(str(text), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _clean(v: str | None) -> str | None:
    v = (v or "").strip()
    return None if v in ("", "(null)", "None", "N/A", "n/a", "Unknown") else v[:200]


def parse_squeue(job_id: str, out: str) -> dict[str, Any] | None:
    """The job's line of ``squeue -h -t all -j JOB -o '%i|%T|%r|%N|%l|%L|%S|%e'``; None when absent."""
    for line in out.splitlines():
        f = line.split("|")
        if len(f) == 8 and f[0].strip() == job_id:
            state = f[1].strip().split()[0] if f[1].strip() else "UNKNOWN"
            return {"state": state, "reason": _clean(f[2]), "nodes": _clean(f[3]),
                    "time_limit_s": duration_s(f[4]), "time_left_s": duration_s(f[5]),
                    "start_unix": _unix(f[6]), "end_unix": _unix(f[7]), "exit_code": None, "source": "squeue"}
    return None


def parse_scontrol(job_id: str, out: str) -> dict[str, Any] | None:
    """``scontrol -o show job JOB`` (one line of Key=Value; values hold no spaces but Command's)."""
    line = next((ln for ln in out.splitlines() if ln.startswith(f"JobId={job_id} ")), None)
    if line is None:
        return None
    kv = dict(re.findall(r"(?:^| )([A-Za-z][A-Za-z/:_]*)=(\S*)", line))
    state = (kv.get("JobState") or "UNKNOWN").split()[0]
    limit, run = duration_s(kv.get("TimeLimit")), duration_s(kv.get("RunTime"))
    return {"state": state, "reason": _clean(kv.get("Reason")), "nodes": _clean(kv.get("NodeList")),
            "time_limit_s": limit, "time_left_s": max(0.0, limit - run) if limit is not None and run is not None else None,
            "start_unix": _unix(kv.get("StartTime")), "end_unix": _unix(kv.get("EndTime")),
            "exit_code": _clean(kv.get("ExitCode")), "source": "scontrol"}


def parse_sacct(job_id: str, out: str) -> dict[str, Any] | None:
    """``sacct -n -P -X -j JOB -o JobID,State,ExitCode,NodeList,Timelimit,Start,End``."""
    for line in out.splitlines():
        f = line.split("|")
        if len(f) == 7 and f[0] == job_id:
            return {"state": f[1].split()[0] if f[1] else "UNKNOWN", "reason": None, "nodes": _clean(f[3]),
                    "time_limit_s": duration_s(f[4]), "time_left_s": None, "start_unix": _unix(f[5]),
                    "end_unix": _unix(f[6]), "exit_code": _clean(f[2]), "source": "sacct"}
    return None


def query_job(job_id: str, runner: Runner = _default_runner) -> dict[str, Any]:
    """The job's state from the first of squeue, scontrol, sacct that knows it (see the module)."""
    errors = []
    for argv, parse in ((["squeue", "-h", "-t", "all", "-j", job_id, "-o", _SQUEUE_FMT], parse_squeue),
                        (["scontrol", "-o", "show", "job", job_id], parse_scontrol),
                        (["sacct", "-n", "-P", "-X", "-j", job_id, "-o",
                          "JobID,State,ExitCode,NodeList,Timelimit,Start,End"], parse_sacct)):
        try:
            p = runner(argv)
        except FileNotFoundError:
            errors.append(f"{argv[0]}: not installed")
            continue
        except subprocess.TimeoutExpired:
            errors.append(f"{argv[0]}: no answer within {SLURM_TIMEOUT_S:g} s")
            continue
        got = parse(job_id, p.stdout or "") if p.returncode == 0 else None
        if got is not None:
            if parse is parse_squeue and got["state"] in ENDED_STATES:  # its exit code: scontrol has it
                more = parse_scontrol(job_id, (runner(["scontrol", "-o", "show", "job", job_id]).stdout or ""))
                if more:
                    got["exit_code"] = more["exit_code"]
            return {"kind": "slurm", "job_id": job_id, **got, "error": None, "polled_at_unix": time.time()}
        errors.append(f"{argv[0]}: {((p.stderr or p.stdout or '').strip() or f'exit {p.returncode}, no line for the job')[:200]}")
    return {"kind": "slurm", "job_id": job_id, "state": "UNKNOWN", "reason": None, "nodes": None, "exit_code": None,
            "time_limit_s": None, "time_left_s": None, "start_unix": None, "end_unix": None, "source": None,
            "error": "; ".join(errors), "polled_at_unix": time.time()}


def is_ended(state: str | None) -> bool:
    """An ended job (COMPLETING, CONFIGURING and every waiting state are not)."""
    return state in ENDED_STATES


def job_task_pids(job_id: str, runner: Runner = _default_runner) -> dict[int, tuple[int | None, int | None]]:
    """The pids of the job's step tasks on this node (``scontrol listpids JOB``), each with its
    global task id (the rank) and local id; the batch step's processes are left out (the supervisor
    records those as its own tree). {} when Slurm says nothing (not a Slurm node, job gone)."""
    try:
        p = runner(["scontrol", "listpids", job_id])
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return {}
    out: dict[int, tuple[int | None, int | None]] = {}
    for line in (p.stdout or "").splitlines()[1:] if p.returncode == 0 else []:
        f = line.split()
        if len(f) == 5 and f[0].isdigit() and f[1] == job_id and f[2].isdigit():
            out[int(f[0])] = (int(f[4]) if f[4].isdigit() else None, int(f[3]) if f[3].isdigit() else None)
    return out
