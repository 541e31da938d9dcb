"""Small text formatters shared by the panels (durations, bytes, the header line)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, cast

from stepwatch.monitors.slurm import ABNORMAL_ENDS
from stepwatch.monitors.snapshot.types import (AttnImplementation, Dynamo, Energy, Eta, Identity, Padding, Scaling,
                                               Scheduler, Snapshot, Versions)
from stepwatch.monitors.states import EXITED, OK, PENDING, RUNNING, STALLED


#: What the dynamo panel and ``status`` say when neither the log nor the events showed dynamo output.
NO_DYNAMO_WORDS = "dynamo: no torch.compile output seen (recompiles unknown, not 0)"


def no_dynamo_output(d: Dynamo | Mapping[str, Any]) -> bool:
    """The snapshot's ``dynamo`` part says nothing: no source, and no count from anywhere."""
    return not d.get("source") and all(d.get(k) is None for k in ("recompiles", "graph_breaks", "recompile_limit_hits"))


#: The run screen's line while the run runs unwatched (``status`` says it as a WARNING line).
SUPERVISOR_GONE_WORDS = ("SUPERVISOR GONE (killed?): the run goes on, but no exit status will be recorded; "
                         "its warden (if any) pages the alerts")


def supervisor_gone(snap: Snapshot) -> bool:
    """The run runs and its supervisor is gone (``supervisor_alive`` false; a Slurm run's supervisor
    is on another node, never judged from here)."""
    return snap.get("state") == RUNNING and snap.get("supervisor_alive") is False and not snap.get("scheduler")


def hms(seconds: float | None) -> str:
    """Seconds -> ``H:MM:SS`` (or ``-``)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def clock(t: Any, fmt: str) -> str:
    """Unix seconds as UTC wall clock (``fmt`` for time.strftime); ``?`` for a value no clock shows
    (a file's 1e300, a NaN, an ETA of years)."""
    try:
        return time.strftime(fmt, time.gmtime(t)) if isinstance(t, (int, float)) else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def eta_words(eta: Eta) -> str:
    """``0:23:21 (ends 19:44Z)`` / ``STALLED`` / ``-``, from the snapshot's ``eta``."""
    if eta.get("state") == STALLED:
        return "STALLED"
    if eta.get("state") != OK or (eta_s := eta.get("eta_s")) is None:
        return "-"
    end = clock(eta.get("end_at_unix"), "%H:%MZ")
    return f"{hms(eta_s)} (ends {end})"


def health_words(snap: Snapshot, basis: bool = True) -> str:
    """``run: 3 procs, CPU 1.9 cores, RSS 2.1 GiB · load 3.2/16 · started 05-28 14:02Z`` (``basis``: say
    how the CPU figure was taken, as ``status`` does; the screen leaves it out to stay one line)."""
    h = snap.get("health") or {}
    started = snap.get("launched_at_unix")
    when = f" · started {clock(started, '%m-%d %H:%MZ')}" if isinstance(started, (int, float)) else ""
    if snap.get("state") != RUNNING:
        return f"run not running{when}"
    host = f"load {h['host_load_1m']:.1f}/{h.get('host_cores') or '?'}" if h.get("host_load_1m") is not None else "load ?"
    if not h.get("processes"):
        return f"run: no live process recorded · {host}{when}"
    cpu = (f"CPU {h['cpu_cores']:.1f} cores" + (f" ({h.get('cpu_cores_basis')})" if basis else "")
           if h.get("cpu_cores") is not None else "CPU ?")
    return f"run: {h['processes']} procs, {cpu}, RSS {gib(h.get('rss_bytes'))} GiB · {host}{when}"


def secs(v: float | None) -> str:
    """A step time in seconds with sensible precision (``-`` when unknown)."""
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def gib(v: float | None) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}"


#: How the step times were taken, in words beside the figures (``step.timing`` of the snapshot);
#: nothing is said for ``exact`` (the emitter's own perf_counter per step).
TIMING_WORDS = {
    "per_update": "timed from the log: one progress update per step",
    "shared": "timed from the log: several steps share each progress update",
    "reported": "as the program reports them in its log",
    "approximate": "APPROXIMATE: this view's own reading of the log (no supervisor record)",
}


#: The names a rank's own loss goes by (its log dicts', its bar's postfix), first found first.
RANK_LOSS_NAMES = ("loss", "train_loss")


def rank_loss(steps: Mapping[str, Any] | None) -> float | None:
    """A rank's own latest loss from ``ranks[].steps.metrics`` (None when it printed none)."""
    metrics = (steps or {}).get("metrics") or {}
    return next((metrics[k] for k in RANK_LOSS_NAMES if metrics.get(k) is not None), None)


def phase_words(phase: Mapping[str, Any] | None) -> str | None:
    """``saving for 12 s (budget 300 s)``, ``training for 1:02:03``; None before anything is known."""
    if not phase or not phase.get("source"):
        return None
    out = str(phase.get("name"))
    if phase.get("for_s") is not None:
        out += f" for {duration_words(phase['for_s'])}"
    if phase.get("budget_s") is not None:
        out += f" (budget {phase['budget_s']:.0f} s)"
    return out


