"""Small text formatters shared by the panels (durations, bytes, the header line)."""

from __future__ import annotations

import math
import re
import time
from typing import Any

from stepwatch.monitors.snapshot.runmodeltypes import Liveness
from stepwatch.monitors.snapshot.types import (Arrival, AttemptLedger, AttnImplementation, Dynamo, Energy, Eta,
                                               Health, Identity, Ledger, LivenessSignals, Log, Padding, PaddingWidth,
                                               Phase, RankStepSummary, Scaling, ScalingShares, Scheduler, Snapshot, Step,
                                               Versions)
from stepwatch.monitors.snapshot.process import state_word as state_word  # the views' and the pages' one state word
from stepwatch.monitors.snapshot.restart import from_words, restart_pending
from stepwatch.monitors.snapshot.runmodeltypes import RestartView
from stepwatch.monitors.states import NOT_STARTED, OK, RUNNING, STALLED, STARTED


#: What the dynamo panel and ``status`` say when neither the log nor the events showed dynamo output.
NO_DYNAMO_WORDS = "dynamo: no torch.compile output seen (recompiles unknown, not 0)"


def no_dynamo_output(d: Dynamo) -> bool:
    """The snapshot's ``dynamo`` part says nothing: no source, and no count from anywhere."""
    return not d["source"] and all(d[k] is None for k in ("recompiles", "graph_breaks", "recompile_limit_hits"))


#: The run screen's line while the run runs unwatched (``status`` says it as a WARNING line).
SUPERVISOR_GONE_WORDS = ("SUPERVISOR GONE (killed?): the run goes on, but no exit status will be recorded; "
                         "its warden (if any) pages the alerts")


def supervisor_gone(snap: Snapshot) -> bool:
    """The run runs and its supervisor is gone (``supervisor_alive`` false; a Slurm run's supervisor
    is on another node, never judged from here)."""
    return snap["state"] == RUNNING and snap["supervisor_alive"] is False and snap["scheduler"] is None


#: How an attempt ended, from its cause's evidence (monitors/parsers/endcauses.py): its signal or its exit code.
_HOW = re.compile(r"\bkilled by (SIG[A-Z0-9]+)|\bexit(?:ed with)? code (-?\d+)")
#: Causes whose words add nothing to the signal or exit code that says how the attempt died.
_PLAIN_CAUSES = ("killed_by_signal", "exception", "unknown")


def died_words(rs: RestartView) -> str:
    """``SIGKILL``, ``exit 3``, ``save crash, SIGKILL``, ``device oom``: how the attempt the policy judged ended."""
    m = _HOW.search(rs["evidence"])
    how = (m[1] or f"exit {m[2]}") if m else None
    cause = rs["cause"].replace("_", " ") or "unknown"
    return how if how and rs["cause"] in _PLAIN_CAUSES else f"{cause}, {how}" if how else cause


def restart_words(snap: Snapshot, now: float | None = None, head: str = "RESTART POLICY") -> str | None:
    """The restart line (the run screen's under the header, ``status``'s ``restart`` line), in the tense of the
    attempt on screen; None when the policy has not decided:

    - the back-off: ``restarting: attempt 1 died (SIGKILL), attempt 2 starts in 12 s from ckpt_200``;
    - the attempt the policy started: ``attempt 2: restarted by the policy after attempt 1 died (SIGKILL) · resumed
      from ckpt_200``;
    - an attempt launched by hand after the decision: ``attempt 3: launched by hand after attempt 2 (the policy:
      STOP: …)``;
    - else the decision on the attempt on screen, as its page said it (``head (enforce, after attempt 2): STOP: …``),
      and why a promised restart did not start."""
    rs: RestartView | None = snap["restart"]
    if rs is None:
        return None
    ended, on_screen = rs["attempt"], snap["attempt"]
    pending = restart_pending(snap, time.time() if now is None else now)
    if pending is not None:
        nxt, left = pending
        when = "is being launched" if left is None else f"starts in {left} s"
        return f"restarting: attempt {ended} died ({died_words(rs)}), attempt {nxt} {when} {from_words(rs)}"
    if ended is not None and type(on_screen) is int and on_screen > ended:  # a later attempt is on screen
        if rs["outcome"] == STARTED and rs["started_attempt"] in (on_screen, None) and on_screen == ended + 1:
            how = (f"started from scratch ({rs['outcome_words']})" if rs["outcome_words"]
                   else "resumed " + from_words(rs) if rs["checkpoint"] else "started from scratch")
            return f"attempt {on_screen}: restarted by the policy after attempt {ended} died ({died_words(rs)}) · {how}"
        return (f"attempt {on_screen}: launched by hand after attempt {ended} (the policy: {rs['verdict']}: "
                f"{rs['words']})")
    words = f"{head} ({rs['mode']}, after attempt {ended}): {rs['verdict']}: {rs['words']}"
    if rs["outcome"] == NOT_STARTED:
        words += f"; the restart did not start: {rs['outcome_words']}"
    return words


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
    if eta["state"] == STALLED:
        return "STALLED"
    if eta["state"] != OK or (eta_s := eta["eta_s"]) is None:
        return "-"
    end = clock(eta["end_at_unix"], "%H:%MZ")
    return f"{hms(eta_s)} (ends {end})"


