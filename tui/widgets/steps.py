"""The step-time panel: the canonical summary line, a histogram of step durations (counts per bin,
never a max-per-bucket summary, which would hide a second mode), recent steps over time,
throughput, and the fallback / stall / warm-up states in words."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from stepwatch.monitors.snapshot.metrics import metrics_words
from stepwatch.monitors.snapshot.ranks import latest_per_rank, restarts_words
from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.monitors.states import FLAGGED, NOT_JUDGED, OK, RUNNING, STALLED, SUSPECTED, WARMING
from stepwatch.tui.format import liveness_words, phase_words, rank_loss, scaling_words, secs, streams_words, timing_words
from stepwatch.tui.widgets.base import Panel


def _verdict_text(snap: Snapshot) -> Text:
    fb, st, wu = snap.get("fallback") or {}, snap.get("stall") or {}, snap.get("warmup") or {}
    t = Text()
    state = fb.get("state") or NOT_JUDGED
    style = {OK: "green", SUSPECTED: "yellow", FLAGGED: "bold red"}.get(state, "dim")
    t.append(f"fallback {state.upper()}", style)
    if fb.get("reason") and state != OK:
        t.append(f" ({str(fb['reason']).removeprefix(f'{state}: ')})", style)  # the state is said once
    t.append("  ")
    if st.get("state") == STALLED:
        t.append(f"STALLED {secs(st.get('current_step_elapsed_s'))} s in the current step", "bold red")
    elif st.get("state") == OK:
        t.append("no stall", "green")
    elif st.get("state") == SUSPECTED:  # busy but silent: shown, not paged
        t.append(f"stall SUSPECTED ({st.get('reason')})", "yellow")
    elif snap.get("state") != RUNNING:
        t.append("stall: run ended", "dim")
    else:
        t.append(f"stall not judged ({st.get('reason') or 'no step times'})", "dim")
    if wu.get("state") == WARMING:
        t.append("  warming up", "yellow")
    if snap.get("state") == RUNNING and (pw := phase_words(snap.get("phase"))):
        t.append(f"  {pw}", "dim")
    if snap.get("state") == RUNNING and (lw := liveness_words(snap.get("liveness"))):
        t.append(f"  {lw}", "dim")
    return t


def ranks_text(snap: Snapshot) -> Text:
    """``ranks  0 pid 812 step 30 p50 0.050 s | 1 pid 813 step 30 p50 0.251 s STRAGGLER`` (plain text)."""
    sg = snap.get("straggler") or {}
    t = Text("ranks ", "dim")
    for i, r in enumerate(latest_per_rank(snap.get("ranks") or [])):
        if i:
            t.append(" | ", "dim")
        st = r.get("steps") or {}
        t.append(f"{r['rank']} pid {r.get('pid') or '-'}")
        if st:
            t.append(f" step {st.get('last_step') if st.get('last_step') is not None else '-'} p50 {secs(st.get('p50'))} s")
            if (loss := rank_loss(st)) is not None:  # the rank's own, behind its prefix
                t.append(f" loss {loss:.4g}")
        if r.get("alive") is False:
            how = f"killed by {r['signal']}" if r.get("signal") else f"exit {r.get('returncode')}"
            t.append(f" {how}", "bold red" if r.get("signal") or r.get("returncode") else "dim")
        if sg.get("state") == FLAGGED and sg.get("rank") == r["rank"]:
            t.append(" STRAGGLER", "bold yellow")
    t.append(restarts_words(snap.get("rank_restarts")), "yellow")
    return t


LOSS_NAMES_PLOTTED = ("loss", "train_loss", "eval_loss", "val_loss")


class StepPanel(Panel):
    """Step statistics of the attached attempt, and the run's loss over its steps.

    ``log_scale``: the loss plot in log10 (``g`` on the run screen)."""

    log_scale = False

    def _loss_plot(self, series: dict[str, Any]) -> None:
        name = next((n for n in LOSS_NAMES_PLOTTED if series.get(n)), None)
        col = self.query_one("#loss-col")
        col.display = name is not None
        if name is None:
            return
        bins = [b for b in series[name] if b[3] is not None]  # [first_step, last_step, min, max]
        key = (name, len(series[name]), series[name][-1][1], series[name][-1][3], self.log_scale)
        if not bins or key == getattr(self, "_loss_key", None):
            return  # unchanged: nothing is sent to the terminal
        self._loss_key = key
        his = [b[3] for b in bins]
        scale = self.log_scale and min(his) > 0
        self.query_one("#loss-plot", Sparkline).data = [math.log10(v) for v in his] if scale else his
        self._set("#loss-title", f"{name} over steps{' (log)' if scale else ''}")
        lo, hi = min(b[2] for b in bins), max(his)
        self._set("#loss-axis", f"steps {bins[0][0]}..{bins[-1][1]}, {lo:.3g}..{hi:.3g}")

    def compose(self) -> ComposeResult:
        yield Static("n=0 seconds_per_optimizer_step", id="step-line")
        yield Static("", id="step-verdict")
        with Horizontal(classes="plots"):
            with Vertical():
                yield Static("step-time histogram (log count/bin)", classes="dim")
                yield Sparkline([], id="hist")
                yield Static("", id="hist-axis", classes="dim")
            with Vertical():
                yield Static("recent steps over time (s)", classes="dim")
                yield Sparkline([], id="recent")
                yield Static("", id="recent-axis", classes="dim")
            with Vertical(id="loss-col"):
                yield Static("loss over steps", id="loss-title", classes="dim")
                yield Sparkline([], id="loss-plot")  # max per bin: a spike is never averaged away
                yield Static("", id="loss-axis", classes="dim")
        yield Static("", id="throughput", classes="dim")
        yield Static("", id="ranks")

    def show(self, snap: Snapshot, plots: bool = True) -> None:
        ss = snap.get("step_seconds") or {}
        line = snap.get("step_line") or "n=0 seconds_per_optimizer_step"
        if ss.get("last") is not None:
            line += f"  p90={secs(ss.get('p90'))} last={secs(ss['last'])}"
        words = timing_words(snap)
        log = snap.get("log") or {}
        fmt = log.get("format") if (snap.get("step") or {}).get("source") == "log" else None
        if fmt:  # the recogniser in force and how many of the log's lines it read
            fmt = f"{fmt}, {log.get('matched_lines') or 0} lines"
        if words or fmt:
            line += f"  ({', '.join(w for w in (words, f'log read as {fmt}' if fmt else None) if w)})"
        self._set("#step-line", Text(line))  # never markup
        self._set("#step-verdict", _verdict_text(snap))
        tp = snap.get("throughput") or {}
        words = metrics_words(snap.get("metrics") or {})
        tp_line = Text(f"{words}  · " if words else "", "bold red" if "NaN/inf" in words else "bold")
        if tp.get("tokens_per_s") is not None:
            tp_line.append(f"{tp['tokens_per_s']:.0f} tok/s padded, {tp.get('real_tokens_per_s') or 0:.0f} real, "
                           f"padding {100 * (tp.get('padding_share') or 0):.1f}%")
        else:
            tp_line.append("tokens/s: unknown (the job reports no token counts per step)")
        if (snap.get("scaling") or {}).get("steps"):  # the batch shapes are known: the fit's verdict
            tp_line.append(f"  · {scaling_words(snap['scaling']).removeprefix('scaling: ')}")
        if (snap.get("log") or {}).get("hint"):
            tp_line = Text(f"HINT: {snap['log']['hint']}", "bold yellow")
        elif sw := streams_words(snap.get("log") or {}):  # a line of its own: the step line is cut at 80 columns
            tp_line = Text(f"NOTE: {sw}", "bold yellow")
        self._set("#throughput", tp_line)
        ranks = self.query_one("#ranks", Static)
        ranks.display = bool(snap.get("ranks"))
        if snap.get("ranks"):
            self._set("#ranks", ranks_text(snap))
        if plots:
            hist = snap.get("histogram") or {}
            counts = hist.get("counts") or []
            edges = hist.get("edges_s") or []
            if counts != getattr(self, "_counts", None):
                self._counts = counts
                # log(1 + count): 3 eager steps beside 1,000 compiled ones still show as a bump
                self.query_one("#hist", Sparkline).data = [math.log1p(c) for c in counts]
            if edges:
                self._set("#hist-axis", f"{secs(edges[0])} s {'·' * 6} {secs(edges[-1])} s  (log bins)")
            self._loss_plot(snap.get("metrics_series") or {})
            recent = snap.get("recent_dt") or []
            if recent != getattr(self, "_recent", None):
                self._recent = recent
                self.query_one("#recent", Sparkline).data = recent
                if recent:
                    self._set("#recent-axis", f"last {len(recent)} steps, {secs(min(recent))}..{secs(max(recent))} s")
