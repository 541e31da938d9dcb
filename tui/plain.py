"""Words for a status snapshot: ``status`` without ``--json``, and ``watch --plain`` / ``--json``.

``watch`` follows a run from its files and prints one line per notable event — attempt started,
every Nth step with the running summary, each alert, the exit — with a UTC timestamp, and returns
the run's outcome as an exit code (0 when the run exited 0, else 1). Attaching to a run that already
ended prints its story and returns at once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO, cast
from collections.abc import Callable, Mapping

from stepwatch.monitors.runfiles import utc_iso
from stepwatch.monitors.snapshot.alerts import end_words
from stepwatch.monitors.snapshot.disk import full_words, lost_words
from stepwatch.monitors.snapshot.gpuview import replayed
from stepwatch.tui.format import (NO_DYNAMO_WORDS, ledger_words, stack_frames, streams_words, phase_words, liveness_words, rank_loss, attention_words, energy_words, eta_words, health_words, no_dynamo_output,
                                  padding_words, restart_words, scaling_words, scheduler_words, state_word, supervisor_gone, timing_words,
                                  tree_words, versions_words)
from stepwatch.monitors.snapshot.model import json_safe, run_ended
from stepwatch.monitors.snapshot.metrics import loss_health_words, metrics_words
from stepwatch.monitors.snapshot.ranks import latest_per_rank, restarts_words
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.detectors.frozen import Frozen
from stepwatch.monitors.snapshot.runmodeltypes import Liveness
from stepwatch.monitors.snapshot.types import (Alert, Count, Delivery, Disk, Dynamo, Ended, Eta, Fallback, GpuDevice,
                                               Identity, Log, Rank, RankStepSummary, Snapshot, Stall, Step,
                                               Straggler, Survivor, Watch)
from stepwatch.monitors.states import (EXITED, FLAGGED, HELD, NOT_JUDGED, OK, RESTARTING, RUNNING, STALLED, SUSPECTED,
                                      UNKNOWN, UNWATCHED, WARDED)
from stepwatch.monitors.watchdog import ProcessRef, wait_for_exit
from stepwatch.tui.safe import one_line


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _fmt_known(v: Count) -> str:
    """A dynamo count, ``unknown`` (never ``-`` nor 0) when nothing reported it."""
    return "unknown" if v is None else str(v)


def _commit(ident: Identity | None) -> str:
    """The launch's commit, short (``none`` when run.json names none)."""
    return ((ident.get("harness_commit") if ident is not None else None) or "none")[:12]


def _run_lines(snap: Snapshot) -> list[str]:
    """The run, its attempt and state, its pid, and how it ended; during a restart's back-off, the header's words
    (``RESTARTING in 12 s (attempt 2 from ckpt_200)``)."""
    word = state_word(snap)
    return [f"{snap['run']} attempt {snap['attempt'] or '-'}: {snap['state']}"
            + (f", pid {snap['pid']}" if snap["pid"] else "")
            + (f" ({end_words(snap)})" if run_ended(snap) else "")
            + (f" · {word}" if word.startswith(RESTARTING) else "")]


def _scheduler_lines(snap: Snapshot) -> list[str]:
    """A Slurm run's job."""
    sched = snap["scheduler"]
    return [] if sched is None else [f"  {scheduler_words(sched)}"]


def _watcher_lines(snap: Snapshot) -> list[str]:
    """Who no longer watches the run: its supervisor gone, or all its watchers."""
    lines = []
    if supervisor_gone(snap):
        lines.append("  WARNING: the supervisor is gone (killed?): the run goes on, but no exit code will be recorded "
                     "and `stop` will escalate from the command line itself")
    watch: Watch = snap["watch"]
    if watch["state"] in (HELD, WARDED, UNWATCHED):  # who still watches it, if anyone
        lines.append(f"  WARNING: {watch['reason']}")
    return lines


def _step_lines(snap: Snapshot) -> list[str]:
    """The step of max steps with the ETA, and the step times with how they were taken."""
    step: Step = snap["step"]
    e: Eta = snap["eta"]
    eta = (f", ETA {eta_words(e)}: {e['remaining_steps']} steps at {_fmt(e['seconds_per_step'], 3)} s "
           f"({e['basis']})" if e["state"] in (OK, STALLED) else "")
    src = f" (from {step['source']})" if step["source"] else ""
    words = timing_words(snap)
    return [f"  step {_fmt(step['global_step'])}/{_fmt(step['max_steps'])}{src}{eta}",
            f"  {snap['step_line'] or 'n=0 seconds_per_optimizer_step'}" + (f" ({words})" if words else "")]