def liveness_words(liveness: Mapping[str, Any] | None) -> str | None:
    """``CPU moved 0 s ago, output 1 s ago, step 0 s ago``: each signal the stall and frozen verdicts stand on
    (ARCHITECTURE.md R18); None when none is known (an unknown one is left out, never shown as 0)."""
    signals = (liveness or {}).get("signals_s") or {}
    words = [f"{label} {duration_words(v)} ago" for key, label in (("cpu", "CPU moved"), ("output", "output"),
                                                                   ("step", "step"))
             if isinstance(v := signals.get(key), (int, float))]
    return ", ".join(words) or None


def ledger_words(ledger: Mapping[str, Any] | None) -> str | None:
    """``time 0:03:12 in 2 attempts, goodput 83%: training 0:02:40, starting 12 s, lost 4 s (17 steps), restart gap
    2 s``: the run's accounts that hold time, largest first (the ledger, ARCHITECTURE.md); None without one."""
    if not ledger or not ledger.get("phases_s") or ledger.get("wall_s") is None:
        return None
    attempts = ledger.get("attempts") or []
    lost_steps = sum(a.get("lost_steps") or 0 for a in attempts)
    parts = []
    for name, secs_ in sorted(ledger["phases_s"].items(), key=lambda kv: -kv[1]):
        if secs_ >= 0.5:
            parts.append(f"{name.replace('_', ' ')} {duration_words(secs_)}"
                         + (f" ({lost_steps} steps)" if name == "lost" and lost_steps else ""))
    gp = ledger.get("goodput")
    head = (f"time {duration_words(ledger['wall_s'])}" + (f" in {len(attempts)} attempts" if len(attempts) > 1 else "")
            + (f", goodput {100 * gp:.0f}%" if isinstance(gp, (int, float)) else ""))
    return head + (": " + ", ".join(parts) if parts else "")


def duration_words(seconds: float) -> str:
    """``12 s`` below a minute, else ``H:MM:SS``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    m, sec = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}"


def streams_words(log: Mapping[str, Any]) -> str | None:
    """``2 processes' bars interleave in the log: the step follows the first`` (fits 80 columns with NOTE:)."""
    n = log.get("streams") or 0
    return f"{n} processes' bars interleave in the log: the step follows the first" if n >= 2 else None


def timing_words(snap: Snapshot) -> str | None:
    """The words for the snapshot's ``step.timing``, None when the times are exact or absent; for
    the program's own times, what the arrival of its lines says beside them."""
    step = snap.get("step") or {}
    words = TIMING_WORDS.get(step.get("timing") or "")
    arr = step.get("arrival") or {}
    if words and arr.get("agrees") is not None:
        verdict = "agrees" if arr["agrees"] else "DISAGREES: the program times only part of its step?"
        words += f" (their lines' arrival: p50 {secs(arr.get('p50'))} s, {verdict})"
    return words


def state_word(snap: Snapshot) -> str:
    """RUNNING / PENDING (a queued Slurm job) / EXITED code / STOPPED (the operator asked) / KILLED signal /
    Slurm's end (TIMEOUT, CANCELLED, ...) / UNKNOWN, as the header shows it."""
    st = snap.get("state")
    job = (snap.get("scheduler") or {}).get("state")
    if st == RUNNING:
        return "RUNNING"
    if st == PENDING:
        return job if job in ("PENDING", "CONFIGURING", "RUNNING") else "PENDING"
    if st == EXITED and job in ABNORMAL_ENDS:  # Slurm's word first: TIMEOUT, CANCELLED, NODE_FAIL ...
        if snap.get("returncode") is None and not snap.get("signal"):
            return job
        return f"{job} ({snap.get('signal') or 'exit ' + str(snap.get('returncode'))})"
    if st == EXITED:
        if (snap.get("ended") or {}).get("stop_requested"):
            return f"STOPPED ({snap['signal'] or 'exit ' + str(snap.get('returncode'))})"
        if snap.get("signal"):
            return f"KILLED {snap['signal']}"
        return f"EXITED {snap.get('returncode')}"
    return "UNKNOWN"


def attention_words(attn: AttnImplementation | Mapping[str, Any]) -> tuple[str, bool]:
    """``attention sdpa (as requested)`` or ``attention sdpa (requested flex_attention)``, and whether
    the resolved backend differs from the one asked for (the views mark it)."""
    req, res = attn.get("requested"), attn.get("resolved")
    if res is None:
        return f"attention {'unknown' if req is None else f'unknown (requested {req})'}", False
    if req is None or req == res:
        return f"attention {res}" + (" (as requested)" if req else " (none requested)"), False
    return f"attention {res} (requested {req})", True


def versions_words(versions: Versions | Mapping[str, Any]) -> str:
    """``torch 2.13.0+cpu  transformers 4.57.1``: the versions the training process imported."""
    return "  ".join(f"{lib} {versions.get(lib) or 'unknown'}" for lib in ("torch", "transformers"))


