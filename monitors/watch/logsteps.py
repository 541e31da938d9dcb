"""Log-derived step records, timed where the log's bytes arrive: in the supervisor, not in a view.

The supervisor follows ``train.log`` from its first byte as the child writes it (change notice from
:mod:`stepwatch.monitors.readers.changes`, ~16 ms, with the follower's size/inode poll behind it) and
feeds every segment, the unfinished tail included (tqdm writes ``\\r`` *before* each bar, so the
newest bar is the tail until the next one comes), to a :class:`~stepwatch.monitors.parsers.logtracker.LogTracker`
(every log shape it knows). Each poll that
moved the training bar's counter from ``s0`` to ``s1`` gives ``k = s1 - s0`` step records whose
``dt`` is the time between the two polls' arrivals divided by ``k``:

- ``timing: "per_update"`` when ``k == 1`` (tqdm printed every step: steps slower than its
  ``mininterval``, 0.1 s by default);
- ``timing: "shared"`` when ``k > 1`` (tqdm skipped redraws; the k steps share the interval and say
  so with ``steps_in_update``);
- ``timing: "reported"`` when the line itself says how long its step took (nanoGPT's ``time 16.12ms``,
  a JSON line's ``dt_s``): one record per printed step, ``dt`` the program's figure and
  ``arrival_dt_s`` the arrival-time one beside it.

The first timed step (from the bar's first update, usually ``0/N`` printed before training starts)
carries the flag ``first``, as the emitter's first step does: it holds start-up and compilation and
is left out of the percentiles. A counter that goes back (a second ``train()``, a resumed run)
starts over without a record. Records have the ``step`` event's keys (:mod:`stepwatch.monitors.protocol`) plus
``timing`` and ``steps_in_update``; they go to ``logsteps.jsonl``, which every view folds like
``events.jsonl``.

Lines behind another rank's prefix (``[rank1]:``, torchrun's ``--tee`` ``[default1]:``) never move
rank 0's step; :class:`RankLogTimers` gives each such rank a timer of its own, whose records (``rank``
N) go to ``logsteps.rank<N>.jsonl``: the per-rank steps of an un-instrumented run.
"""

from __future__ import annotations

import json
import math
from typing import Any
from collections.abc import Iterable

from stepwatch.monitors.parsers.hf_progress import ProgressTracker, StepAdvance
from stepwatch.monitors.parsers.logtracker import LogSettings, LogTracker
from stepwatch.monitors.protocol import FLAG_FIRST, KIND_LOG, KIND_STEP, SCHEMA_VERSION
from stepwatch.monitors.readers.rankprefix import rank_prefix
from stepwatch.monitors.readers.textlog import Segment

TIMING_PER_UPDATE = "per_update"
TIMING_SHARED = "shared"
TIMING_REPORTED = "reported"


class LogStepTimer:
    """Turns each poll's segments into step records (see the module docstring). Pure: time comes
    from the segments' ``at_s`` (the arrival of the poll that read them)."""

    def __init__(self, tracker: ProgressTracker | None = None, rank: int = 0, resume_step: int | None = None):
        """``resume_step``: the attempt resumes from a checkpoint of that step (run.json ``resumed_from``): its
        bar's first jump (HF's ``0/80`` then ``41/80``) holds the restored steps, which this attempt did not run."""
        self.tracker = tracker or LogTracker(rank=rank)
        self.rank = rank
        self.resume_step = resume_step
        self._last_step: int | None = None
        self._last_at: float | None = None
        self._timed_any = False
        self._flags: list[str] = []  # the evaluations and saves that ran before the steps not yet recorded

    def feed_poll(self, segments: Iterable[Segment], partial: Segment | None) -> list[dict[str, Any]]:
        """One poll's segments (and the follower's unfinished tail, if any): the step records of the
        counter advances they hold; each carries the flags of the evaluations and saves the log showed
        since the last record (``eval``, ``save``: ARCHITECTURE.md R18)."""
        records = self._feed_poll(segments, partial)
        if records and self._flags:  # arrival-timed: the poll's interval held the phases, its records share it
            for r in records:
                r["flags"] = [*r["flags"], *self._flags]
        if records:
            self._flags = []
        return records

    def _feed_poll(self, segments: Iterable[Segment], partial: Segment | None) -> list[dict[str, Any]]:
        at: float | None = None
        restarted = False
        reported: list[StepAdvance] = []
        own_flags: dict[int, list[str]] = {}  # a step with its own time: the phases before it, its alone
        phases = getattr(self.tracker, "phases", None)
        for seg in (*segments, *((partial,) if partial is not None else ())):
            advances = self.tracker.feed(seg)
            flags = phases.take_flags() if phases is not None else []
            for adv in advances:
                if adv.reported_dt_s is not None and (adv.prev_step is None or adv.step > adv.prev_step):
                    reported.append(adv)  # the first printed step too: its own time is known (flagged first)
                    own_flags[id(adv)], flags = [*self._flags, *flags], []
                    self._flags = []
                elif adv.prev_step is None or adv.step < adv.prev_step:
                    restarted = True
                at = seg.at_s
            self._flags += flags
        if reported and not restarted:
            return self._reported(reported, own_flags)
        step = self.tracker.global_step
        if at is None or step is None:
            return []
        if self._last_step is None or self._last_at is None or step <= self._last_step:
            # the first advance, or the counter back at or below the last timed step (a new bar: a
            # second train(), a resume): the next advance is timed from here
            first = self._last_step is None
            self._last_step, self._last_at = (max(step, self.resume_step or 0) if first else step), at
            return []
        k = step - self._last_step
        interval = at - self._last_at
        out = []
        if interval > 0:
            dt = interval / k
            begin = self._last_at
            for i in range(k):
                s = self._last_step + 1 + i
                end = begin + dt
                out.append(self._record(s, dt, begin, end, TIMING_PER_UPDATE if k == 1 else TIMING_SHARED, k))
                begin = end
        self._last_step, self._last_at = step, at
        return out

    def _record(self, step: int, dt: float, begin: float, end: float, timing: str, k: int,
                **extra: Any) -> dict[str, Any]:
        """One ``step`` record; the first one this timer makes is flagged ``first``."""
        flags = [FLAG_FIRST] if not self._timed_any else []
        self._timed_any = True
        return {"v": SCHEMA_VERSION, "kind": KIND_STEP, "t": end, "step": step, "rank": self.rank, "dt": dt,
                "step_begin": begin, "step_end": end, "tokens": None, "padded_tokens": None, "flags": flags,
                "timing": timing, "steps_in_update": k, **extra}

    def _reported(self, advances: list[StepAdvance], own_flags: dict[int, list[str]]) -> list[dict[str, Any]]:
        """One record per printed step whose time the program reported (nanoGPT's ``time``): that
        is its ``dt``; the arrival-time figure (the time since the previous printed step arrived,
        over the steps between) rides along as ``arrival_dt_s``, the check that can disagree."""
        out = []
        for adv in advances:
            at = adv.at_s if adv.at_s is not None else self._last_at
            if at is None:
                continue
            k = adv.step - adv.prev_step if adv.prev_step is not None else 1
            arrival = ((at - self._last_at) / k if self._last_at is not None and self._last_step == adv.prev_step
                       and k > 0 and at > self._last_at else None)
            dt = adv.reported_dt_s
            out.append(self._record(adv.step, dt, at - dt, at, TIMING_REPORTED, k, arrival_dt_s=arrival))
            out[-1]["flags"] += own_flags.get(id(adv), [])
            self._last_step, self._last_at = adv.step, at
        return out