def _log_lines(snap: Snapshot) -> list[str]:
    """The metrics read, train.log's format, its hint, and its interleaved bars."""
    log: Log = snap["log"]
    mw = metrics_words(snap["metrics"])
    lines = [f"  log: {mw or 'no loss or other metric read'}; format "
             + (f"{log['format']} ({log['matched_lines']} lines)" if log["format"] else "not recognised")]
    lines.append(f"  {loss_health_words(snap['loss_health'])}")
    if log["hint"]:
        lines.append(f"  HINT: {log['hint']}")
    if sw := streams_words(log):
        lines.append(f"  NOTE: {sw}")
    return lines


def _health_lines(snap: Snapshot) -> list[str]:
    return [f"  {health_words(snap)}"]


def _cost_lines(snap: Snapshot) -> list[str]:
    """The step-time fit over the batch shape, the padding, the energy."""
    return ["  " + "; ".join(w for w in (scaling_words(snap["scaling"]), padding_words(snap["padding"]),
                                         energy_words(snap["energy"], replayed(snap))) if w)]


def _stall_words(st: Stall) -> str:
    """``stall ok`` / ``stall stalled (412.0 s)`` / ``stall not judged (no step times)``."""
    stall = st["state"]
    if stall == STALLED:
        return f"stall {stall} ({_fmt(st['current_step_elapsed_s'], 1)} s)"
    if stall in (NOT_JUDGED, SUSPECTED) and st["reason"]:
        return f"stall {stall} ({st['reason']})"
    return f"stall {stall}"


def _verdict_lines(snap: Snapshot) -> list[str]:
    """The fallback and stall verdicts, and (while it runs) the run's phase and liveness signals."""
    fb: Fallback = snap["fallback"]
    running = snap["state"] == RUNNING
    pw = phase_words(snap["phase"]) if running else None
    lw = liveness_words(snap["liveness"]) if running else None
    return [f"  fallback {fb['state']}" + (f" ({fb['reason']})" if fb["reason"] and fb["state"] != OK else "")
            + f"; {_stall_words(snap['stall'])}"
            + (f"; phase {pw}" if pw else "")
            + (f"; {lw}" if lw else "")]


def _dynamo_lines(snap: Snapshot) -> list[str]:
    d: Dynamo = snap["dynamo"]
    if no_dynamo_output(d):
        return ["  " + NO_DYNAMO_WORDS]
    return [f"  dynamo: recompiles {_fmt_known(d['recompiles'])}, graph breaks {_fmt_known(d['graph_breaks'])}, "
            f"recompile-limit hits {_fmt_known(d['recompile_limit_hits'])} (from {d['source'] or '-'})"]


def _build_lines(snap: Snapshot) -> list[str]:
    """The attention backend and the library versions the training process imported."""
    return [f"  {attention_words(snap['attn_implementation'])[0]}; {versions_words(snap['versions'])}"]


def _device_line(g: GpuDevice) -> str:
    held = f" (the run's rank {', '.join(map(str, run_ranks))})" if (run_ranks := g["run_ranks"]) else ""
    return (f"  GPU{g['index']} {g['name']}{held}: kernel-active {_fmt(g['util_pct'], 0)}%, "
            f"power {_fmt(g['power_w'], 0)}/{_fmt(g['power_limit_w'], 0)} W"
            + (f"; over the last 30 s: {g['verdict']}" if g["verdict"] else ""))


def _gpu_lines(snap: Snapshot) -> list[str]:
    """One line per device (a replayed recording said first), else why there is none."""
    if not (gpu := snap["gpu"]):
        return [f"  GPU: {snap['gpu_error'] or 'no samples'}"]
    lines = []
    if (src := snap["gpu_source"] or "").startswith("recorded"):
        lines.append(f"  GPU: RECORDED replay, not this machine's GPU ({src.split(':', 1)[-1]})")
    return lines + [_device_line(g) for g in gpu]