def tree_words(ident: Identity | Mapping[str, Any]) -> str:
    """``clean at launch`` / ``DIRTY at launch`` / ``dirty at launch: unknown`` (run.json's sample)."""
    dirty = ident.get("harness_dirty_at_launch")
    if dirty is True:
        return "DIRTY at launch"
    return "clean at launch" if dirty is False else "dirty at launch: unknown"


def scheduler_words(sch: Scheduler | None) -> str | None:
    """``Slurm job 12 RUNNING on node01 · 0:41:03 left of 4:00:00`` / ``Slurm job 13 PENDING (Priority)``
    / ``Slurm job 9 TIMEOUT, exit code 0:15``; None for a local run."""
    if not sch:
        return None
    words = f"Slurm job {sch.get('job_id') or '(not submitted)'} {sch.get('state')}"
    if sch.get("reason") and sch.get("state") != "RUNNING":
        words += f" ({sch['reason']})"
    if sch.get("nodes"):
        words += f" on {sch['nodes']}"
    if sch.get("exit_code") and sch.get("state") not in ("RUNNING", "PENDING"):
        words += f", exit code {sch['exit_code']}"
    if sch.get("time_left_s") is not None and sch.get("state") == "RUNNING":
        words += f" · {hms(sch['time_left_s'])} left of {hms(sch.get('time_limit_s'))}"
    if sch.get("stale"):
        words += f" · last asked {hms(sch.get('poll_age_s'))} ago (the job watcher stopped?)"
    if sch.get("error"):
        words += f" · {sch['error']}"
    return words


def pid_or_job(snap: Snapshot) -> str:
    """The runs list's PID cell: the training process's pid, else a Slurm run's ``job N``, else ``-``."""
    job = (snap.get("scheduler") or {}).get("job_id")
    return str(snap.get("pid") or (f"job {job}" if job else "-"))


def scaling_words(scaling: Scaling | None) -> str:
    """``scaling: quadratic: attention (w²) is ~51% of the step at the run's widths (linear 47%, constant
    2%; E[w²]/E[w]² 1.34, 190 steps)`` / ``scaling: undetermined (2 distinct width(s): ...)``."""
    sc = scaling or {}
    shares = cast("Mapping[str, float | None]", sc.get("shares") or {})
    verdict = sc.get("verdict") or "undetermined"
    if verdict == "undetermined":
        return f"scaling: undetermined ({sc.get('reason') or 'no fit yet'})"
    what = {"quadratic": ("attention (w²)", "quadratic"), "linear": ("per-token work", "linear"),
            "launch-bound": ("a fixed cost per step (launches, optimizer, host)", "constant")}[verdict]
    others = ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items() if k != what[1] and v is not None)
    ratio = f"; E[w²]/E[w]² {sc['e_w2_over_e_w_sq']:.2f}" if sc.get("e_w2_over_e_w_sq") else ""
    return (f"scaling: {verdict}: {what[0]} is ~{100 * (shares.get(what[1]) or 0):.0f}% of the step at the run's "
            f"widths ({others}{ratio}, {sc.get('steps')} steps)")


def padding_words(padding: Padding | None) -> str | None:
    """``padding 8.3% of tokens; 34% of steps unpadded (padded ones +0.2% at equal width)``; None without counts."""
    pd = padding or {}
    if (share := pd.get("share")) is None:
        return None
    same = [x for w in pd.get("same_width") or [] if (x := w.get("padded_excess")) is not None]
    excess = f" (padded ones {100 * sum(same) / len(same):+.1f}% at equal width)" if same else ""
    return f"padding {100 * share:.1f}% of tokens; {100 * (pd.get('unpadded_share') or 0):.0f}% of steps unpadded{excess}"


def energy_words(energy: Energy | None, replay: str | None = None) -> str | None:
    """``energy 750 J/step, 5.46 tokens/J, 21.8 kJ this attempt (GPU0, GPU1)`` / ``energy unsupported: ...``;
    None when there is nothing to say (no GPU at all). ``replay``: the recording the figures replay (the demo on a
    machine without a GPU), said first: ``energy (RECORDED replay, not this machine) 976.2 J/step ...``."""
    e = energy or {}
    if unsupported := e.get("unsupported"):
        return None if unsupported.startswith("no GPU energy samples") else f"energy unsupported: {unsupported}"
    if (joules := e.get("joules")) is None:
        return None
    parts = [f"{e['joules_per_step']:.4g} J/step" if e.get("joules_per_step") is not None else "J/step: no step inside the samples yet"]
    if e.get("tokens_per_joule") is not None:
        parts.append(f"{e['tokens_per_joule']:.4g} tokens/J")
    parts.append(f"{joules / 1000:.4g} kJ this attempt ({', '.join(f'GPU{i}' for i in e.get('devices') or [])})")
    return "energy " + ("(RECORDED replay, not this machine) " if replay else "") + ", ".join(parts)


def stack_frames(stack: Any, most: int = 12) -> list[str]:
    """The supervisor's py-spy dump of a rank (``stack`` of an alert) as its thread and frame lines,
    innermost frame first, at most ``most`` of them; py-spy's own header lines are left out."""
    lines = [ln.rstrip() for ln in str(stack).splitlines() if ln.startswith(("Thread", " "))]
    return lines[:most]