class RankLogTimers:
    """A :class:`LogStepTimer` per rank other than 0 whose lines carry a rank prefix, fed only that
    rank's segments (at most ``MAX_RANKS`` ranks, numbered below ``MAX_RANK``: a log can print any
    prefix)."""

    MAX_RANKS = 256
    MAX_RANK = 10**5

    def __init__(self, patterns=(), settings: LogSettings | None = None):
        self.patterns = list(patterns)
        self.settings = settings
        self._sent: dict[int, dict[str, float | None]] = {}  # each rank's metrics as its last log record said
        self.timers: dict[int, LogStepTimer] = {}

    def feed_poll(self, segments: Iterable[Segment], partial: Segment | None) -> dict[int, list[dict[str, Any]]]:
        """One poll's segments: {rank: its step records} for the ranks whose lines moved."""
        by_rank: dict[int, list[Segment]] = {}
        tail: dict[int, Segment] = {}
        for seg in segments:
            rank = self._rank(seg)
            if rank is not None:
                by_rank.setdefault(rank, []).append(seg)
        if partial is not None and (rank := self._rank(partial)) is not None:
            tail[rank] = partial
            by_rank.setdefault(rank, [])
        out: dict[int, list[dict[str, Any]]] = {}
        for rank, segs in by_rank.items():
            timer = self.timers.get(rank)
            if timer is None:
                if len(self.timers) >= self.MAX_RANKS:
                    continue
                timer = self.timers[rank] = LogStepTimer(LogTracker(self.patterns, self.settings, rank=rank), rank=rank)
            recs = timer.feed_poll(segs, tail.get(rank))
            at = (tail.get(rank) or segs[-1]).at_s if (segs or rank in tail) else None
            if (log := self._metrics_record(rank, timer, at)) is not None:
                recs.append(log)
            if recs:
                out[rank] = recs
        return out

    def _metrics_record(self, rank: int, timer: LogStepTimer, at: float | None) -> dict[str, Any] | None:
        """A ``log`` record of the rank's latest metrics (its prefixed log dicts, its bar's postfix) when they
        changed since its last one, else None: each rank's own loss, behind its prefix (a NaN or inf is null:
        the file stays JSON)."""
        latest = getattr(timer.tracker, "last_metrics", None) or {}
        logs = {k: (v if math.isfinite(v) else None) for k, (_step, v) in latest.items()}
        if not logs or logs == self._sent.get(rank):
            return None
        self._sent[rank] = logs
        return {"v": SCHEMA_VERSION, "kind": KIND_LOG, "t": at, "step": timer.tracker.global_step, "rank": rank,
                "logs": logs}

    def _rank(self, seg: Segment) -> int | None:
        text = seg.text
        if not text.startswith("[") or getattr(seg, "is_note", False):
            return None
        rank = rank_prefix(text)[0]
        return rank if rank is not None and 0 < rank < self.MAX_RANK else None


def encode_records(records: list[dict[str, Any]]) -> bytes:
    """Records as JSON lines, for one append (a reader never sees half of one)."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode("utf-8")