def _rank_words(r: Rank) -> str:
    """``rank 0 pid 12 alive, step 40, n=40 p50=0.512 p99=0.530, loss 2.31``."""
    how = ("alive" if r["alive"] else f"killed by {r['signal']}" if r["signal"]
           else f"exited with code {_fmt(r['returncode'])}")
    rs: RankStepSummary | None = r["steps"]
    if rs is None:
        return f"rank {r['rank']} pid {r['pid']} {how}"
    loss = rank_loss(rs)
    return (f"rank {r['rank']} pid {r['pid']} {how}, step {_fmt(rs['last_step'])}, n={rs['n']} "
            f"p50={_fmt(rs['p50'], 3)} p99={_fmt(rs['p99'], 3)}" + (f", loss {loss:.4g}" if loss is not None else ""))


def _rank_lines(snap: Snapshot) -> list[str]:
    """Each rank's latest process (16 at most) and torchrun's restarts; the straggler verdict."""
    lines = []
    if ranks := latest_per_rank(snap["ranks"]):
        lines.append("  ranks: " + "; ".join(_rank_words(r) for r in ranks[:16])
                     + (f"; {len(ranks) - 16} more" if len(ranks) > 16 else "") + restarts_words(snap["rank_restarts"]))
    sg: Straggler = snap["straggler"]
    if snap["ranks"] and sg["state"] != NOT_JUDGED:
        lines.append(f"  straggler {sg['state']} ({sg['reason']})")
    return lines


def _frozen_lines(snap: Snapshot) -> list[str]:
    liveness: Liveness = snap["liveness"]
    frozen: Frozen = liveness["frozen"]
    return [f"  FROZEN: {frozen['reason']} (held stopped: no progress until SIGCONT)"] if frozen["state"] == FLAGGED else []


def _disk_lines(snap: Snapshot) -> list[str]:
    """The run dir's file system when it is full, the supervisor could not write, or train.log lost output."""
    disk: Disk | None = snap["disk"]
    if disk is None or not (disk["full"] or disk["write_errors"] or disk["log_lost_bytes"]):
        return []
    return ["  disk: " + "; ".join(([full_words(disk)] if disk["full"] else [])
                                  + ([lost_words(disk)] if disk["log_lost_bytes"] else [])
                                  + [f"supervisor: {e}" for e in disk["write_errors"]])]


def _identity_lines(snap: Snapshot) -> list[str]:
    ident = snap["identity"]
    return [f"  commit {_commit(ident)} {tree_words(ident)}"] if ident else []


def _ledger_lines(snap: Snapshot) -> list[str]:
    """Where the run's hours went."""
    return [f"  {lw}"] if (lw := ledger_words(snap["ledger"])) else []


def _restart_lines(snap: Snapshot) -> list[str]:
    """The restart policy's last decision ([restart]) in the tense of the attempt on screen, the run screen's words
    (:func:`~stepwatch.tui.format.restart_words`)."""
    return [f"  {words}"] if (words := restart_words(snap, head="restart")) else []


def _alert_lines(al: Alert) -> list[str]:
    """The alert with its acknowledgement and delivery; the stacks the supervisor took for it."""
    notes = [n for n in ("acknowledged" if al["acknowledged"] else None,
                          "cleared" if al["active"] is False else None) if n]
    delivered = delivery_words(d) if (d := al["delivered"]) is not None else ""
    lines = [f"  ALERT [{al['kind']}] {al['message']}" + (f" ({', '.join(notes)})" if notes else "")
             + (f" [delivery {delivered}]" if delivered else "")]
    if summary := al.get("stacks_summary"):  # where each process of the tree stands (py-spy), grouped
        lines.append(f"    stacks (py-spy): {summary}")
    if stack := al.get("stack"):  # the supervisor's py-spy dump of the rank: each thread, innermost frame first
        lines.append("    stack (py-spy): " + " | ".join(ln.strip() for ln in (stack_frames(stack) or ["-"])))
    return lines


def _alerts_lines(snap: Snapshot) -> list[str]:
    return [ln for al in snap["alerts"] for ln in _alert_lines(al)]


def _survivor_lines(snap: Snapshot) -> list[str]:
    """The ended run's processes still alive, and how to kill them."""
    survivors: list[Survivor] = snap["survivors"]
    if not survivors:
        return []
    return [f"  {len(survivors)} process(es) of the ended run survive (they may hold GPU memory): "
            + ", ".join(f"{p['pid']} ({p['name']})" for p in survivors[:10])
            + f"; kill them with: stepwatch stop {snap['run_dir']} --survivors"]


