"""The run header: name, state, pid, elapsed, step k/N, ETA, and the supervisor-gone and restart lines (the alert
banner: tui/widgets/alertbanner.py)."""

from __future__ import annotations

import time
from typing import cast

from rich.text import Text
from textual.widgets import Static

from stepwatch.monitors.snapshot.types import Eta, Snapshot
from stepwatch.monitors.states import HELD, RUNNING, UNWATCHED, WARDED
from stepwatch.tui.format import SUPERVISOR_GONE_WORDS, eta_words, hms, state_word, supervisor_gone
from stepwatch.tui.safe import safe_text


def _where(snap: Snapshot) -> str:
    """``pid 812``, or for a Slurm run ``job 12 0:41:03 left`` (the time left of its limit)."""
    sch = snap.get("scheduler")
    if not sch:
        return f"pid {snap.get('pid') or '-'}"
    left = sch.get("time_left_s")
    return f"job {sch.get('job_id') or '-'}" + (f" {hms(left)} left" if left is not None and snap.get("state") == RUNNING else "")


class RunHeader(Static):
    """One line: ``run  STATE  pid  elapsed  step k/N  ETA``. Updated only when its text changes."""

    def show(self, snap: Snapshot, now: float | None = None) -> None:
        now = time.time() if now is None else now
        started = snap.get("launched_at_unix")
        ended = (snap.get("ended") or {}).get("ended_at_unix")
        elapsed = None if started is None else (ended or now) - started
        step = snap.get("step") or {}
        k, n = step.get("global_step"), step.get("max_steps")
        word = state_word(snap)
        style = {"RUNNING": "bold green"}.get(word, "bold" if word.startswith("STOPPED") else "bold red" if word.startswith(("KILLED", "EXITED")) and word != "EXITED 0" else "bold yellow")
        t = Text.assemble(
            (f" {snap.get('run')} ", "bold"), (f"#{snap.get('attempt') or '-'} ", "dim"), (f" {word} ", style),
            f" {_where(snap)} {hms(elapsed)} step {k if k is not None else '-'}/{n or '?'}",
            f" ETA {eta_words(snap.get('eta') or cast(Eta, {}))}",
        )
        eta_s, left = (snap.get("eta") or {}).get("eta_s"), (snap.get("scheduler") or {}).get("time_left_s")
        if isinstance(eta_s, (int, float)) and isinstance(left, (int, float)) and eta_s > left:
            t.append(" past the time limit", "bold red")  # the time_limit alert says how far
        if t.plain != getattr(self, "_last", None):
            self._last = t.plain
            self.update(safe_text(t))


class SupervisorGone(Static):
    """Under the header while the run runs and its supervisor is gone or held stopped (``status`` warns the same):
    nobody will record the run's exit status; in red (``.unwatched``) when none of its wardens lives either.
    Hidden otherwise; updated only when it changes."""

    def show(self, snap: Snapshot) -> None:
        watch = snap.get("watch") or {}
        told = watch.get("state") in (HELD, WARDED, UNWATCHED)  # who still watches it: its words, in red when nobody
        words = str(watch.get("reason")) if told else SUPERVISOR_GONE_WORDS if supervisor_gone(snap) else None
        if words is not None and getattr(self, "_last", None) != words:
            self._last = words
            self.update(safe_text(words))
        self.set_class(watch.get("state") == UNWATCHED, "unwatched")
        self.display = words is not None


class RestartLine(Static):
    """Under the header once the restart policy decided (``[restart]``; the snapshot's ``restart``): its verdict
    in the words its page said; hidden otherwise, updated only when it changes."""

    def show(self, snap: Snapshot) -> None:
        rs = snap.get("restart")
        words = (f"RESTART POLICY ({rs['mode']}, after attempt {rs['attempt']}): {rs['verdict']}: {rs['words']}"
                 if rs else None)
        if words and words != getattr(self, "_last", None):
            self._last = words
            self.update(safe_text(words))
        self.display = bool(words)
