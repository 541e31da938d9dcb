"""The step-time panel: the canonical summary line, a histogram of step durations (counts per bin,
never a max-per-bucket summary, which would hide a second mode), recent steps over time,
throughput, and the fallback / stall / warm-up states in words."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from stepwatch.monitors.snapshot.metrics import loss_health_words, metrics_words
from stepwatch.monitors.snapshot.ranks import latest_per_rank, restarts_words
from stepwatch.monitors.snapshot.types import (Fallback, Histogram, Log, Rank, RankStepSummary, Scaling, Snapshot, Stall,
                                              Step, StepSeconds, Straggler, Throughput, Warmup)
from stepwatch.monitors.states import FLAGGED, OK, RUNNING, STALLED, SUSPECTED, WARMING
from stepwatch.tui.format import liveness_words, phase_words, rank_loss, scaling_words, secs, streams_words, timing_words
from stepwatch.tui.widgets.base import Panel


_FALLBACK_STYLE = {OK: "green", SUSPECTED: "yellow", FLAGGED: "bold red"}


def _stall_words(st: Stall, running: bool) -> tuple[str, str]:
    """The stall verdict's words and their style."""
    if st["state"] == STALLED:
        return f"STALLED {secs(st['current_step_elapsed_s'])} s in the current step", "bold red"
    if st["state"] == OK:
        return "no stall", "green"
    if st["state"] == SUSPECTED:  # busy but silent: shown, not paged
        return f"stall SUSPECTED ({st['reason']})", "yellow"
    if not running:
        return "stall: run ended", "dim"
    return f"stall not judged ({st['reason'] or 'no step times'})", "dim"


def _verdict_text(snap: Snapshot) -> Text:
    fb: Fallback = snap["fallback"]
    warmup: Warmup = snap["warmup"]
    running = snap["state"] == RUNNING
    t = Text()
    state = fb["state"]
    style = _FALLBACK_STYLE.get(state, "dim")
    t.append(f"fallback {state.upper()}", style)
    if (reason := fb["reason"]) and state != OK:
        t.append(f" ({reason.removeprefix(f'{state}: ')})", style)  # the state is said once
    t.append("  ")
    t.append(*_stall_words(snap["stall"], running))
    if warmup["state"] == WARMING:
        t.append("  warming up", "yellow")
    if running and (pw := phase_words(snap["phase"])):
        t.append(f"  {pw}", "dim")
    if running and (lw := liveness_words(snap["liveness"])):
        t.append(f"  {lw}", "dim")
    return t


def _rank_text(r: Rank, straggler: Straggler) -> Text:
    """``1 pid 813 step 30 p50 0.251 s STRAGGLER``: one rank's part of the ranks line."""
    st: RankStepSummary | None
    t = Text(f"{r['rank']} pid {r['pid'] or '-'}")
    if (st := r["steps"]) is not None:
        t.append(f" step {st['last_step'] if st['last_step'] is not None else '-'} p50 {secs(st['p50'])} s")
        if (loss := rank_loss(st)) is not None:  # the rank's own, behind its prefix
            t.append(f" loss {loss:.4g}")
    if r["alive"] is False:
        how = f"killed by {r['signal']}" if r["signal"] else f"exit {r['returncode']}"
        t.append(f" {how}", "bold red" if r["signal"] or r["returncode"] else "dim")
    if straggler["state"] == FLAGGED and straggler["rank"] == r["rank"]:
        t.append(" STRAGGLER", "bold yellow")
    return t


def ranks_text(snap: Snapshot) -> Text:
    """``ranks  0 pid 812 step 30 p50 0.050 s | 1 pid 813 step 30 p50 0.251 s STRAGGLER`` (plain text)."""
    t = Text("ranks ", "dim")
    for i, r in enumerate(latest_per_rank(snap["ranks"])):
        if i:
            t.append(" | ", "dim")
        t.append_text(_rank_text(r, snap["straggler"]))
    t.append(restarts_words(snap["rank_restarts"]), "yellow")
    return t


