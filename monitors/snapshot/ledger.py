"""The ledger of where the hours went: each attempt's wall time, and the whole run's, split into accounts
(``monitors/states.py`` LEDGER_PHASES) that add up to it (ARCHITECTURE.md, "The ledger").

An attempt's time, from its launch to its end (or now):

- ``queued``: a Slurm job's submission to its start (the scheduler's ``start_unix``);
- ``starting``: the launch (or the job's start) to the end of the first step (imports, compilation, a resume's load);
- each later step's interval, end to end (consecutive steps tile: ``EventsFold.interval_s``), to the account its
  flags name: ``training``; ``evaluating`` / ``saving`` / ``stalled`` for one that held an evaluation, a save or a
  stall, less one typical step (the step's p50), which is training;
- after the last step: the phase the run is in (live), ``finishing`` for an attempt that exited 0, ``lost`` for one
  that failed (the step in flight never completed).

The run's: the attempts' accounts; between one attempt's end and the next's launch, ``restart_gap`` when the system
started the next (the restart policy's back-off and launch, a Slurm requeue: run.json ``resumed_from.by``) and
``operator_idle`` when the operator did (a launch or ``relaunch`` by hand: the time until they came back is theirs,
not a restart's cost); and ``lost`` moved out of ``training``: the steps after the checkpoint a later attempt resumed
from (``run.json`` ``resumed_from``), at the attempt's p50 each. An attempt with no record (its supervisor died before
writing ``ledger.json``) is ``unaccounted``. goodput = training over the run's wall time less the operator's idle time.

Past attempts come from their ``ledger.<stamp>.json``, written by each attempt's supervisor at its end (the
watch's last look: :func:`record`); read like every run file, hostile until checked.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.runfiles import LEDGER_JSON, read_json, write_json_atomic
from stepwatch.monitors.snapshot.types import AttemptLedger, Ledger, Snapshot
from stepwatch.monitors.states import (
    BY_OPERATOR, EVALUATING, FINISHING, LEDGER_PHASES, LOST, OPERATOR_IDLE, QUEUED, RESTART_GAP, SAVING, STALLED, STARTING,
    TRAINING, UNACCOUNTED,
)

#: The split accounts: a step that held an evaluation, a save or a stall also trained for about one typical step.
_SPLIT = (EVALUATING, SAVING, STALLED)
#: Past attempts' records read at most (a run dir holds one per attempt).
MAX_RECORDS = 1000
_BIG = 1e12  # seconds or steps a record may hold


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) and 0 <= v < _BIG else None


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < _BIG else None


def _by(v: Any) -> str | None:
    return v[:40] if isinstance(v, str) and v else None


def started_by(run: dict[str, Any]) -> str | None:
    """Who started the attempt run.json describes: its ``resumed_from.by`` (the restart policy, a Slurm requeue, the
    operator's relaunch from a checkpoint); the operator when it has none (a launch or relaunch by hand records none);
    None when it has one that does not say."""
    rf = run.get("resumed_from")
    return _by(rf.get("by")) if isinstance(rf, dict) else BY_OPERATOR


def zero_phases() -> dict[str, float]:
    return dict.fromkeys(LEDGER_PHASES, 0.0)


def attempt_ledger(fold: EventsFold | None, p50_s: float | None, launched: float | None, end_t: float,
                   tail_phase: str, start_unix: float | None = None) -> dict[str, float] | None:
    """One attempt's accounts (seconds, every LEDGER_PHASES key), from its speaking fold (None: no step record),
    its step p50, its launch (unix s; None: unknown, no ledger), its end or now, the account of the time after
    its last step, and a Slurm job's start (the time before it is queued)."""
    if launched is None:
        return None
    ph = zero_phases()
    origin = launched
    if start_unix is not None and launched <= start_unix <= end_t:
        ph[QUEUED], origin = start_unix - launched, start_unix
    first = fold.first_end if fold is not None else None
    if fold is None or first is None or fold.last_end is None:
        ph[STARTING] = max(0.0, end_t - origin)  # no step yet: all of it is the start
        return ph
    ph[STARTING] = max(0.0, min(first, end_t) - origin)
    typical = p50_s or 0.0
    for key, total in fold.interval_s.items():
        total = _num(total)
        if total is None or key not in ph:
            continue
        if key in _SPLIT:
            trained = min(total, (_int(fold.interval_n.get(key)) or 0) * typical)
            ph[TRAINING] += trained
            total -= trained
        ph[key] += total
    ph[tail_phase] += max(0.0, end_t - fold.last_end)
    return ph


def tail_phase(snap: Snapshot) -> str:
    """The account of the time after the attempt's last step: an ended attempt's finishing (exit 0) or lost (the step in
    flight); a live one's phase, a stall's stalled, else training (the step in progress)."""
    if snap["ended"] is not None:
        return FINISHING if snap["returncode"] == 0 else LOST
    if snap["stall"]["state"] == STALLED:
        return STALLED
    name = snap["phase"]["name"]
    return name if name in (EVALUATING, SAVING, FINISHING) else TRAINING


def this_attempt(snap: Snapshot, run: dict[str, Any], fold: EventsFold | None, p50_s: float | None,
                 now: float) -> AttemptLedger:
    """The snapshot's own attempt's ledger (``live`` while it runs, ``ended`` once exit.json says so)."""
    ended = snap["ended"] or {}
    end_t = _num(ended.get("ended_at_unix")) or now
    launched = _num(snap["launched_at_unix"])
    sched = snap["scheduler"] or {}
    phases = attempt_ledger(fold, p50_s, launched, end_t, tail_phase(snap), _num(sched.get("start_unix")))
    rf: dict[str, Any] = run.get("resumed_from") or {}
    if not isinstance(rf, dict):
        rf = {}
    last = fold.last_step if fold is not None else None
    return {"attempt": _int(snap["attempt"]), "launched_at_unix": launched,
            "ended_at_unix": end_t if snap["ended"] is not None else None,
            "wall_s": None if launched is None else round(max(0.0, end_t - launched), 3),
            "phases_s": None if phases is None else {k: round(v, 3) for k, v in phases.items()},
            "last_step": _int((last or {}).get("step")), "step_p50_s": p50_s,
            "resumed_from_step": _int(rf.get("step")), "after_attempt": _int(rf.get("after_attempt")),
            "started_by": started_by(run), "lost_steps": None, "source": "live" if snap["ended"] is None else "ended"}


def _record(doc: dict[str, Any] | None) -> AttemptLedger | None:
    """A past attempt's ledger.json, checked: every value of its type and range, or the record is not used."""
    if doc is None:
        return None
    phases = doc.get("phases_s")
    launched, end = _num(doc.get("launched_at_unix")), _num(doc.get("ended_at_unix"))
    if not isinstance(phases, dict) or launched is None or end is None or end < launched:
        return None
    # (a record written before an account existed lacks it: none of its time went there; operator_idle is never an
    # attempt's own, only the run's)
    clean = {k: _num(phases.get(k, 0.0 if k == OPERATOR_IDLE else None)) for k in LEDGER_PHASES}
    if any(v is None for v in clean.values()):
        return None
    return {"attempt": _int(doc.get("attempt")), "launched_at_unix": launched, "ended_at_unix": end,
            "wall_s": round(end - launched, 3), "phases_s": {k: v or 0.0 for k, v in clean.items()},
            "last_step": _int(doc.get("last_step")), "step_p50_s": _num(doc.get("step_p50_s")),
            "resumed_from_step": _int(doc.get("resumed_from_step")), "after_attempt": _int(doc.get("after_attempt")),
            "started_by": _by(doc.get("started_by")), "lost_steps": None, "source": "record"}


_cache: dict[str, tuple[tuple[Any, ...], AttemptLedger | None]] = {}


def past_attempts(run_dir: Path, owner_uid: int | None) -> list[AttemptLedger]:
    """The rotated ``ledger.<stamp>.json`` of earlier attempts (the run dir owner's only; read again only when
    changed), oldest launch first."""
    out = []
    try:
        names = sorted(n for n in os.listdir(run_dir) if n.startswith("ledger.") and n.endswith(".json")
                       and n != LEDGER_JSON)[:MAX_RECORDS]
    except OSError:
        return []
    for name in names:
        path = run_dir / name
        try:
            st = path.lstat()
        except OSError:
            continue
        key, sig = str(path), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, owner_uid)
        hit = _cache.get(key)
        if hit is None or hit[0] != sig:
            if len(_cache) > 4 * MAX_RECORDS:
                _cache.clear()
            try:
                hit = _cache[key] = (sig, _record(read_json(path, owner_uid)))
            except OSError:
                continue
        if hit[1] is not None:
            # a copy: the run's ledger moves lost work out of training
            out.append({**hit[1], "phases_s": dict(hit[1]["phases_s"] or {})})  # type: ignore[typeddict-item]
    return sorted(out, key=lambda r: r["launched_at_unix"] or 0.0)  # type: ignore[return-value]