def health_words(snap: Snapshot, basis: bool = True) -> str:
    """``run: 3 procs, CPU 1.9 cores, RSS 2.1 GiB · load 3.2/16 · started 05-28 14:02Z`` (``basis``: say
    how the CPU figure was taken, as ``status`` does; the screen leaves it out to stay one line)."""
    h: Health = snap["health"]
    started = snap["launched_at_unix"]
    when = f" · started {clock(started, '%m-%d %H:%MZ')}" if isinstance(started, (int, float)) else ""
    if snap["state"] != RUNNING:
        return f"run not running{when}"
    host = f"load {load:.1f}/{h['host_cores'] or '?'}" if (load := h["host_load_1m"]) is not None else "load ?"
    if not h["processes"]:
        return f"run: no live process recorded · {host}{when}"
    cpu = (f"CPU {cores:.1f} cores" + (f" ({h['cpu_cores_basis']})" if basis else "")
           if (cores := h["cpu_cores"]) is not None else "CPU ?")
    return f"run: {h['processes']} procs, {cpu}, RSS {gib(h['rss_bytes'])} GiB · {host}{when}"


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


def rank_loss(steps: RankStepSummary | None) -> float | None:
    """A rank's own latest loss from ``ranks[].steps.metrics`` (None when it printed none)."""
    if steps is None:
        return None
    metrics = steps["metrics"]  # by metric name: a name it printed, or none
    return next((metrics[k] for k in RANK_LOSS_NAMES if metrics.get(k) is not None), None)


def phase_words(phase: Phase | None) -> str | None:
    """``saving for 12 s (budget 300 s)``, ``training for 1:02:03``; None before anything is known."""
    if phase is None or not phase["source"]:
        return None
    out = str(phase["name"])
    if (for_s := phase["for_s"]) is not None:
        out += f" for {duration_words(for_s)}"
    if (budget_s := phase["budget_s"]) is not None:
        out += f" (budget {budget_s:.0f} s)"
    return out


def liveness_words(liveness: Liveness | None) -> str | None:
    """``CPU moved 0 s ago, output 1 s ago, step 0 s ago``: each signal the stall and frozen verdicts stand on
    (ARCHITECTURE.md R18); None when none is known (an unknown one is left out, never shown as 0)."""
    if liveness is None:
        return None
    signals: LivenessSignals = liveness["signals_s"]
    words = [f"{label} {duration_words(v)} ago" for key, label in (("cpu", "CPU moved"), ("output", "output"),
                                                                   ("step", "step"))
             if isinstance(v := signals[key], (int, float))]
    return ", ".join(words) or None


