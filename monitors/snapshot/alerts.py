"""Alerts: their ids and their wording, from a status snapshot and the evidence behind it.

An alert id is ``a<attempt>-<kind>-<key>`` (the key: a step, a function, a device), stable across
refreshes and attaches, so an acknowledgement (``acks.jsonl``) holds for as long as the alert does.
Kinds: ``recompile_limit``, ``recompile_storm``, ``fallback``, ``stall``, ``gpu``, ``watchdog``.
Alerts stay: once an attempt raised one (the supervisor recorded it in alerts.jsonl, or this view
saw it), it is listed until the attempt ends, acknowledged or not, with ``active`` saying whether
its condition still holds. Each alert's ``at`` is when the files say it became true (the step's start plus the stall
threshold, the fallback's onset, the exit); when they cannot say, the first refresh that saw it.
"""

from __future__ import annotations

import time
from typing import Any, cast
from collections.abc import Iterable, Mapping, MutableMapping
from urllib.parse import urlsplit

from stepwatch.monitors.detectors.storm import recompile_storm
from stepwatch.monitors.fold.stepcolumns import unix_time
from stepwatch.monitors.runfiles import utc_iso
from stepwatch.monitors.snapshot.model import run_ended, shallow
from stepwatch.monitors.detectors.frozen import who as frozen_who
from stepwatch.monitors.snapshot.disk import end_cause, full_words
from stepwatch.monitors.snapshot.metrics import loss_health_alerts, metric_alerts
from stepwatch.monitors.snapshot.process import state_word
from stepwatch.monitors.slurm import ABNORMAL_ENDS
from stepwatch.monitors.snapshot.scheduler import scheduler_alerts
from stepwatch.monitors.snapshot.ranks import rank_alerts, ranks_last_words, root_cause_words
from stepwatch.monitors.detectors.frozen import Frozen
from stepwatch.monitors.snapshot.types import (Alert, Disk, Dynamo, Ended, Fallback, NewAlert, Scheduler, Snapshot,
                                               Stall, Watch)
from stepwatch.monitors.snapshot.watchers import supervisor_frozen
from stepwatch.monitors.states import EVALUATING, FLAGGED, HELD, RUNNING, SAVING, STALLED, UNKNOWN


def end_words(snap: Snapshot) -> str:
    """``exited with code 3 after 12.0 s`` / ``killed by SIGKILL after ...`` / ``ended, status unknown``."""
    ended = snap.get("ended") or {}
    dur = ended.get("duration_s")
    after = f" after {dur:.1f} s" if isinstance(dur, (int, float)) else ""
    job = (snap.get("scheduler") or {}).get("state")
    if job in ABNORMAL_ENDS and not ended.get("stop_requested"):
        return f"ended by Slurm ({job}): " + (f"killed by {snap['signal']}" if snap.get("signal") else
                                             f"exited with code {snap['returncode']}" if snap.get("returncode") is not None
                                             else "no exit record from the supervisor") + after
    if ended.get("stop_requested"):
        how = f"{snap['signal']}" if snap.get("signal") else f"exit code {snap.get('returncode')}"
        return f"stopped as requested ({how}){stop_who(snap)}{after}"
    if snap.get("signal"):
        return f"killed by {snap['signal']}{after}"
    if snap.get("returncode") is not None:
        return f"exited with code {snap['returncode']}{after}"
    if ended.get("error"):
        return f"could not start: {ended['error']}"
    return "ended, status unknown (supervisor gone, no exit.json)"


def stop_who(snap: Snapshot) -> str:
    """`` by alice at 2026-12-01T18:22:05.123Z`` from stop.json ('' for what it does not say; a
    name from the file is cut short and shown as text, never run or followed)."""
    stop = snap.get("stop")
    stop = stop if isinstance(stop, dict) else {}
    who = stop.get("requested_by_user")
    t = unix_time(stop.get("requested_at_unix"))
    return (f" by {who[:32]}" if isinstance(who, str) and who else "") + (f" at {utc_iso(t)}" if t is not None else "")