def run_ledger(attempts: list[AttemptLedger], now_end: float) -> Ledger:
    """The whole run's ledger from its attempts (oldest first; the last is this snapshot's): lost work moved out of
    training, restart gaps (the operator's idle time, before an attempt they started by hand) and unaccounted attempts
    between them, and goodput (the operator's idle time left out)."""
    by_no = {a["attempt"]: a for a in attempts if a["attempt"] is not None}
    for a in attempts:  # a resumed attempt: the steps after its checkpoint were done again
        after = a["after_attempt"]
        prev = by_no.get(after) if after is not None and a["resumed_from_step"] is not None else None
        if prev is None or prev["phases_s"] is None or prev["last_step"] is None:
            continue
        lost_steps = max(0, prev["last_step"] - a["resumed_from_step"])  # type: ignore[operator]
        ph = prev["phases_s"]
        moved = min(ph[TRAINING], lost_steps * (prev["step_p50_s"] or 0.0))
        ph[TRAINING] = round(ph[TRAINING] - moved, 3)
        ph[LOST] = round(ph[LOST] + moved, 3)
        prev["lost_steps"] = lost_steps
    total = zero_phases()
    known = [a for a in attempts if a["phases_s"] is not None and a["launched_at_unix"] is not None]
    for i, a in enumerate(known):
        for k, v in (a["phases_s"] or {}).items():
            total[k] += v
        if i:
            prev = known[i - 1]
            gap = max(0.0, (a["launched_at_unix"] or 0.0) - (prev["ended_at_unix"] or prev["launched_at_unix"] or 0.0))
            consecutive = a["attempt"] is not None and prev["attempt"] is not None and a["attempt"] == prev["attempt"] + 1
            by_hand = a["started_by"] == BY_OPERATOR  # (an older record that does not say: the policy's, as before)
            total[UNACCOUNTED if not consecutive else OPERATOR_IDLE if by_hand else RESTART_GAP] += gap
    if not known:
        return {"attempts": attempts, "phases_s": None, "wall_s": None, "goodput": None,
                "reason": "no launch time on record"}
    wall = max(0.0, (known[-1]["ended_at_unix"] or now_end) - (known[0]["launched_at_unix"] or now_end))
    busy = wall - total[OPERATOR_IDLE]  # the operator's own time before a relaunch is no cost of the run's
    return {"attempts": attempts, "phases_s": {k: round(v, 3) for k, v in total.items()}, "wall_s": round(wall, 3),
            "goodput": round(min(1.0, total[TRAINING] / busy), 4) if busy > 0 else None, "reason": None}


def ledger_part(run_dir: Path, run: dict[str, Any], snap: Snapshot, fold: EventsFold | None, p50_s: float | None,
                now: float) -> Ledger:
    """The snapshot's ``ledger``: every attempt's accounts and the run's."""
    try:
        owner = run_dir.lstat().st_uid
    except OSError:
        owner = None
    current = this_attempt(snap, run, fold, p50_s, now)
    past = [a for a in past_attempts(run_dir, owner) if a["attempt"] != current["attempt"]]
    return run_ledger(past + [current], now)


def record(run_dir: Path, snap: Snapshot) -> None:
    """Write this attempt's ledger to ledger.json (the supervisor, at the attempt's end; rotated with its files)."""
    led = snap["ledger"]
    if led is None or not led["attempts"]:
        return
    doc = dict(led["attempts"][-1])
    doc["v"] = 1
    write_json_atomic(run_dir / LEDGER_JSON, doc)
