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
                                  padding_words, scaling_words, scheduler_words, supervisor_gone, timing_words,
                                  tree_words, versions_words)
from stepwatch.monitors.snapshot.model import json_safe, run_ended
from stepwatch.monitors.snapshot.metrics import metrics_words
from stepwatch.monitors.snapshot.ranks import latest_per_rank, restarts_words
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.monitors.states import (EXITED, FLAGGED, HELD, NOT_JUDGED, OK, RUNNING, STALLED, SUSPECTED, UNKNOWN,
                                      UNWATCHED, WARDED)
from stepwatch.monitors.watchdog import ProcessRef, wait_for_exit
from stepwatch.tui.safe import one_line


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def status_lines(snap: Snapshot) -> list[str]:
    """A few readable lines with the same content as ``status --json``; each one line (what a run's
    files say is shown with its line breaks visible: tui/safe.py ``one_line``)."""
    step = snap.get("step") or {}
    lines = [f"{snap['run']} attempt {snap.get('attempt') or '-'}: {snap['state']}"
             + (f", pid {snap['pid']}" if snap.get("pid") else "")
             + (f" ({end_words(snap)})" if run_ended(snap) else "")]
    if snap.get("scheduler"):
        lines.append(f"  {scheduler_words(snap['scheduler'])}")
    if supervisor_gone(snap):
        lines.append("  WARNING: the supervisor is gone (killed?): the run goes on, but no exit code will be recorded "
                     "and `stop` will escalate from the command line itself")
    if (watch := snap.get("watch") or {}).get("state") in (HELD, WARDED, UNWATCHED):  # who still watches it, if anyone
        lines.append(f"  WARNING: {watch.get('reason')}")
    e = snap.get("eta") or {}
    eta = (f", ETA {eta_words(e)}: {e.get('remaining_steps')} steps at {_fmt(e.get('seconds_per_step'), 3)} s "
           f"({e.get('basis')})" if e.get("state") in (OK, STALLED) else "")
    src = f" (from {step['source']})" if step.get("source") else ""
    lines.append(f"  step {_fmt(step.get('global_step'))}/{_fmt(step.get('max_steps'))}{src}{eta}")
    words = timing_words(snap)
    lines.append(f"  {snap.get('step_line') or 'n=0 seconds_per_optimizer_step'}" + (f" ({words})" if words else ""))
    log = snap.get("log") or {}
    mw = metrics_words(snap.get("metrics") or {})
    lines.append(f"  log: {mw or 'no loss or other metric read'}; format "
                 + (f"{log['format']} ({log.get('matched_lines')} lines)" if log.get("format") else "not recognised"))
    if log.get("hint"):
        lines.append(f"  HINT: {log['hint']}")
    if sw := streams_words(log):
        lines.append(f"  NOTE: {sw}")
    lines.append(f"  {health_words(snap)}")
    lines.append("  " + "; ".join(w for w in (scaling_words(snap.get("scaling")), padding_words(snap.get("padding")),
                                              energy_words(snap.get("energy"), replayed(snap))) if w))
    fb, st = snap.get("fallback") or {}, snap.get("stall") or {}
    stall = st.get("state")
    pw = phase_words(snap.get("phase")) if snap.get("state") == RUNNING else None
    lines.append(f"  fallback {fb.get('state')}" + (f" ({fb['reason']})" if fb.get("reason") and fb.get("state") != OK else "")
                 + f"; stall {stall}" + (f" ({_fmt(st.get('current_step_elapsed_s'), 1)} s)" if stall == STALLED
                                         else f" ({st['reason']})" if stall in (NOT_JUDGED, SUSPECTED) and st.get("reason")
                                         else "")
                 + (f"; phase {pw}" if pw else "")
                 + (f"; {lw}" if snap.get("state") == RUNNING and (lw := liveness_words(snap.get("liveness"))) else ""))
    d = snap.get("dynamo") or {}
    if no_dynamo_output(d):
        lines.append("  " + NO_DYNAMO_WORDS)
    else:
        u = {k: "unknown" if d.get(k) is None else d[k] for k in ("recompiles", "graph_breaks", "recompile_limit_hits")}
        lines.append(f"  dynamo: recompiles {u['recompiles']}, graph breaks {u['graph_breaks']}, "
                     f"recompile-limit hits {u['recompile_limit_hits']} (from {d.get('source') or '-'})")
    a, v = snap.get("attn_implementation") or {}, snap.get("versions") or {}
    lines.append(f"  {attention_words(a)[0]}; {versions_words(v)}")
    if gpu := snap.get("gpu"):
        src = snap.get("gpu_source") or ""
        if src.startswith("recorded"):
            lines.append(f"  GPU: RECORDED replay, not this machine's GPU ({src.split(':', 1)[-1]})")
        for g in gpu:
            held = f" (the run's rank {', '.join(map(str, run_ranks))})" if (run_ranks := g.get("run_ranks")) else ""
            lines.append(f"  GPU{g.get('index')} {g.get('name')}{held}: kernel-active {_fmt(g.get('util_pct'), 0)}%, "
                         f"power {_fmt(g.get('power_w'), 0)}/{_fmt(g.get('power_limit_w'), 0)} W"
                         + (f"; over the last 30 s: {g['verdict']}" if g.get("verdict") else ""))
    else:
        lines.append(f"  GPU: {snap.get('gpu_error') or 'no samples'}")
    ranks = latest_per_rank(snap.get("ranks") or [])
    if ranks:
        lines.append("  ranks: " + "; ".join(
            f"rank {r['rank']} pid {r['pid']} " + ("alive" if r["alive"] else f"killed by {r['signal']}" if r["signal"]
                                                   else f"exited with code {_fmt(r['returncode'])}")
            + (f", step {_fmt(rs['last_step'])}, n={rs['n']} p50={_fmt(rs['p50'], 3)} "
               f"p99={_fmt(rs['p99'], 3)}" + (f", loss {loss:.4g}" if (loss := rank_loss(rs)) is not None else "")
               if (rs := r.get("steps")) else "")
            for r in ranks[:16]) + (f"; {len(ranks) - 16} more" if len(ranks) > 16 else "")
            + restarts_words(snap.get("rank_restarts")))
    sg = snap.get("straggler") or {}
    if snap.get("ranks") and sg.get("state") != NOT_JUDGED:
        lines.append(f"  straggler {sg.get('state')} ({sg.get('reason')})")
    frozen = (snap.get("liveness") or {}).get("frozen") or {}
    if frozen.get("state") == FLAGGED:
        lines.append(f"  FROZEN: {frozen.get('reason')} (held stopped: no progress until SIGCONT)")
    disk = snap.get("disk") or {}
    if disk.get("full") or disk.get("write_errors") or disk.get("log_lost_bytes"):
        lines.append("  disk: " + "; ".join(
            ([full_words(disk)] if disk.get("full") else [])
            + ([lost_words(disk)] if disk.get("log_lost_bytes") else [])
            + [f"supervisor: {e}" for e in disk.get("write_errors") or []]))
    ident = snap.get("identity") or {}
    if ident:
        lines.append(f"  commit {(ident.get('harness_commit') or 'none')[:12]} {tree_words(ident)}")
    if lw := ledger_words(snap.get("ledger")):  # where the run's hours went
        lines.append(f"  {lw}")
    if rs := snap.get("restart"):  # the restart policy's last decision ([restart]), as its page said it
        lines.append(f"  restart ({rs['mode']}, after attempt {rs['attempt']}): {rs['verdict']}: {rs['words']}")
    for al in snap.get("alerts") or []:
        notes = [n for n in ("acknowledged" if al.get("acknowledged") else None,
                              "cleared" if al.get("active") is False else None) if n]
        delivered = delivery_words(al.get("delivered") or {})
        lines.append(f"  ALERT [{al['kind']}] {al['message']}" + (f" ({', '.join(notes)})" if notes else "")
                     + (f" [delivery {delivered}]" if delivered else ""))
        if summary := al.get("stacks_summary"):  # where each process of the tree stands (py-spy), grouped
            lines.append(f"    stacks (py-spy): {summary}")
        if stack := al.get("stack"):  # the supervisor's py-spy dump of the rank: each thread, innermost frame first
            lines.append("    stack (py-spy): " + " | ".join(ln.strip() for ln in (stack_frames(stack) or ["-"])))
    if snap.get("survivors"):
        lines.append(f"  {len(snap['survivors'])} process(es) of the ended run survive (they may hold GPU memory): "
                     + ", ".join(f"{p['pid']} ({p['name']})" for p in snap["survivors"][:10])
                     + f"; kill them with: stepwatch stop {snap['run_dir']} --survivors")
    return [one_line(ln) for ln in lines]  # a line break read from a run file never starts a line of its own


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
        if snap.get("attempt") != self.attempt:
            self.attempt = snap.get("attempt")
            ident = snap.get("identity") or {}
            self.emit("attempt", f"{snap['run']} attempt {self.attempt}: {snap['state']}, pid {snap.get('pid')}, "
                                 f"commit {(ident.get('harness_commit') or 'none')[:12]}",
                      attempt=self.attempt, pid=snap.get("pid"))
            self.last_step_printed, self.ended_printed = None, False
        gs = (snap.get("step") or {}).get("global_step")
        if gs is not None and (self.last_step_printed is None or gs >= self.last_step_printed + self.every):
            self.last_step_printed = gs - gs % self.every if gs >= self.every else gs
            mx = (snap.get("step") or {}).get("max_steps")
            self.emit("step", f"step {gs}/{mx or '?'} {snap.get('step_line') or ''}", step=gs,
                      step_seconds=snap.get("step_seconds"))
        for al in snap.get("alerts") or []:
            if al["id"] not in self.alerts_seen:
                self.alerts_seen.add(al["id"])
                self.emit("alert", f"ALERT [{al['kind']}] {al['message']}", alert=al)
        if run_ended(snap) and not self.ended_printed:
            self.ended_printed = True
            self.emit("exit", f"{snap['run']} {end_words(snap)}; {snap.get('step_line') or ''}",
                      returncode=snap.get("returncode"), signal=snap.get("signal"))