def _secs(v: Any) -> str:
    """A duration rounded to what matters: 0.817, 12.3, 412 (``?`` when unknown)."""
    if not isinstance(v, (int, float)):
        return "?"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def alert(first_seen: MutableMapping[str, float], attempt: Any, kind: str, key: str, message: str,
          at: float | None) -> NewAlert:
    """One alert dict ``{id, kind, at, message}``; ``at`` (unix s) or the first time it was seen."""
    aid = f"a{attempt}-{kind}-{key}"
    t = at if at is not None else first_seen.setdefault(aid, time.time())
    return {"id": aid, "kind": kind, "at": cast(str, utc_iso(t)), "message": message}


def alerts_for(snap: Snapshot, *, first_seen: MutableMapping[str, float],
               limit_hits: Iterable[tuple[Any, int | None, float]],
               recompile_sources: Iterable[Iterable[int]],
               fallback_onset_t: float | None, stall_at: float | None) -> list[NewAlert]:
    """The snapshot's alerts, oldest kind first, one helper per part.

    ``limit_hits``: (RecompileLimit record of train.log, global_step near it, unix s seen);
    ``recompile_sources``: the recompile steps of each source (events.jsonl flags, train.log
    records), judged apart; ``fallback_onset_t`` / ``stall_at``: unix s each became true, or None.
    ``first_seen`` keeps the first-seen time of alerts the files give no time for.
    """
    return [*_dynamo_alerts(snap, first_seen, list(limit_hits), recompile_sources),
            *_fallback_alerts(snap, first_seen, fallback_onset_t), *_stall_alerts(snap, first_seen, stall_at),
            *rank_alerts(snap, alert, first_seen), *metric_alerts(snap, alert, first_seen),
            *loss_health_alerts(snap, alert, first_seen),
            *scheduler_alerts(snap, alert, first_seen), *_disk_alerts(snap, first_seen),
            *_frozen_alerts(snap, first_seen), *_gpu_alerts(snap, first_seen), *_end_alerts(snap, first_seen)]


def _dynamo_alerts(snap: Snapshot, first_seen: MutableMapping[str, float],
                   hits: list[tuple[Any, int | None, float]], recompile_sources: Iterable[Iterable[int]]) -> list[NewAlert]:
    att, out = snap["attempt"], []
    for e, step, seen in hits:
        where = f" on rank {e.rank}" if e.rank is not None else ""
        out.append(alert(first_seen, att, "recompile_limit", f"{e.function}-{e.rank}",
                         f"dynamo hit {e.limit_name} ({e.limit}) for {e.function}{where}"
                         f"{f' near step {step}' if step is not None else ''}: that frame now runs EAGERLY", seen))
    d: Dynamo = snap["dynamo"]
    if not hits and (n := d.get("recompile_limit_hits")):  # NotRequired: absent while unknown
        out.append(alert(first_seen, att, "recompile_limit", "events",
                         f"dynamo hit its recompile limit {n} time(s) (seen by the emitter): a frame now runs eagerly",
                         None))
    if storm := recompile_storm([list(s) for s in recompile_sources], snap["warmup"], d["top_recompile_reason"]):
        out.append(alert(first_seen, att, "recompile_storm", str(storm[0]), storm[1], None))
    return out


def _fallback_alerts(snap: Snapshot, first_seen: MutableMapping[str, float], onset_t: float | None) -> list[NewAlert]:
    fb: Fallback = snap["fallback"]
    if fb["state"] != FLAGGED:
        return []
    return [alert(first_seen, snap["attempt"], "fallback", str(fb["onset_step"]),
                  f"step times went bimodal (eager fallback?): {fb['reason']}", onset_t)]


def _stall_alerts(snap: Snapshot, first_seen: MutableMapping[str, float], stall_at: float | None) -> list[NewAlert]:
    st: Stall = snap["stall"]
    if st["state"] != STALLED:
        return []
    gs, ph = snap["step"]["global_step"], snap["phase"]["name"]  # a save or evaluation past its budget: its own stall
    return [alert(first_seen, snap["attempt"], "stall", f"{gs}-{ph}" if ph in (SAVING, EVALUATING) else str(gs),
                  f"alive but stuck: no optimizer step for {st['current_step_elapsed_s']:.0f} s after "
                  f"step {gs} (its steps take {_secs(snap['step_seconds']['p99'])} s at p99){ranks_last_words(snap)}",
                  stall_at)]


