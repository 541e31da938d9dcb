"""The home screen: the runs under the runs dir with state, attempt, step, p50 and alerts.
Enter attaches; ``l`` launches from a config."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from stepwatch.monitors.rundirs import list_runs
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.snapshot.types import Alert, Step, StepSeconds
from stepwatch.tui.format import pid_or_job, secs, state_word
from stepwatch.tui.messages import HomeRow, RunsListed
from stepwatch.tui.safe import safe_text

if TYPE_CHECKING:
    from stepwatch.tui.appbase import StepwatchAppBase

REFRESH_S = 2.0


class HomeScreen(Screen):
    """A table of runs, refreshed every 2 s in a worker. One :class:`RunObserver` per run is kept
    between refreshes, so each refresh reads only what the runs' files gained (a new observer
    each time would re-read every run's whole events.jsonl every 2 s)."""

    BINDINGS = [Binding("enter", "attach", "attach", priority=True)]
    if TYPE_CHECKING:
        app: StepwatchAppBase  # the App this screen runs in (Textual types it as any App)

    def __init__(self, runs_dir: Path):
        super().__init__()
        self.runs_dir = runs_dir
        self.rows: list[HomeRow] = []
        self._observers: dict[Path, RunObserver] = {}
        self._observers_lock = threading.Lock()  # a worker still running when the next one starts

    def compose(self) -> ComposeResult:
        yield Static(f" stepwatch  runs in {self.runs_dir}", id="header")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static(" Enter attach   l launch from a config   q quit   ? help", classes="dim")
        yield Footer()

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("run", "state", "attempt", "pid", "step", "p50 s", "alerts")
        self._list()

    @work(thread=True, exclusive=True, exit_on_error=False, group="home")
    def _list(self) -> None:
        rows = []
        with self._observers_lock:
            runs = list_runs(self.runs_dir)
            for gone in set(self._observers) - set(runs):
                del self._observers[gone]
            for d in runs:
                obs = self._observers.get(d)
                if obs is None:
                    obs = self._observers[d] = RunObserver(d)
                rows.append(self._row(obs))
        self.post_message(RunsListed(rows))

    @staticmethod
    def _row(obs: RunObserver) -> HomeRow:
        """The run's snapshot, with ``_open_alerts``: its alerts not acknowledged yet (refresh()
        has marked each from acks.jsonl)."""
        snap = cast(HomeRow, obs.refresh())
        alerts: list[Alert] = snap["alerts"]
        snap["_open_alerts"] = sum(1 for a in alerts if not a["acknowledged"])
        return snap

    def on_runs_listed(self, msg: RunsListed) -> None:
        t = self.query_one(DataTable)
        keep = t.cursor_row
        t.clear()
        self.rows = msg.rows
        for s in msg.rows:
            step: Step = s["step"]
            ss: StepSeconds = s["step_seconds"]
            k, n = step["global_step"], step["max_steps"]
            cells = (s["run"], state_word(s), str(s["attempt"] or "-"), pid_or_job(s),
                     f"{k if k is not None else '-'}/{n or '?'}", secs(ss["p50"]),
                     str(s["_open_alerts"] or ""))
            t.add_row(*(safe_text(c) for c in cells))  # a str cell would be parsed as markup
        if msg.rows:
            t.move_cursor(row=min(keep, len(msg.rows) - 1))
        else:
            self.query_one("#header", Static).update(f" stepwatch  no runs in {self.runs_dir} yet: press l to launch one")
        self.set_timer(REFRESH_S, self._list)

    def action_attach(self) -> None:
        t = self.query_one(DataTable)
        if self.rows and 0 <= t.cursor_row < len(self.rows):
            self.app.attach(Path(cast(str, self.rows[t.cursor_row]["run_dir"])))  # set by every refresh