def ledger_words(ledger: Ledger | None) -> str | None:
    """``time 0:03:12 in 2 attempts, goodput 83%: training 0:02:40, starting 12 s, lost 4 s (17 steps), restart gap
    2 s``: the run's accounts that hold time, largest first (the ledger, ARCHITECTURE.md); None without one."""
    if ledger is None or not (phases := ledger["phases_s"]) or (wall_s := ledger["wall_s"]) is None:
        return None
    attempts: list[AttemptLedger] = ledger["attempts"]
    lost_steps = sum(a["lost_steps"] or 0 for a in attempts)
    parts = []
    for name, secs_ in sorted(phases.items(), key=lambda kv: -kv[1]):
        if secs_ >= 0.5:
            parts.append(f"{name.replace('_', ' ')} {duration_words(secs_)}"
                         + (f" ({lost_steps} steps)" if name == "lost" and lost_steps else ""))
    gp = ledger["goodput"]
    head = (f"time {duration_words(wall_s)}" + (f" in {len(attempts)} attempts" if len(attempts) > 1 else "")
            + (f", goodput {100 * gp:.0f}%" if isinstance(gp, (int, float)) else ""))
    return head + (": " + ", ".join(parts) if parts else "")


def duration_words(seconds: float) -> str:
    """``12 s`` below a minute, else ``H:MM:SS``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    m, sec = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}"


def streams_words(log: Log) -> str | None:
    """``2 processes' bars interleave in the log: the step follows the first`` (fits 80 columns with NOTE:)."""
    n = log["streams"]
    return f"{n} processes' bars interleave in the log: the step follows the first" if n >= 2 else None


def timing_words(snap: Snapshot) -> str | None:
    """The words for the snapshot's ``step.timing``, None when the times are exact or absent; for
    the program's own times, what the arrival of its lines says beside them."""
    step: Step = snap["step"]
    words = TIMING_WORDS.get(step["timing"] or "")  # by timing word: exact (or none) says nothing
    arr: Arrival | None = step["arrival"]
    if words and arr is not None and arr["agrees"] is not None:
        verdict = "agrees" if arr["agrees"] else "DISAGREES: the program times only part of its step?"
        words += f" (their lines' arrival: p50 {secs(arr['p50'])} s, {verdict})"
    return words


def attention_words(attn: AttnImplementation) -> tuple[str, bool]:
    """``attention sdpa (as requested)`` or ``attention sdpa (requested flex_attention)``, and whether
    the resolved backend differs from the one asked for (the views mark it)."""
    req, res = attn["requested"], attn["resolved"]
    if res is None:
        return f"attention {'unknown' if req is None else f'unknown (requested {req})'}", False
    if req is None or req == res:
        return f"attention {res}" + (" (as requested)" if req else " (none requested)"), False
    return f"attention {res} (requested {req})", True


def versions_words(versions: Versions) -> str:
    """``torch 2.13.0+cpu  transformers 4.57.1``: the versions the training process imported."""
    return "  ".join(f"{lib} {versions[lib] or 'unknown'}" for lib in ("torch", "transformers"))


def tree_words(ident: Identity) -> str:
    """``clean at launch`` / ``DIRTY at launch`` / ``dirty at launch: unknown`` (run.json's sample)."""
    dirty = ident.get("harness_dirty_at_launch")  # total=False: a run.json by other hands may lack it
    if dirty is True:
        return "DIRTY at launch"
    return "clean at launch" if dirty is False else "dirty at launch: unknown"


def scheduler_words(sch: Scheduler | None) -> str | None:
    """``Slurm job 12 RUNNING on node01 · 0:41:03 left of 4:00:00`` / ``Slurm job 13 PENDING (Priority)``
    / ``Slurm job 9 TIMEOUT, exit code 0:15``; None for a local run."""
    if sch is None:
        return None
    state = sch["state"]
    words = f"Slurm job {sch['job_id'] or '(not submitted)'} {state}"
    if sch["reason"] and state != "RUNNING":
        words += f" ({sch['reason']})"
    if sch["nodes"]:
        words += f" on {sch['nodes']}"
    if sch["exit_code"] and state not in ("RUNNING", "PENDING"):
        words += f", exit code {sch['exit_code']}"
    if (left := sch["time_left_s"]) is not None and state == "RUNNING":
        words += f" · {hms(left)} left of {hms(sch['time_limit_s'])}"
    if sch["stale"]:
        words += f" · last asked {hms(sch['poll_age_s'])} ago (the job watcher stopped?)"
    if sch["error"]:
        words += f" · {sch['error']}"
    return words