def outcome_code(snap: Snapshot) -> int:
    """0 when the run exited 0 or was stopped because the operator asked (``stepwatch stop``), else 1."""
    if snap.get("state") == EXITED and (snap.get("ended") or {}).get("stop_requested"):
        return 0
    return 0 if snap.get("state") == EXITED and snap.get("returncode") == 0 else 1


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
        ref = ProcessRef(pid, None) if (pid := snap.get("pid")) else None
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
    ident = res.run.get("identity") or {}
    job = (res.run.get("scheduler") or {}).get("job_id")
    where = f"submitted as Slurm job {job} (the supervisor starts with it)" if job else f"pid {res.pid}"
    out += [f"{verb} {res.run_dir.name} attempt {res.attempt}: {where}, commit {(ident.get('harness_commit') or 'none')[:12]}"
            f"{' (dirty)' if ident.get('harness_dirty_at_launch') else ''}",
            f"  run dir: {res.run_dir}", f"  log:     {res.run_dir / 'train.log'}",
            f"  watch:   stepwatch watch {res.run_dir} --plain"]
    return out, list(res.warnings)


def describe_end(ex: dict | None) -> str:
    """``exited with code 3 after 1.2 s`` / ``stopped as requested: ended by SIGINT after ...`` (exit.json)."""
    if ex is None:
        return "ended, status unknown (no exit.json)"
    asked = "stopped as requested: " if ex.get("stop_requested") else ""
    if ex.get("signal"):
        return f"{asked}ended by {ex['signal']} after {ex.get('duration_s')} s"
    return f"{asked}exited with code {ex.get('returncode')} after {ex.get('duration_s')} s"