#: ``status``'s lines, one function per part of the snapshot, in the order they print.
_PARTS: tuple[Callable[[Snapshot], list[str]], ...] = (
    _run_lines, _scheduler_lines, _watcher_lines, _step_lines, _log_lines, _health_lines, _cost_lines,
    _verdict_lines, _dynamo_lines, _build_lines, _gpu_lines, _rank_lines, _frozen_lines, _disk_lines,
    _identity_lines, _ledger_lines, _restart_lines, _alerts_lines, _survivor_lines)


def status_lines(snap: Snapshot) -> list[str]:
    """A few readable lines with the same content as ``status --json``; each one line (what a run's
    files say is shown with its line breaks visible: tui/safe.py ``one_line``)."""
    # a line break read from a run file never starts a line of its own
    return [one_line(ln) for part in _PARTS for ln in part(snap)]


class Narrator:
    """Turns successive snapshots into event lines (plain text or JSON objects)."""

    def __init__(self, out: TextIO, as_json: bool, every_n_steps: int):
        self.out, self.as_json, self.every = out, as_json, max(1, every_n_steps)
        self.attempt: Any = None
        self.last_step_printed: int | None = None
        self.alerts_seen: set[str] = set()
        self.ended_printed = False

    def emit(self, kind: str, text: str, **data: Any) -> None:
        now = utc_iso(time.time())
        if self.as_json:
            self.out.write(json.dumps(json_safe({"at": now, "kind": kind, "message": text, **data}),
                                      allow_nan=False, default=str) + "\n")
        else:
            self.out.write(f"{now} {one_line(text)}\n")  # an event is one line, whatever a run file holds
        self.out.flush()

    def feed(self, snap: Snapshot) -> None:
        if snap["attempt"] != self.attempt:
            self.attempt = snap["attempt"]
            self.emit("attempt", f"{snap['run']} attempt {self.attempt}: {snap['state']}, pid {snap['pid']}, "
                                 f"commit {_commit(snap['identity'])}",
                      attempt=self.attempt, pid=snap["pid"])
            self.last_step_printed, self.ended_printed = None, False
        step: Step = snap["step"]
        gs = step["global_step"]
        if gs is not None and (self.last_step_printed is None or gs >= self.last_step_printed + self.every):
            self.last_step_printed = gs - gs % self.every if gs >= self.every else gs
            mx = step["max_steps"]
            self.emit("step", f"step {gs}/{mx or '?'} {snap['step_line'] or ''}", step=gs,
                      step_seconds=snap["step_seconds"])
        alerts: list[Alert] = snap["alerts"]
        for al in alerts:
            if al["id"] not in self.alerts_seen:
                self.alerts_seen.add(al["id"])
                self.emit("alert", f"ALERT [{al['kind']}] {al['message']}", alert=al)
        if run_ended(snap) and not self.ended_printed:
            self.ended_printed = True
            self.emit("exit", f"{snap['run']} {end_words(snap)}; {snap['step_line'] or ''}",
                      returncode=snap["returncode"], signal=snap["signal"])


def outcome_code(snap: Snapshot) -> int:
    """0 when the run exited 0 or was stopped because the operator asked (``stepwatch stop``), else 1."""
    if snap["state"] != EXITED:
        return 1
    ended: Ended | None = snap["ended"]
    if ended is not None and ended["stop_requested"]:
        return 0
    return 0 if snap["returncode"] == 0 else 1


def watch(run_dir: Path, as_json: bool = False, every_n_steps: int = 10, out: TextIO | None = None,
          poll_s: float = 0.5, should_stop: Callable[[], bool] | None = None) -> int:
    """Follow ``run_dir`` until its process ends; print events; return the outcome code.

    Death is noticed at once through a pidfd on the captured pid (and the ``kill -0`` poll every
    ``poll_s`` seconds); the exit record is then given up to 3 s to appear.
    """
    out = cast(TextIO, out or sys.stdout)
    obs = RunObserver(run_dir)
    nar = Narrator(out, as_json, every_n_steps)
    while True:
        snap = obs.refresh()
        ended = run_ended(snap)
        if ended and snap["state"] == UNKNOWN:  # the supervisor may be writing exit.json right now
            deadline = time.monotonic() + 3.0
            while snap["state"] == UNKNOWN and time.monotonic() < deadline:
                time.sleep(0.05)
                snap = obs.refresh()
        nar.feed(snap)
        if ended:
            return outcome_code(snap)
        if should_stop is not None and should_stop():
            return outcome_code(snap)
        ref = ProcessRef(pid, None) if (pid := snap["pid"]) else None
        if ref is not None:
            wait_for_exit(ref, timeout_s=poll_s, poll_s=poll_s)
        else:
            time.sleep(poll_s)