def _disk_alerts(snap: Snapshot, first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    disk: Disk | None = snap["disk"]
    if disk is None or not disk["full"] or not (snap["state"] == RUNNING or snap["supervisor_alive"]):
        return []
    return [alert(first_seen, snap["attempt"], "disk_full", "run_dir",
                  f"{full_words(disk)}: train.log, events and the run's records cannot grow (ENOSPC); the run goes on, "
                  "its output is counted and dropped until there is room: free space", None)]


def _frozen_alerts(snap: Snapshot, first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    att, out, gs = snap["attempt"], [], snap["step"]["global_step"]
    frozen: Frozen = snap["liveness"]["frozen"]
    if frozen["state"] == FLAGGED and snap["state"] == RUNNING:
        for p in frozen["processes"]:
            out.append(alert(first_seen, att, "frozen", str(p["pid"]),
                             f"frozen: {frozen_who(p)} is held stopped (SIGSTOP, or a job-control stop) for "
                             f"{p['stopped_s']:.0f} s: it makes no progress until it gets SIGCONT"
                             + ("" if gs is None else f"; the run's last step {gs}"), None))
    watch: Watch = snap["watch"]
    if watch["state"] == HELD and snap["state"] == RUNNING and (sup := watch["supervisor_pid"]) is not None:
        out.append(alert(first_seen, att, "frozen", f"supervisor-{sup}",  # its warden pages it (monitors/watch/warden.py)
                         supervisor_frozen(sup, None, bool(watch["wardens_alive"])), None))
    return out


def _gpu_alerts(snap: Snapshot, first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    return [alert(first_seen, snap["attempt"], "gpu", f"{g['index']}-tensor-idle", f"GPU{g['index']}: {g['verdict']}",
                  None)
            for g in snap["gpu"] or [] if str(g["verdict"] or "").startswith("SM-busy, tensor-idle")]


def _end_alerts(snap: Snapshot, first_seen: MutableMapping[str, float]) -> list[NewAlert]:
    """The run's death: an end the operator did not ask for (Slurm's own ends are the job_end alert's)."""
    if not run_ended(snap):
        return []
    ended: Ended | None = snap["ended"]
    # "status unknown" only once the supervisor is gone too: while it lives it is about to
    # write exit.json (the child's pid reads dead or zombie a moment before that)
    unknown = snap["state"] == UNKNOWN and snap["supervisor_alive"] is not True
    bad = unknown or snap["signal"] or snap["returncode"] not in (0, None) or (ended is not None and ended["error"])
    sch: Scheduler | None = snap["scheduler"]
    if (ended is not None and ended["stop_requested"]) or (  # the operator asked for it: an event, not an alert
            snap["returncode"] is None and sch is not None and sch["state"] in ABNORMAL_ENDS):  # Slurm ended it first
        bad = False
    if not bad:
        return []
    tb = snap["log"]["traceback_last_line"]
    last = f"{reached_words(snap)}" + (f"traceback: {tb}" if tb else f"last log line: {snap['log']['last_line']!r}")
    who = f"process {snap['pid']}" if snap["pid"] is not None else "the command"
    return [alert(first_seen, snap["attempt"], "watchdog", "end",
                  f"{who} {end_words(snap)}{end_cause(snap)}{root_cause_words(snap)}; {last}",
                  ended["ended_at_unix"] if ended is not None else None)]


def reached_words(snap: Snapshot) -> str:
    """``the run reached step 120 of 300; `` (``of`` only where the total is known); "" before any step."""
    st = snap.get("step") or {}
    gs, total = st.get("global_step"), st.get("max_steps")
    return "" if gs is None else f"the run reached step {gs}" + (f" of {total}" if total else "") + "; "


def headline_of(snap: Snapshot, host: str) -> str:
    """A page's first line: ``host · run · STATE · step N/M`` (``?`` for what is not known), one line; STATE is the
    word the screen's header shows (``KILLED SIGKILL``, ``EXITED 3``: :func:`.process.state_word`)."""
    step = snap["step"]
    gs, most = step["global_step"], step["max_steps"]
    return " · ".join((host, str(snap["run"] or "?"), state_word(snap),
                       f"step {gs if gs is not None else '?'}/{most if most else '?'}"))


def channel_name(url: str) -> str:
    """A push URL's scheme and host only: tokens in paths, users and passwords stay out of files."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or ''}" if parts.scheme else "url"
    except ValueError:
        return "url"


def push_channel_names(urls: list[Any]) -> list[str]:
    """Each push URL's channel name, one per URL and each its own (two ntfy topics or two webhooks on one host
    are two channels, each rate-limited and reported apart): the scheme and host, then ``#2``, ``#3`` … by
    order for a host named again. The path (a topic, a token) never shows."""
    out: list[str] = []
    for u in urls:
        if not (isinstance(u, str) and u):
            continue
        name = base = channel_name(u)
        n = 1
        while name in out:
            n += 1
            name = f"{base}#{n}"
        out.append(name)
    return out


def channel_names(alerts_config: Any) -> list[str]:
    """The delivery channels a run's ``[alerts]`` table names (run.json ``config.alerts``): read,
    never run. ``command`` for an argv, one name per push URL."""
    if not isinstance(alerts_config, dict):
        return []
    cmd, urls, named = alerts_config.get("command"), alerts_config.get("urls"), alerts_config.get("channels")
    out = ["command"] if isinstance(cmd, list) and cmd else []
    if isinstance(urls, list):
        out += push_channel_names(urls)
    if isinstance(named, list):  # run.json: the push channels by name (the URLs stay in alerts.urls.json)
        out += [str(n) for n in named if isinstance(n, str) and n not in out]
    return out


def merge_alerts(computed: list[NewAlert], recorded: Mapping[str, dict[str, Any]],
                 shown: MutableMapping[str, dict[str, Any]], deliveries: Mapping[str, Mapping[str, Any]],
                 channels: list[str]) -> list[Alert]:
    """The snapshot's alerts: the supervisor's (``recorded``, from alerts.jsonl), what this view
    computed now, and every alert it showed before (``shown``, kept per attempt), oldest first.

    Each gets ``recorded`` (in alerts.jsonl), ``active`` (its condition holds now) and
    ``delivered``: per configured channel the recorded outcome (``{"outcome": null, ...}`` while
    none is recorded), or null when the run names no channel."""
    for rid, rec in recorded.items():
        shown.setdefault(rid, dict(rec))
        for key in ("stack", "stacks_summary"):  # the supervisor's py-spy stacks, recorded after the alert
            if key in rec:
                shown[rid][key] = rec[key]
    active = set()
    for al in computed:
        active.add(al["id"])
        shown[al["id"]] = {**shown.get(al["id"], {}), **al}
    out = []
    for aid, al in shown.items():
        got = deliveries.get(aid) or {}
        delivered = ({ch: dict(got[ch]) if ch in got else {"outcome": None, "detail": "no delivery recorded"}
                      for ch in channels} if channels else None)
        # ``acknowledged``: set by the observer once it has read acks.jsonl
        out.append(cast(Alert, {**al, "recorded": aid in recorded, "active": aid in active, "delivered": delivered}))
    return out


def read_alert_records(reader: Any, recorded: dict[str, dict[str, Any]], deliveries: dict[str, dict[str, Any]]) -> None:
    """What alerts.jsonl (``reader``, an EventReader) gained: the supervisor's alert records, each
    delivery's outcome, and the Python stack it took for an alert (``stack``)."""
    for rec in reader.read_new():
        if type(rec) is not dict or type(rec.get("id" if rec.get("kind") == "alert" else "alert_id")) is not str:
            continue
        if rec.get("kind") == "alert":
            recorded.setdefault(rec["id"], {
                "id": rec["id"], "kind": str(rec.get("alert_kind")), "at": str(rec.get("at")),
                "message": str(rec.get("message")), "level": str(rec.get("level"))})
        elif rec.get("kind") == "stack" and rec["alert_id"] in recorded:
            if isinstance(rec.get("stack"), str):
                recorded[rec["alert_id"]]["stack"] = rec["stack"][-4000:]
            if isinstance(rec.get("summary"), str):  # every process's stack, grouped (parsers/pystacks.py)
                recorded[rec["alert_id"]]["stacks_summary"] = rec["summary"][:600]
        elif rec.get("kind") == "delivery":
            deliveries.setdefault(rec["alert_id"], {})[str(rec.get("channel"))] = {
                k: shallow(rec.get(k)) for k in ("outcome", "detail", "attempts", "t")}
