"""The run header: name, state, pid, elapsed, step k/N, ETA, and the supervisor-gone and restart lines (the alert
banner: tui/widgets/alertbanner.py)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from stepwatch.monitors.snapshot.runmodeltypes import Watch
from stepwatch.monitors.snapshot.types import Ended, Eta, Scheduler, Snapshot, Step
from stepwatch.monitors.states import HELD, RUNNING, UNWATCHED, WARDED
from stepwatch.tui.format import SUPERVISOR_GONE_WORDS, eta_words, hms, restart_words, state_word, supervisor_gone
from stepwatch.tui.safe import safe_text


def _where(snap: Snapshot) -> str:
    """``pid 812``, or for a Slurm run ``job 12 0:41:03 left`` (the time left of its limit)."""
    sch: Scheduler | None
    if (sch := snap["scheduler"]) is None:
        return f"pid {snap['pid'] or '-'}"
    left = sch["time_left_s"]
    return f"job {sch['job_id'] or '-'}" + (f" {hms(left)} left" if left is not None and snap["state"] == RUNNING else "")


def header_text(snap: Snapshot, now: float) -> Text:
    """``run #attempt  STATE  pid  elapsed  step k/N  ETA``: the header's line at ``now`` (a restart's back-off counts
    down: ``RESTARTING in 12 s (attempt 2 from ckpt_200)``, the words ``status`` says)."""
    started = snap["launched_at_unix"]
    end: Ended | None = snap["ended"]
    sch: Scheduler | None = snap["scheduler"]
    ended = end["ended_at_unix"] if end is not None else None
    elapsed = None if started is None else (ended or now) - started
    step: Step = snap["step"]
    eta: Eta = snap["eta"]
    k, n = step["global_step"], step["max_steps"]
    word = state_word(snap, now)
    style = {"RUNNING": "bold green"}.get(word, "bold" if word.startswith("STOPPED") else "bold red" if word.startswith(("KILLED", "EXITED")) and word != "EXITED 0" else "bold yellow")
    t = Text.assemble(
        (f" {snap['run']} ", "bold"), (f"#{snap['attempt'] or '-'} ", "dim"), (f" {word} ", style),
        f" {_where(snap)} {hms(elapsed)} step {k if k is not None else '-'}/{n or '?'}",
        f" ETA {eta_words(eta)}",
    )
    eta_s, left = eta["eta_s"], sch["time_left_s"] if sch is not None else None
    if eta_s is not None and left is not None and eta_s > left:
        t.append(" past the time limit", "bold red")  # the time_limit alert says how far
    return t


class RunHeader(Static):
    """One line: ``run  STATE  pid  elapsed  step k/N  ETA``. Updated only when its text changes."""

    def show(self, snap: Snapshot, now: float | None = None) -> None:
        t = header_text(snap, time.time() if now is None else now)
        if t.plain != getattr(self, "_last", None):
            self._last = t.plain
            self.update(safe_text(t))


class SupervisorGone(Static):
    """Under the header while the run runs and its supervisor is gone or held stopped (``status`` warns the same):
    nobody will record the run's exit status; in red (``.unwatched``) when none of its wardens lives either.
    Hidden otherwise; updated only when it changes."""

    def show(self, snap: Snapshot) -> None:
        watch: Watch = snap["watch"]
        told = watch["state"] in (HELD, WARDED, UNWATCHED)  # who still watches it: its words, in red when nobody
        words = watch["reason"] if told else SUPERVISOR_GONE_WORDS if supervisor_gone(snap) else None
        if words is not None and getattr(self, "_last", None) != words:
            self._last = words
            self.update(safe_text(words))
        self.set_class(watch["state"] == UNWATCHED, "unwatched")
        self.display = words is not None


class RestartLine(Static):
    """Under the header once the restart policy decided (``[restart]``; the snapshot's ``restart``), in the tense of
    the attempt on screen (:func:`~stepwatch.tui.format.restart_words`: the back-off counting down, the attempt the
    policy started, the decision on the attempt that ended); hidden otherwise, updated only when it changes."""

    def show(self, snap: Snapshot, now: float | None = None) -> None:
        words = restart_words(snap, now)
        if words and words != getattr(self, "_last", None):
            self._last = words
            self.update(safe_text(words))
        self.display = bool(words)