def launch_lines(res: Any, verb: str) -> tuple[list[str], list[str]]:
    """What ``launch`` / ``relaunch`` print (stdout lines) and warn (stderr) about a LaunchResult:
    the checklist, the rotations, the attempt (its pid, or the Slurm job it was submitted as)."""
    from stepwatch.launcher.preflight import format_checklist_json  # noqa: PLC0415

    out = list(format_checklist_json(res.run.get("preflight") or {}))
    out += [f"rotated {a.name} -> {b.name}" for a, b in res.rotated]
    ident = res.run.get("identity") or {}  # not a snapshot read: run.json
    job = (res.run.get("scheduler") or {}).get("job_id")  # not a snapshot read: run.json
    where = f"submitted as Slurm job {job} (the supervisor starts with it)" if job else f"pid {res.pid}"
    commit = (ident.get("harness_commit") or "none")[:12]  # not a snapshot read: run.json
    dirty = " (dirty)" if ident.get("harness_dirty_at_launch") else ""  # not a snapshot read: run.json
    out += [f"{verb} {res.run_dir.name} attempt {res.attempt}: {where}, commit {commit}{dirty}",
            f"  run dir: {res.run_dir}", f"  log:     {res.run_dir / 'train.log'}",
            f"  watch:   stepwatch watch {res.run_dir} --plain"]
    return out, list(res.warnings)


def describe_end(ex: dict | None) -> str:
    """``exited with code 3 after 1.2 s`` / ``stopped as requested: ended by SIGINT after ...`` (exit.json)."""
    if ex is None:
        return "ended, status unknown (no exit.json)"
    # exit.json as read: any JSON, a key may be missing (the snapshot's ``ended`` is not this)
    stop, sig, rc, dur = (ex.get(k) for k in ("stop_requested", "signal", "returncode", "duration_s"))
    asked = "stopped as requested: " if stop else ""
    if sig:
        return f"{asked}ended by {sig} after {dur} s"
    return f"{asked}exited with code {rc} after {dur} s"


def stop_lines(run_dir: Path, out: Any) -> tuple[list[str], bool]:
    """What ``stop`` prints once it waited (a StopOutcome), and whether the run has not ended (exit 1;
    the last line then goes to stderr)."""
    sent = [s["signal"] for s in (out.stop or {}).get("signals", [])]  # not a snapshot read: the stop's outcome
    queued = ((out.stop or {}).get("ended_by") or {}).get("job_cancelled_while")
    if queued:
        job = (out.stop["signals"][0] or {}).get("job_id")  # not a snapshot read: the stop's outcome
        return [f"{run_dir.name}: Slurm job {job} cancelled while {queued}; nothing had started"], False
    lines = [f"signals sent: {', '.join(sent) or 'none'}"]
    if out.supervisor_gone:
        lines.append(f"note: the supervisor of {run_dir.name} was gone, so this command escalated itself")
    if out.exit is None and out.ended:
        return [*lines, f"{run_dir.name} ended after {sent[-1] if sent else 'the stop'}; exit status unknown "
                        "(the supervisor was gone)"], False
    if out.exit is None:
        return [*lines, f"{run_dir.name} has not ended yet; the supervisor keeps escalating"], True
    return [*lines, f"{run_dir.name} {describe_end(out.exit)}"], False


#: The outcomes ``status`` gives with their reason: why a page failed, or why it was shown and not paged.
REASONED_OUTCOMES = ("failed", "pending", "not_confirmed", "same_cause", "quiet_hours", "digested", "not_asked")


def delivery_words(delivered: Mapping[str, Delivery]) -> str:
    """Each channel by name with its last outcome, a failure or a page held back with its reason; the channels that
    read the same are named together (``ntfy://ntfy.sh, command: delivered; json://127.0.0.1: failed (…)``)."""
    def one(d: Delivery) -> str:
        outcome = str(d["outcome"] or "not recorded")  # as alerts.jsonl recorded it: shown as text
        return outcome + (f" ({str(d['detail'])[:200]})" if outcome in REASONED_OUTCOMES and d["detail"] else "")
    by_words: dict[str, list[str]] = {}
    for ch, d in delivered.items():
        by_words.setdefault(one(d), []).append(ch)
    return "; ".join(f"{', '.join(chs)}: {w}" for w, chs in by_words.items())
