"""The supervisor's monitoring: it watches the run whether or not any screen is open.

Run by :mod:`stepwatch.launcher.supervisor` for one attempt, in two threads of its own:

- **the log timer** (:mod:`.logtimer`) follows ``train.log`` and appends log-derived step records to
  ``logsteps.jsonl`` as the bytes arrive;
- **the detector loop** refreshes a :class:`RunObserver` of the run dir about once a second, the
  same code every view runs (death, fallback, stall, recompile limit and storm, GPU), appends each
  new alert once to ``alerts.jsonl`` and hands it to the :class:`Deliverer` (the ``[alerts]``
  command and push URLs, as the run's owner).

``alerts.jsonl`` (per attempt, rotated with the other files): one ``alert`` record per alert,
``{"v":1, "kind":"alert", "id", "alert_kind", "level", "message", "at", "t", "evidence"}``, and
the ``delivery`` records of :mod:`.delivery`. A view reads it (alerts stay until acknowledged, with
what became of each delivery) and adds only what it alone can see.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Literal, Protocol, cast
from collections.abc import Callable

from stepwatch.monitors import fdreserve
from stepwatch.monitors.snapshot.ledger import record as record_ledger
from stepwatch.monitors.runfiles import ALERTS_JSONL, read_push_urls
from stepwatch.monitors.snapshot.alerts import headline_of
from stepwatch.monitors.snapshot.model import json_safe
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.snapshot.types import Alert, NewAlert, Snapshot
from stepwatch.monitors.states import EVALUATING, SAVING
from stepwatch.monitors.watch.stacks import (PY_SPY_TIMEOUT_S, STACK_KINDS, TREE_STACK_KINDS, record_stack_later,
                                             record_tree_stacks_later, stack_target)
from stepwatch.monitors.snapshot.process import run_began_at
from stepwatch.monitors.watch.delivery import SAME_CAUSE, Deliverer, level_of
from stepwatch.monitors.watch.lifecycle import (WAIT_FOR_FROZEN, finished_page, group_end_cause, resolved_page,
                                               stopped_cause, unix_of)
from stepwatch.monitors.detectors.losshealth import episodes_of
from stepwatch.monitors.parsers.phases import PHASE_FLOOR_S
from stepwatch.monitors.parsers.pystacks import category_of, main_frames
from stepwatch.monitors.runsettings import RunSettings
from stepwatch.monitors.watch.attemptfile import AttemptFile as AttemptFile  # re-exported: restartrun writes one
from stepwatch.monitors.watch.logtimer import LivenessFlags, LogTimerThread

#: The detector loop's period, seconds (alerts reach alerts.jsonl within about this, plus a refresh).
DETECT_EVERY_S = 1.0
#: After the child ended: how long deliveries in flight are waited for before the supervisor exits.
FINAL_DELIVERY_WAIT_S = 40.0
#: Alert kinds only the scheduler can raise, recorded by the login node's job watcher.
#: the phase a stuck rank's stack showed, as a noun ("cleared within the budget of the save ...")
PHASE_NOUN = {SAVING: "save", EVALUATING: "evaluation"}
SCHEDULER_ALERT_KINDS = frozenset({"job_end", "time_limit"})
#: The loss episode's alerts (monitors/snapshot/metrics.py): each names the episode's rollback point.
LOSS_KINDS = frozenset({"loss_spike", "loss_rise", "loss_catastrophic"})


class Rollback(Protocol):
    """The supervisor's rollback keeper (launcher/rollback.py :class:`RollbackKeeper`): names and keeps a loss
    episode's rollback point (words for its alert), and releases it at a healthy end."""

    def episode(self, ep: dict[str, Any], earlier: list[dict[str, Any]]) -> str: ...

    def ended(self, snap: Any) -> None: ...


#: The part of the snapshot an alert kind's detector read (its evidence in alerts.jsonl).
_EVIDENCE_PART: dict[str, Literal["fallback", "stall", "dynamo", "gpu", "loss_health"]] = {
    "fallback": "fallback", "stall": "stall", "recompile_limit": "dynamo", "recompile_storm": "dynamo", "gpu": "gpu",
    "loss_spike": "loss_health", "loss_rise": "loss_health", "loss_catastrophic": "loss_health"}


