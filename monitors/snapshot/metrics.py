"""Training metrics read from the log (loss, learning rate, grad norm, eval loss, any numeric field a
recogniser captured): the snapshot's ``metrics`` part and the alert for a loss that is not a number.

``metrics``: ``{name: {"step": global_step when printed, "value": float | None, "finite": bool}}``
for the latest value of each name (a NaN or inf value is ``value: null, finite: false``: JSON carries
no NaN); ``metrics_series``: the loss-like ones over the whole run, min and max per bin
(:func:`series_part`), from the tracker's series (:mod:`stepwatch.monitors.parsers.logtracker`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping, MutableMapping

from stepwatch.monitors.detectors.losshealth import LOSS_NAMES, NONFINITE, episodes_of  # LOSS_NAMES: a NaN of one is an alert
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.parsers.logtracker import LogTracker
from stepwatch.monitors.protocol import METRICS_SHOWN_FIRST
from stepwatch.monitors.runfiles import KEPT_JSON, read_json
from stepwatch.monitors.states import CATASTROPHIC, OK, PERSISTENT
from stepwatch.monitors.stats.minmax import MinMaxSeries
from stepwatch.monitors.snapshot.types import Arrival, Episode, LossHealthPart, Metric, NewAlert, Snapshot

#: Metrics listed in the snapshot at most (the tracker keeps at most as many series).
MAX_LISTED = 64
#: Shown first, in this order, where present (then the rest as they came).
SHOWN_FIRST = METRICS_SHOWN_FIRST


def metrics_words(metrics: Mapping[str, Metric], limit: int = 6) -> str:
    """``loss 2.346  lr 0.0001  grad_norm 0.6336  (step 50)`` from the snapshot's ``metrics``
    ('' when there are none); a non-finite value reads ``NaN/inf``."""
    names = [n for n in SHOWN_FIRST if n in metrics] + [n for n in metrics if n not in SHOWN_FIRST]
    parts = []
    for n in names[:limit]:
        m = metrics[n]
        parts.append(f"{n} {m['value']:.4g}" if m["finite"] else f"{n} NaN/inf")
    steps = [s for n in names[:limit] if (s := metrics[n]["step"]) is not None]
    return "  ".join(parts) + (f"  (step {max(steps)})" if steps else "") if parts else ""


def metric_parts(snap: Snapshot, log: LogTracker, ev: EventsFold, run_dir: Path) -> None:
    """The snapshot's ``metrics``, ``metrics_series`` and ``loss_health``: from the log's metrics, else from the
    emitter's log events; the rollback checkpoint the supervisor kept from kept.json (shown only: the run owner's
    file that nobody else can write, its fields typed, never a path a view follows)."""
    snap["metrics"] = log_metrics(log.last_metrics, ev.last_logs, ev.last_logs_step,
                                  log.series if log.last_metrics else ev.series)
    snap["metrics_series"] = series_part(log.series or ev.series)
    snap["loss_health"] = (log.loss_health if log.loss_health.metric or not ev.loss_health.metric
                           else ev.loss_health).part()
    try:
        owner = os.lstat(run_dir).st_uid  # the run's owner: the supervisor that keeps is theirs
    except OSError:
        return
    try:
        kept = read_json(run_dir / KEPT_JSON, owner_uid=owner, private=True)
    except OSError:  # unreadable (another user's run, mode 0600): nothing to show
        return
    if kept is not None and type(kept.get("step")) is int and all(
            type(kept.get(k)) is str for k in ("checkpoint", "kept", "how")):
        snap["loss_health"]["rollback"] = {k: (kept[k][:500] if type(kept[k]) is str else kept[k])
                                           for k in ("checkpoint", "step", "kept", "how")}


def log_metrics(last: Mapping[str, tuple[int | None, float]], event_logs: Any = None,
                step: int | None = None, series: Mapping[str, MinMaxSeries] | None = None) -> dict[str, Metric]:
    """The snapshot's ``metrics`` from the tracker's latest ``(step, value)`` per name, else from
    the emitter's latest ``log`` event (``event_logs``, a dict read from events.jsonl: only its
    finite-or-not numbers count, at ``step``); each name's NaN/inf count and first such step over
    the whole run from ``series`` (the tracker's or the fold's)."""
    if not last and isinstance(event_logs, dict):
        last = {k[:64]: (step, v if type(v) is float else float(min(max(v, -2**1000), 2**1000)))  # no OverflowError
                for k, v in list(event_logs.items())[:MAX_LISTED] if isinstance(k, str) and type(v) in (int, float)}
    out: dict[str, Metric] = {}
    for name, (step, value) in list(last.items())[:MAX_LISTED]:
        finite = math.isfinite(value)
        ser = (series or {}).get(name)
        out[name] = {"step": step, "value": value if finite else None, "finite": finite,
                     "nonfinite_count": ser.nonfinite if ser is not None else int(not finite),
                     "first_nonfinite_step": (ser.first_nonfinite_step if ser is not None
                                              else None if finite else step)}
    return out


def metric_alerts(snap: Snapshot, make: Callable[..., NewAlert], first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    """A ``nonfinite_loss`` alert once the training loss was NaN or inf anywhere in the run, naming
    the first such step (a finite value after it does not take it back: it is said as a recovery);
    ``make`` is snapshot.alerts.alert; keyed by that first step, so it is raised once."""
    out: list[NewAlert] = []
    for name in LOSS_NAMES:
        m = (snap.get("metrics") or {}).get(name)
        if not m or not m.get("nonfinite_count"):
            continue
        first = m.get("first_nonfinite_step")
        at = f" first at step {first}" if first is not None else ""
        n = m["nonfinite_count"]
        now = ("and it still is" if not m["finite"]
               else f"{n} such value{'s' if n > 1 else ''} so far; the latest, at step {m['step']}, is finite again "
                    f"({m['value']:.4g}): a recovery, but the steps between trained on garbage")
        out.append(make(first_seen, snap["attempt"], "nonfinite_loss", f"{name}-{first}",
                        f"the log's {name} was not a number (NaN or inf){at}, {now}", None))
    return out


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def loss_health_words(lh: LossHealthPart) -> str:
    """``loss: spike at step 4210 (z 9.3)``, ``loss: ok (level 2.81, 2000 values)``, ``loss: not judged (...)``: the
    loss health's verdict in a few words (the status's and the screen's)."""
    ep, last = lh["episode"], lh["last"]
    if ep is not None:
        if ep["why"] == NONFINITE:
            return f"loss: catastrophic: not a number from step {ep['onset_step']}"
        grad = f", grad norm first at {ep['grad_warning_step']}" if ep["grad_warning_step"] is not None else ""
        return f"loss: {ep['kind']} at step {ep['onset_step']} (z {_num(ep['peak_z'])}{grad}){_kept(lh)}"
    if lh["state"] != OK:
        return f"loss: not judged ({lh['reason']})"
    past = (f"; last {last['kind']} at step {last['onset_step']}, recovered at {last['recovered_step']}"
            if last is not None else "")
    return f"loss: ok (level {_num(lh['level'])}, {lh['values']} values{past}){_kept(lh)}"