def _step_line(snap: Snapshot) -> str:
    """The canonical summary line, with p90 and the last step, and how the step times were taken."""
    ss: StepSeconds = snap["step_seconds"]
    log: Log = snap["log"]
    step: Step = snap["step"]
    line = snap["step_line"]
    if ss["last"] is not None:
        line += f"  p90={secs(ss['p90'])} last={secs(ss['last'])}"
    words = timing_words(snap)
    fmt = log["format"] if step["source"] == "log" else None
    if fmt:  # the recogniser in force and how many of the log's lines it read
        fmt = f"{fmt}, {log['matched_lines']} lines"
    if words or fmt:
        line += f"  ({', '.join(w for w in (words, f'log read as {fmt}' if fmt else None) if w)})"
    return line


def _throughput_text(snap: Snapshot) -> Text:
    """The latest metrics, tokens/s and the batch-shape fit; or the log's hint, or its interleaved bars, instead."""
    log: Log = snap["log"]
    if log["hint"]:
        return Text(f"HINT: {log['hint']}", "bold yellow")
    if sw := streams_words(log):  # a line of its own: the step line is cut at 80 columns
        return Text(f"NOTE: {sw}", "bold yellow")
    tp: Throughput = snap["throughput"]
    sc: Scaling = snap["scaling"]
    words = metrics_words(snap["metrics"])
    t = Text(f"{words}  · " if words else "", "bold red" if "NaN/inf" in words else "bold")
    if snap["loss_health"]["episode"] is not None:  # the loss went bad: said first, where it is cut last
        t = Text(f"{loss_health_words(snap['loss_health'])}  · ", "bold red") + t
    if tp["tokens_per_s"] is not None:
        t.append(f"{tp['tokens_per_s']:.0f} tok/s padded, {tp['real_tokens_per_s'] or 0:.0f} real, "
                 f"padding {100 * (tp['padding_share'] or 0):.1f}%")
    else:
        t.append("tokens/s: unknown (the job reports no token counts per step)")
    if sc["steps"]:  # the batch shapes are known: the fit's verdict
        t.append(f"  · {scaling_words(sc).removeprefix('scaling: ')}")
    return t


LOSS_NAMES_PLOTTED = ("loss", "train_loss", "eval_loss", "val_loss")


class StepPanel(Panel):
    """Step statistics of the attached attempt, and the run's loss over its steps.

    ``log_scale``: the loss plot in log10 (``g`` on the run screen)."""

    log_scale = False

    def _loss_plot(self, series: dict[str, list[list[float | int | None]]]) -> None:
        name = next((n for n in LOSS_NAMES_PLOTTED if series.get(n)), None)  # series: keyed by the log's names
        col = self.query_one("#loss-col")
        col.display = name is not None
        if name is None:
            return
        rows = series[name]  # [first_step, last_step, min, max]: a bin of NaN/inf only has null min and max
        bins = [(b[0], b[1], lo, hi) for b in rows if (hi := b[3]) is not None and (lo := b[2]) is not None]
        key = (name, len(rows), rows[-1][1], rows[-1][3], self.log_scale)
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
        self._set("#step-line", Text(_step_line(snap)))  # never markup
        self._set("#step-verdict", _verdict_text(snap))
        self._set("#throughput", _throughput_text(snap))
        ranks = self.query_one("#ranks", Static)
        ranks.display = bool(snap["ranks"])
        if snap["ranks"]:
            self._set("#ranks", ranks_text(snap))
        if plots:
            self._show_plots(snap)

    def _show_plots(self, snap: Snapshot) -> None:
        """The histogram, the loss over steps and the recent steps, each sent only when it changed."""
        hg: Histogram = snap["histogram"]
        counts, edges = hg["counts"], hg["edges_s"]
        if counts != getattr(self, "_counts", None):
            self._counts = counts
            # log(1 + count): 3 eager steps beside 1,000 compiled ones still show as a bump
            self.query_one("#hist", Sparkline).data = [math.log1p(c) for c in counts]
        if edges:
            self._set("#hist-axis", f"{secs(edges[0])} s {'·' * 6} {secs(edges[-1])} s  (log bins)")
        self._loss_plot(snap["metrics_series"])
        recent = snap["recent_dt"]
        if recent != getattr(self, "_recent", None):
            self._recent = recent
            self.query_one("#recent", Sparkline).data = recent
            if recent:
                self._set("#recent-axis", f"last {len(recent)} steps, {secs(min(recent))}..{secs(max(recent))} s")