def evidence_of(snap: Snapshot, kind: str) -> dict[str, Any]:
    """What the files said when an alert was raised: the step, the step-time summary and the part
    of the snapshot the alert's detector read."""
    ev: dict[str, Any] = {"global_step": (snap.get("step") or {}).get("global_step"),
                          "step_timing": (snap.get("step") or {}).get("timing"),
                          "step_seconds": snap.get("step_seconds")}
    part = _EVIDENCE_PART.get(kind)
    if part:
        ev[part] = snap.get(part)
    if kind == "watchdog":
        ev.update(returncode=snap.get("returncode"), signal=snap.get("signal"),
                  traceback_last_line=(snap.get("log") or {}).get("traceback_last_line"))
    return json_safe(ev)


class AlertRecorder:
    """Appends each new alert of a :class:`RunObserver`'s snapshot once to ``alerts.jsonl`` with its
    evidence and hands it to the :class:`Deliverer`; ``kinds`` (a set) limits it to those alert
    kinds, ``skip`` leaves those out (the supervisor and the login node's job watcher split the
    kinds: each alert has one recorder)."""

    def __init__(self, run_dir: Path, run: dict[str, Any], log: Callable[[str], None],
                 kinds: frozenset[str] | None = None, skip: frozenset[str] = frozenset(),
                 log_lost: Callable[[], tuple[int, str | None]] | None = None, rollback: Rollback | None = None):
        config = (run.get("config") or {}).get("alerts") or {}
        config = dict(config) if isinstance(config, dict) else {}
        config["urls"] = read_push_urls(run_dir)  # kept out of run.json, which other users may read
        self.file = AttemptFile(run_dir / ALERTS_JSONL, log)
        self.deliverer = Deliverer(run_dir, self.file.append_json, config, str(run.get("name") or run_dir.name), log=log)
        self.observer = RunObserver(run_dir, use_saved_state=False, trust_uid=os.geteuid(), own_run=run)
        self.kinds, self.skip, self.log, self.run_dir = kinds, skip, log, Path(run_dir)
        self.recorded: set[str] = set()
        self.paged: set[str] = set()  # the alerts this recorder paged: their resolution is paged too
        alerts = RunSettings.of_run(run).alerts  # finished: a page on exit 0
        self.finished_wanted, self.paging = alerts.finished not in (False, ()), alerts.paging
        #: shown, not yet paged: alert id -> when its window ends (time.monotonic(): a wall clock step moves nothing)
        self.pending: dict[str, float] = {}
        #: shown, not paged: the frozen alert that causes it (lifecycle.stopped_cause), while that alert holds
        self.caused_by: dict[str, str] = {}
        #: stuck ranks whose stack was taken: alert id -> the phase it showed ("saving", "evaluating"; None: neither),
        #: judged again at the look after the stack (None) or after that phase's budget, and paged then if it holds
        self.rank_phase: dict[str, str | None] = {}
        self.attempt, self.run = run.get("attempt"), run  # the supervisor's own record of the launch
        self._stack_threads: list[threading.Thread] = []  # a stall's stacks, its delivery after them
        self.host = socket.gethostname()
        self.log_lost = log_lost  # the supervisor's log pump: output bytes train.log could not take so far, and why
        #: the supervisor's rollback keeper (launcher/rollback.py), and what it said of each loss episode (by its key)
        self.rollback = rollback
        self.rollback_words: dict[str, str] = {}

    def detect(self, now: float | None = None) -> Snapshot:
        """One refresh; records what is new (shown at once) and pages what has held for its confirmation window
        ([alerts] confirm_s, :mod:`.paging`). Returns the snapshot."""
        snap = self.observer.refresh()
        disk = snap.get("disk")
        if self.log_lost is not None and disk is not None and not disk.get("log_lost_bytes"):
            lost, why = self.log_lost()  # live, while it runs; exit.json has it at the end
            if lost:
                disk["log_lost_bytes"], disk["log_lost_reason"] = lost, why
        now = time.time() if now is None else now
        self._cause_gone(snap)
        for al in snap.get("alerts") or []:
            if al["id"] in self.paged and (page := resolved_page(cast("dict[str, Any]", al), snap, self.host,
                                                                  now)) is not None:
                self.paged.discard(al["id"])  # one resolution per page
                self.deliverer.submit(page)
            if al["id"] in self.pending:
                self._confirm(al, snap)
            if al["id"] in self.recorded or al.get("recorded") or al["kind"] in self.skip or (
                    self.kinds is not None and al["kind"] not in self.kinds):
                self.recorded.add(al["id"])
                continue
            if al["kind"] in LOSS_KINDS:
                al = self._with_rollback(al, snap)
            self.record(al, evidence_of(snap, al["kind"]), deliver=False)
            window = self.paging.confirm_window_s(al["kind"])
            due = (unix_of(al["at"]) or now) + window  # the condition's age, read once from the wall clock
            self.pending[al["id"]] = time.monotonic() + min(window, max(0.0, due - now))
            if window > 0 and now < due:
                self.deliverer.record_outcome(cast("dict[str, Any]", al), "pending",
                                              f"shown; pages if it still holds after {window:g} s (confirm_s)")
            self._confirm(al, snap)
        return snap

    def _with_rollback(self, al: Alert, snap: Snapshot) -> Alert:
        """A loss episode's alert with its rollback point in its message (the keeper names and keeps it once per
        episode, at its first alert): what the page and alerts.jsonl say."""
        key = al["id"].split(f"-{al['kind']}-", 1)[-1]
        if self.rollback is None:
            return al
        if key not in self.rollback_words:
            lh = snap["loss_health"]
            eps = episodes_of(lh)
            ep = next((e for e in eps if f"{lh['metric']}-{e['onset_step']}" == key), None)
            earlier = [dict(e) for e in eps if ep is not None and e is not ep
                       and (e["onset_step"] or 0) < (ep["onset_step"] or 0)]
            try:
                self.rollback_words[key] = self.rollback.episode(dict(ep), earlier) if ep is not None else ""
            except Exception as e:  # noqa: BLE001 - the alert goes out whatever the keeper did
                self.rollback_words[key] = f"no rollback point: {type(e).__name__}: {e}"
        words = self.rollback_words[key]
        return cast(Alert, {**al, "message": f"{al['message']}; {words}"}) if words else al

    def _confirm(self, al: Alert, snap: Snapshot) -> None:
        """Page a shown alert whose window has passed and that still holds; one that cleared first never pages."""
        due = self.pending[al["id"]]
        if not al.get("active", True):
            del self.pending[al["id"]]
            phase = self.rank_phase.get(al["id"], "")
            self.deliverer.record_outcome(cast("dict[str, Any]", al), "not_confirmed", (
                f"cleared within the budget of the {PHASE_NOUN[phase]} its stack showed" if phase
                else "cleared while its stack was taken (the rank stepped again or ended)" if phase is None
                else f"cleared before its confirmation window ended ({self.paging.confirm_window_s(al['kind']):g} s)"))
            return
        if time.monotonic() < due:
            return
        cause = stopped_cause(al, snap, bool(self.observer.health.stopped))
        group = group_end_cause(al, snap, time.time())
        if WAIT_FOR_FROZEN in (cause, group):
            return  # a process held stopped (the frozen verdict decides), or a rank's death the group's end may follow
        del self.pending[al["id"]]
        if cause is not None:  # one cause, one page: the frozen alert's page and its resolved say it; its stacks stay
            self.caused_by[al["id"]] = cause
            self.deliverer.record_outcome(cast("dict[str, Any]", al), SAME_CAUSE,
                                          f"shown as the evidence of {cause}, which is paged: a process held stopped "
                                          "makes no step; one cause, one page")
            self._stacks(al, snap, None)
            return
        if group is not None:  # the group ended with the rank: the death's page names the root-cause rank
            self.deliverer.record_outcome(cast("dict[str, Any]", al), SAME_CAUSE,
                                          f"shown as the evidence of {group}: the group ended with this rank, and the "
                                          "end's page names it; one cause, one page")
            return
        self.paged.add(al["id"])
        if al["kind"] in LOSS_KINDS:  # paged after its window: with the rollback point its record names
            al = self._with_rollback(al, snap)
        self._stacks(al, snap, {**al, "headline": headline_of(snap, self.host)})  # the page's first line

    def _stacks(self, al: Alert, snap: Snapshot, page: dict[str, Any] | None) -> None:
        """Take the stacks an alert of its kind carries and hand ``page`` to the deliverer (for a stall, after its
        stacks, which it then names); ``page`` None: the stacks alone, as evidence."""
        deliver = self.deliverer.submit if page is not None else (lambda _page: None)
        if al["kind"] in TREE_STACK_KINDS:  # the stacks of every process first, then the page that says them
            self._stack_threads.append(record_tree_stacks_later(
                page or cast("dict[str, Any]", al), self.run_dir, self.file.append_json, deliver, self.log,
                None if snap["phase"]["name"] in (SAVING, EVALUATING) or page is None  # a save past its budget: paged
                else lambda phase, summary: self._phase_not_stall(al, snap, phase, summary)))
            return
        pid = stack_target(snap, al) if al["kind"] in STACK_KINDS else None
        if page is not None and al["kind"] == "stuck_rank" and pid is not None and al["id"] not in self.rank_phase:
            # the rank's stack first: a rank that stopped stepping to save (or evaluate) its own shard is no stuck rank
            self._stack_threads.append(record_stack_later(
                al["id"], pid, self.file.append_json, self.log,
                lambda stack: self._rank_stack(al, stack)))
            return
        if page is not None:
            deliver(page)
        if pid is not None and not (al["id"] in self.rank_phase and self.rank_phase[al["id"]] is None):  # just taken
            record_stack_later(al["id"], pid, self.file.append_json, self.log)

    def _rank_stack(self, al: Alert, stack: str) -> None:
        """A stuck rank's stack (from the stack thread). No page from here: the page rests on a look after the stack
        (py-spy can take seconds under load, and a rank that ended or stepped again meanwhile is no stuck rank). When
        the stack shows the rank saving or evaluating, that look comes once that phase's budget ([stall]
        phase_floor_s) has passed (a save past its budget pages); otherwise at the next look."""
        phase = {"saving": SAVING, "evaluating": EVALUATING}.get(category_of(main_frames(stack)) or "")
        self.paged.discard(al["id"])  # paged (and resolved) only from the look that confirms it
        self.rank_phase[al["id"]] = phase  # that look pages, whatever a stack would then show
        if phase is None:
            self.pending[al["id"]] = time.monotonic()
            return
        budget = self.observer.a.stall.phase_floor_s if self.observer.a is not None else PHASE_FLOOR_S
        self.pending[al["id"]] = time.monotonic() + budget
        self.deliverer.record_outcome(cast("dict[str, Any]", al), "pending",
                                      f"the rank's stack shows it {phase}: judged again after that phase's budget "
                                      f"({budget:g} s)")
        self.log(f"{al['id']} not paged yet: the rank's stack shows it {phase}")

    def _cause_gone(self, snap: Snapshot) -> None:
        """An alert held as a frozen alert's evidence that still holds once that alert cleared (the process was let go,
        the step still does not end) is a cause of its own now: it pages (from its next look)."""
        active = {a["id"] for a in snap["alerts"] if a["active"]}
        for aid, cause in list(self.caused_by.items()):
            if aid not in active:
                del self.caused_by[aid]
            elif cause not in active:
                del self.caused_by[aid]
                self.pending[aid] = time.monotonic()

    def _phase_not_stall(self, al: Alert, snap: Snapshot, phase: str, summary: str) -> None:
        """The stacks of a stalled step show a save or an evaluation: not paged (never its ``resolved`` either); the
        observer judges the step against that phase's budget from its next look, and a save or evaluation that runs
        past it is a stall of its own (its own alert). From the stack thread."""
        self.paged.discard(al["id"])
        self.observer.saw_in_stacks(phase, snap["step"].get("global_step"))
        self.deliverer.record_outcome(cast("dict[str, Any]", al), "not_confirmed",
                                      f"the stacks show the run {phase}: judged against that phase's budget, not "
                                      f"the step's ({summary[:300]})")
        self.log(f"{al['id']} not paged: the stacks show the run {phase}")

    def record(self, al: NewAlert, evidence: Any, deliver: bool = True, page: dict[str, Any] | None = None) -> None:
        """Append one alert to alerts.jsonl and (``deliver``) hand it (``page``: with its headline) to the
        Deliverer (once per id)."""
        self.recorded.add(al["id"])  # not in ``paged``: an alert handed in (a warden's supervisor_lost) is no
        # detector's, so its absence from the next look says nothing: only a detector's alert, paged by _confirm, has
        # a resolution (an alert the warden resolves, a stopped supervisor's, it pages itself: watch/held.py)
        rec = {"v": 1, "kind": "alert", "id": al["id"], "alert_kind": al["kind"], "level": level_of(al["kind"]),
               "message": al["message"], "at": al["at"], "t": time.time(), "evidence": evidence}
        try:
            self.file.append_json(rec)
        except (OSError, ValueError) as e:
            self.log(f"could not record alert {al['id']}: {e}")
        if deliver:
            self.deliverer.submit(page or cast("dict[str, Any]", al))  # the Deliverer reads it as a plain mapping

    def page_finished(self, snap: Snapshot) -> None:
        """The attempt ended: what waited for its confirmation window never pages (the end's own alert says how it
        ended); a ``finished`` page when it exited 0 and the run's [alerts] table asks for one."""
        for aid in list(self.pending):
            al = next((a for a in snap.get("alerts") or [] if a["id"] == aid), None)
            del self.pending[aid]
            if al is not None:
                self.deliverer.record_outcome(cast("dict[str, Any]", al), "not_confirmed",
                                              "the attempt ended before its confirmation window did")
        began = run_began_at(self.run_dir, self.run) if self.finished_wanted else None  # the run's whole time
        if self.finished_wanted and (page := finished_page(snap, self.host, self.attempt, began)) is not None:
            self.deliverer.submit(page)

    def finish(self) -> None:
        """Wait (bounded) for the stacks being taken and the deliveries in flight, then close the file."""
        deadline = time.monotonic() + PY_SPY_TIMEOUT_S + 5
        for t in self._stack_threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if not self.deliverer.wait(FINAL_DELIVERY_WAIT_S):
            self.log(f"deliveries still in flight after {FINAL_DELIVERY_WAIT_S:g} s; leaving them")
        self.file.close()


