"""The run header: name, state, pid, elapsed, step k/N, ETA — and the alert banner."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.widgets import Static

from stepwatch.tui.format import hms, state_word
from stepwatch.tui.safe import safe_text


class RunHeader(Static):
    """One line: ``run  STATE  pid  elapsed  step k/N  ETA``. Updated only when its text changes."""

    def show(self, snap: dict[str, Any], now: float | None = None) -> None:
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
            f" pid {snap.get('pid') or '-'} {hms(elapsed)} step {k if k is not None else '-'}/{n or '?'}",
            f" ETA {hms(snap.get('eta_s')) if snap.get('state') == 'running' else '-'}",
        )
        if t.plain != getattr(self, "_last", None):
            self._last = t.plain
            self.update(safe_text(t))


class AlertBanner(Static):
    """The alert banner: the newest unacknowledged alert (and how many more), until ``a``."""

    def show(self, alerts: list[dict[str, Any]]) -> None:
        if not alerts:
            self.display = False
            self._last = None
            return
        newest = alerts[-1]
        more = f"  (+{len(alerts) - 1} more)" if len(alerts) > 1 else ""
        text = f" ALERT {newest['kind']}: {newest['message']}{more}  [a] acknowledge "
        if text != getattr(self, "_last", None):
            self._last = text
            self.update(safe_text(text))
        self.display = True