def stop_lines(run_dir: Path, out: Any) -> tuple[list[str], bool]:
    """What ``stop`` prints once it waited (a StopOutcome), and whether the run has not ended (exit 1;
    the last line then goes to stderr)."""
    sent = [s["signal"] for s in (out.stop or {}).get("signals", [])]
    queued = ((out.stop or {}).get("ended_by") or {}).get("job_cancelled_while")
    if queued:
        return [f"{run_dir.name}: Slurm job {(out.stop['signals'][0] or {}).get('job_id')} cancelled while {queued}; "
                "nothing had started"], False
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
REASONED_OUTCOMES = ("failed", "pending", "not_confirmed", "quiet_hours", "digested", "not_asked")


def delivery_words(delivered: Mapping[str, Any]) -> str:
    """Each channel's last outcome, a failure or a page held back with its reason; said once when every
    channel reads the same (``all 3 channels: not_confirmed (cleared before …)``)."""
    def one(d: Any) -> str:
        d = d if isinstance(d, dict) else {}
        outcome = d.get("outcome") or "not recorded"
        return outcome + (f" ({str(d.get('detail'))[:200]})" if outcome in REASONED_OUTCOMES and d.get("detail") else "")
    words = {ch: one(d) for ch, d in delivered.items()}
    if len(words) > 1 and len(set(words.values())) == 1:
        return f"all {len(words)} channels: {next(iter(words.values()))}"
    return "; ".join(f"{ch}: {w}" for ch, w in words.items())