def watch_attempt(run_dir: Path, run: dict[str, Any], child_done: threading.Event,
                  log: Callable[[str], None] = lambda m: None, exporter: Any = None,
                  log_lost: Callable[[], tuple[int, str | None]] | None = None, rollback: Rollback | None = None) -> None:
    """Watch one attempt until ``child_done`` is set, then record its last alerts and wait (bounded)
    for their delivery. Never raises. The scheduler's alerts (a Slurm run's job end, its time limit)
    are the login node's job watcher's to record (:mod:`.jobwatch`). ``exporter`` (the Prometheus
    endpoint, :class:`stepwatch.monitors.export.prometheus.Exporter`) gets each snapshot; ``log_lost`` (the log pump's
    count of output bytes train.log could not take, and why) goes into each snapshot's ``disk`` while it runs."""
    stop_log = threading.Event()
    liveness = LivenessFlags()
    timer = LogTimerThread(run_dir, stop_log, log, run, liveness)
    timer.start()
    recorder = AlertRecorder(run_dir, run, log, skip=SCHEDULER_ALERT_KINDS, log_lost=log_lost, rollback=rollback)
    try:
        while not child_done.is_set():
            try:
                with fdreserve.room(8):  # the run's files and /proc, with every other descriptor taken too
                    snap = recorder.detect()
                liveness.note(snap)
                if exporter is not None:
                    exporter.update(snap)
            except Exception as e:  # noqa: BLE001 - a detector bug must not end the watching
                log(f"detector loop: {type(e).__name__}: {e}")
            child_done.wait(DETECT_EVERY_S)
        stop_log.set()
        timer.join(10.0)
        try:
            with fdreserve.room(8):
                snap = recorder.detect()  # the end: the watchdog's verdict, the log's last steps
                recorder.page_finished(snap)
                record_ledger(run_dir, snap)  # where this attempt's time went, for the run's ledger after a relaunch
                if rollback is not None:
                    rollback.ended(snap)  # a healthy end releases the kept rollback checkpoints
            if exporter is not None:
                exporter.update(snap)
        except Exception as e:  # noqa: BLE001
            log(f"detector loop (final): {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001
        log(f"watching stopped: {type(e).__name__}: {e}")
    finally:
        recorder.finish()