def _kept(lh: LossHealthPart) -> str:
    rb = lh["rollback"]
    return f" · rollback {Path(str(rb['checkpoint'])).name} kept" if rb is not None else ""


def loss_health_alerts(snap: Snapshot, make: Callable[..., NewAlert],
                       first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    """Each episode of the training loss (``loss_health``: the open one, and the last ENDED_KEPT that ended: a fast
    run's spike may open and end between two looks, and is said all the same): ``loss_spike`` (a warning) from its
    onset, and ``loss_rise`` (persistent: an error) or ``loss_catastrophic`` (ten times the first values': an error)
    as it got worse, each keyed by the onset step. A value that is not a number is ``nonfinite_loss``'s (:func:`metric_alerts`): no second alert for it."""
    lh = snap["loss_health"]
    out: list[NewAlert] = []
    for ep in episodes_of(lh):
        if ep["why"] != NONFINITE:
            out += _episode_alerts(snap, lh["metric"], ep, make, first_seen)
    return out


def _episode_alerts(snap: Snapshot, name: str | None, ep: Episode, make: Callable[..., NewAlert],
                    first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    onset, peak = ep["onset_step"], ep["peak_step"]
    grad = (f"; the grad norm spiked first, at step {ep['grad_warning_step']}" if ep["grad_warning_step"] is not None
            else "")
    end = f"; back at its level from step {ep['recovered_step']}" if ep["recovered_step"] is not None else ""
    base = (f"against a level of {_num(ep['level'])} (its scale {_num(ep['scale'])}: the step-to-step spread of the "
            "logged values before it)")
    out = [make(first_seen, snap["attempt"], "loss_spike", f"{name}-{onset}",
                f"{name} spiked at step {onset}: {_num(ep['peak'])} at step {peak} (z {_num(ep['peak_z'])}) "
                f"{base}{grad}{end}", None)]
    if ep["kind"] == PERSISTENT:
        out.append(make(first_seen, snap["attempt"], "loss_rise", f"{name}-{onset}",
                        f"{name} rose at step {onset} and stayed up: {ep['values']} logged values, the last ones' "
                        f"median above {_num(ep['level'])} by more than 3 scales{grad}{end}", None))
    elif ep["kind"] == CATASTROPHIC:
        out.append(make(first_seen, snap["attempt"], "loss_catastrophic", f"{name}-{onset}",
                        f"{name} reached {_num(ep['peak'])} at step {peak}: ten times the largest of its first logged "
                        f"values or more (the run diverged){grad}{end}", None))
    return out


#: Metric series in the snapshot's ``metrics_series`` at most: SHOWN_FIRST's (loss, learning rate,
#: grad norm, eval loss) first, then any other number the log printed, in the order it first came.
SERIES_NAMES = 8


def series_part(series: Mapping[str, Any]) -> dict[str, list[list[float | int | None]]]:
    """``metrics_series``: ``{name: [[first_step, last_step, min, max], ...]}`` over the whole run
    (:class:`~stepwatch.monitors.stats.minmax.MinMaxSeries` bins, oldest first; a bin of NaN/inf
    values only has null min and max) for the first SERIES_NAMES names: SHOWN_FIRST's, then the rest."""
    names = [n for n in SHOWN_FIRST if n in series] + [n for n in series if n not in SHOWN_FIRST]
    return {n: series[n].as_json() for n in names[:SERIES_NAMES]}


#: The arrival figure agrees with the program's own step times when their medians are within this
#: share of each other; judged from ARRIVAL_MIN_STEPS printed steps on.
ARRIVAL_AGREE_SHARE = 0.25
ARRIVAL_MIN_STEPS = 10


def arrival_check(reported: Any, arrival: Any) -> Arrival:
    """``step.arrival`` for a run whose log prints its own step times (``timing: reported``): the
    supervisor's arrival-time figure (``n``, ``p50``, ``p99`` in seconds, nearest-rank, first step
    out) beside the program's, and ``agrees``: True / False, or None while fewer than
    ARRIVAL_MIN_STEPS steps were timed both ways (a program that times only part of its step, or a
    log line printed late, disagrees). ``reported`` and ``arrival`` are StepStats."""
    n, p50, p99 = arrival.n, arrival.p50, arrival.percentile(99)
    own = reported.p50
    agrees = None
    if n >= ARRIVAL_MIN_STEPS and p50 is not None and own is not None and own > 0:
        agrees = abs(p50 - own) <= ARRIVAL_AGREE_SHARE * own
    return {"n": n, "p50": p50, "p99": p99, "agrees": agrees}
