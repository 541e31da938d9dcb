"""Slurm as a launch target: the ``[slurm]`` table, the batch script, ``sbatch``, ``scancel``.

With a ``[slurm]`` table in the run config, ``stepwatch launch`` submits instead of starting locally,
after the same clean-tree gate, checklist and identity sampled at submit. The batch script runs
stepwatch's own supervisor inside the allocation (on the job's first node, the batch host), which
runs the command (typically through ``srun``) exactly as it does locally; the run dir lives on a file
system the login node and the batch host share.

The job is submitted held (``sbatch --hold``), its id written into run.json, then released
(``scontrol release``): the supervisor, which rewrites run.json when it starts, never races the
launcher's write of the job id.

What only the scheduler knows (PENDING and why, the nodes, ends that leave the supervisor no chance
to write) is read by :mod:`stepwatch.monitors.slurm` from the login node.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from stepwatch.monitors.runfiles import JOB_SCRIPT, SUPERVISOR_LOG, write_bytes_atomic
from stepwatch.monitors.slurm import DEFAULT_POLL_S as DEFAULT_POLL_S  # the table's default, re-exported for launch

#: ``[slurm]`` keys: sbatch's options by their own names (``ntasks_per_node`` is
#: ``--ntasks-per-node``), ``extra`` (more sbatch options, a list of strings, passed as they are)
#: and ``poll_s`` (how often the login node asks the scheduler, seconds).
SLURM_KEYS = ("partition", "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "time", "account", "qos",
              "extra", "poll_s")
_INT_KEYS = ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task")
_STR_KEYS = ("partition", "account", "qos", "time")
#: What a Slurm command may take (seconds) before it counts as not answering.
SLURM_TIMEOUT_S = 30.0
_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(UNLIMITED|INFINITE)$", re.IGNORECASE)


def validate_slurm_table(table: Any, where: str) -> dict[str, Any]:
    """The ``[slurm]`` table checked by name and type (raises ValueError naming the key)."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [slurm] must be a table, e.g. [slurm] partition = \"gpu\"  nodes = 1")
    unknown = [k for k in table if k not in SLURM_KEYS]
    if unknown:
        raise ValueError(f"{where} [slurm]: unknown key{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(k) for k in unknown)}; accepted keys are: {', '.join(SLURM_KEYS)}")
    for k in _INT_KEYS:
        v = table.get(k)
        if v is not None and (type(v) is not int or not 1 <= v <= 100_000):
            raise ValueError(f"{where} [slurm]: {k} must be a whole number from 1; got {v!r}")
    for k in _STR_KEYS:
        v = table.get(k)
        if v is not None and (not isinstance(v, str) or not v or v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError(f"{where} [slurm]: {k} must be one word (Slurm's own name for it); got {v!r}")
    if table.get("time") is not None and not _TIME_RE.match(table["time"]):
        raise ValueError(f"{where} [slurm]: time must be in Slurm's form (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]); "
                         f"got {table['time']!r}")
    extra = table.get("extra", [])
    if not (isinstance(extra, list) and all(isinstance(x, str) and x.startswith("-") for x in extra)):
        raise ValueError(f"{where} [slurm]: extra must be a list of sbatch options, e.g. [\"--exclusive\"]; got {extra!r}")
    poll = table.get("poll_s")
    if poll is not None and (isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0.2 <= poll <= 600):
        raise ValueError(f"{where} [slurm]: poll_s must be a number of seconds from 0.2 to 600; got {poll!r}")
    return dict(table)


def sbatch_argv(slurm: dict[str, Any], run_dir: Path, job_name: str) -> list[str]:
    """``sbatch --parsable --hold ...`` for the attempt: the table's options, the run dir as the job's
    working directory, the supervisor's log as its output."""
    argv = ["sbatch", "--parsable", "--hold", f"--job-name={job_name}", f"--chdir={run_dir}",
            f"--output={run_dir / SUPERVISOR_LOG}", "--open-mode=append"]
    for k in ("partition", "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "time", "account", "qos"):
        if slurm.get(k) is not None:
            argv.append(f"--{k.replace('_', '-')}={slurm[k]}")
    return [*argv, *slurm.get("extra", []), str(run_dir / JOB_SCRIPT)]


def batch_script(run_dir: Path, launch_sha256: str, python: str = sys.executable) -> str:
    """The job's batch script: the supervisor of ``run_dir`` in place of the shell (``exec``), so
    ``scancel --batch`` reaches it and its exit status is the batch step's. It carries the digest of
    what was launched (launcher/trust.py): Slurm keeps the script as submitted, so a run.json replaced
    in the run dir meanwhile is refused by the supervisor, never run."""
    return ("#!/bin/sh\n# written by stepwatch launch: the run's supervisor inside the allocation\n"
            f"exec {shlex.quote(python)} -P -m stepwatch.launcher.supervisor {shlex.quote(str(run_dir))} "
            f"--launch-sha256 {launch_sha256}\n")


def slurm_job_id(run: dict[str, Any]) -> str | None:
    """The Slurm job id run.json records for the attempt (None: a local run, or not submitted yet)."""
    sch = run.get("scheduler")
    job = sch.get("job_id") if isinstance(sch, dict) and sch.get("kind") == "slurm" else None
    return job if isinstance(job, str) and job.isdigit() else None


class SlurmError(RuntimeError):
    """A Slurm command that failed; the message holds the command and what it printed."""


def _run(argv: list[str], stdin: str | None = None) -> str:
    """Run a Slurm command; inside a job (the restart policy's resubmission) without that job's ``SLURM_*`` variables,
    which sbatch would pass on to the new job's srun (``SLURM_CONF`` kept)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    try:
        # umask 022: sbatch hands its umask to the job (SLURM_UMASK), so the job's output (supervisor.log) and what
        # the supervisor creates are never the group's to write under a team's umask 002
        p = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, input=stdin, env=env,
                           umask=0o022)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: is Slurm's client installed on this machine (slurm-client)?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(argv)} did not answer within {SLURM_TIMEOUT_S:g} s") from None
    if p.returncode != 0:
        raise SlurmError(f"{shlex.join(argv)} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[:500]}")
    return p.stdout


def submit_held(slurm: dict[str, Any], run_dir: Path, job_name: str, launch_sha256: str) -> tuple[str, list[str]]:
    """Submit the batch script held, on sbatch's stdin (nobody can swap the file between its write and
    sbatch's read); a copy is kept in the run dir for the record. Returns (job id, the sbatch argv).
    Raises SlurmError."""
    text = batch_script(run_dir, launch_sha256)
    write_bytes_atomic(run_dir / JOB_SCRIPT, text.encode(), mode=0o644)
    argv = sbatch_argv(slurm, run_dir, job_name)[:-1]  # the script on stdin
    out = _run(argv, stdin=text).strip()
    job_id = out.split(";")[0]  # --parsable: "id" or "id;cluster"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed {out[:200]!r}, not a job id")
    return job_id, argv


def release(job_id: str) -> None:
    """Let a held job be scheduled (raises SlurmError)."""
    _run(["scontrol", "release", job_id])


def scancel(job_id: str, signal: str | None = None, batch: bool = False) -> None:
    """``scancel [--signal=SIG] [--batch] JOB``: without a signal the job ends (its steps and the
    batch script); ``--signal`` alone goes to the job's steps; with ``batch`` to the batch script
    (the supervisor) only. Raises SlurmError."""
    _run(["scancel", *([f"--signal={signal}"] if signal else []), *(["--batch"] if batch else []), job_id])


def job_mismatch(job_id: str, run_dir: Path, owner_uid: int | None) -> str | None:
    """Why Slurm job ``job_id`` is not this run's, or None when it is: read from a run.json, a job id
    is a claim until Slurm confirms the job's owner is the run dir's (``owner_uid``) and its working
    directory the run dir (``--chdir`` at submission). A job Slurm no longer knows is not this run's."""
    try:
        out = _run(["scontrol", "-o", "show", "job", job_id])
    except SlurmError as e:
        return f"Slurm does not confirm job {job_id}: {e}"
    line = next((ln for ln in out.splitlines() if ln.startswith(f"JobId={job_id} ")), None)
    if line is None:
        return f"Slurm knows no job {job_id}"
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    uid = re.search(r"\((\d+)\)$", kv.get("UserId", ""))
    if uid is None or owner_uid is None or int(uid.group(1)) != owner_uid:
        return f"job {job_id} belongs to {kv.get('UserId', 'an unknown user')}, not to the run's owner (uid {owner_uid})"
    work = kv.get("WorkDir")
    if work is None or Path(work).resolve() != Path(run_dir).resolve():
        return f"job {job_id} works in {work}, not in this run dir ({run_dir})"
    return None