def pid_or_job(snap: Snapshot) -> str:
    """The runs list's PID cell: the training process's pid, else a Slurm run's ``job N``, else ``-``."""
    sch: Scheduler | None = snap["scheduler"]
    job = sch["job_id"] if sch is not None else None
    return str(snap["pid"] or (f"job {job}" if job else "-"))


def scaling_words(scaling: Scaling | None) -> str:
    """``scaling: quadratic: attention (w²) is ~51% of the step at the run's widths (linear 47%, constant
    2%; E[w²]/E[w]² 1.34, 190 steps)`` / ``scaling: undetermined (2 distinct width(s): ...)``."""
    if scaling is None:
        return "scaling: undetermined (no fit yet)"
    verdict = scaling["verdict"]
    if verdict == "undetermined":
        return f"scaling: undetermined ({scaling['reason'] or 'no fit yet'})"
    what = {"quadratic": ("attention (w²)", "quadratic"), "linear": ("per-token work", "linear"),
            "launch-bound": ("a fixed cost per step (launches, optimizer, host)", "constant")}[verdict]
    sh: ScalingShares | None = scaling["shares"]
    # by term, in the fit's order
    shares = {"linear": sh["linear"], "quadratic": sh["quadratic"], "constant": sh["constant"]} if sh is not None else {}
    others = ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items() if k != what[1] and v is not None)
    ratio = f"; E[w²]/E[w]² {e_ratio:.2f}" if (e_ratio := scaling["e_w2_over_e_w_sq"]) else ""
    return (f"scaling: {verdict}: {what[0]} is ~{100 * (shares.get(what[1]) or 0):.0f}% of the step at the run's "
            f"widths ({others}{ratio}, {scaling['steps']} steps)")


def padding_words(padding: Padding | None) -> str | None:
    """``padding 8.3% of tokens; 34% of steps unpadded (padded ones +0.2% at equal width)``; None without counts."""
    if padding is None or (share := padding["share"]) is None:
        return None
    same_width: list[PaddingWidth] = padding["same_width"]
    same = [x for w in same_width if (x := w["padded_excess"]) is not None]
    excess = f" (padded ones {100 * sum(same) / len(same):+.1f}% at equal width)" if same else ""
    return f"padding {100 * share:.1f}% of tokens; {100 * (padding['unpadded_share'] or 0):.0f}% of steps unpadded{excess}"


def energy_words(energy: Energy | None, replay: str | None = None) -> str | None:
    """``energy 750 J/step, 5.46 tokens/J, 21.8 kJ this attempt (GPU0, GPU1)`` / ``energy unsupported: ...``;
    None when there is nothing to say (no GPU at all). ``replay``: the recording the figures replay (the demo on a
    machine without a GPU), said first: ``energy (RECORDED replay, not this machine) 976.2 J/step ...``."""
    if energy is None:
        return None
    if unsupported := energy["unsupported"]:
        return None if unsupported.startswith("no GPU energy samples") else f"energy unsupported: {unsupported}"
    if (joules := energy["joules"]) is None:
        return None
    per_step = energy["joules_per_step"]
    parts = [f"{per_step:.4g} J/step" if per_step is not None else "J/step: no step inside the samples yet"]
    if (per_joule := energy["tokens_per_joule"]) is not None:
        parts.append(f"{per_joule:.4g} tokens/J")
    parts.append(f"{joules / 1000:.4g} kJ this attempt ({', '.join(f'GPU{i}' for i in energy['devices'])})")
    return "energy " + ("(RECORDED replay, not this machine) " if replay else "") + ", ".join(parts)


def stack_frames(stack: Any, most: int = 12) -> list[str]:
    """The supervisor's py-spy dump of a rank (``stack`` of an alert) as its thread and frame lines,
    innermost frame first, at most ``most`` of them; py-spy's own header lines are left out."""
    lines = [ln.rstrip() for ln in str(stack).splitlines() if ln.startswith(("Thread", " "))]
    return lines[:most]
