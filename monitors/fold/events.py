"""What one attempt's ``events.jsonl`` says, folded into state: step statistics, the fallback
detector, the latest run_start / dynamo / log / phase / run_end records, and counters.

:class:`EventsFold` is the events half of a status snapshot (``monitors/snapshot/observer.py`` builds the rest
from run.json, train.log and gpu.jsonl). The supervisor folds the same way and saves the result
beside events.jsonl (``monitors/fold/savedstate.py``) so an attach can start from there; one class does
both, so the two cannot drift apart. Values read from the file are sanitised here (a step whose dt
is not a number is counted, never fed).
"""

from __future__ import annotations

import gc
import math
import threading
from array import array
from collections import deque
from contextlib import contextmanager
from itertools import compress, repeat
from operator import eq, is_, methodcaller, not_
from typing import Any
from collections.abc import Iterator

from stepwatch.monitors.protocol import (
    FLAG_EVAL, FLAG_FIRST, FLAG_IDLE, FLAG_RECOMPILE, FLAG_SAVE, FLAG_STOPPED, KIND_DYNAMO, KIND_LOG, KIND_PHASE, KIND_RUN_END, KIND_RUN_START, KIND_STEP,
    METRICS_SHOWN_FIRST,
)
from stepwatch.monitors.detectors.fallback import FallbackDetector
from stepwatch.monitors.detectors.losshealth import GRAD_NAMES, LOSS_NAMES, LossHealth
from stepwatch.monitors.detectors.scaling import ScalingFit
from stepwatch.monitors.fold.stepcolumns import (
    STEP_KEYS, STEP_FIELDS, UNIX_MAX as _UNIX_MAX, StepColumns, step_no, token_count, unix_time,
)
from stepwatch.monitors.fold.records import DecodedRead, EmittedStep, ReadDecoder
from stepwatch.monitors.readers.jsonl import EventReader, parse_line
from stepwatch.monitors.stats.minmax import MinMaxSeries
from stepwatch.monitors.stats.stepstats import StepStats
from stepwatch.monitors.states import EVALUATING, FLAGGED, SAVING, STALLED, TRAINING

#: slow steps' global_step -> step_end kept (a fallback onset is a slow step of the last flag window)
SLOW_ENDS_KEPT = 1000
#: A backlog's steps go to the statistics and the detector this many at a time: memory stays bounded
#: however long the backlog, and each call's fixed cost (StepStats builds the records of its last
#: 4,096 rows) is paid rarely (fed per 7,000-event read it cost ~11 % of a cold attach, measured).
FEED_ROWS = 1 << 18
#: recompiles (their global_step) remembered for the storm alert
RECOMPILE_STEPS_KEPT = 1000
_RANK_0 = (0, None)
_PHASE_FLAGS = (FLAG_EVAL, FLAG_SAVE)
#: A flagged step's interval goes to this account of the ledger (the first flag that names one wins);
#: an unflagged (or only ``silent``/``recompile``) step's to training.
_LEDGER_ACCOUNTS = ((FLAG_EVAL, EVALUATING), (FLAG_SAVE, SAVING), (FLAG_IDLE, STALLED), (FLAG_STOPPED, STALLED))
_MAX_INT = 2**53  # token counts, integer seconds and step numbers read from a file stay below
_KIND_OF, _WIDTH_OF, _TIMING_OF = methodcaller("get", "kind"), methodcaller("get", "width"), methodcaller("get", "timing")
_METRIC_OF = {name: methodcaller("get", name) for name in METRICS_SHOWN_FIRST}
_NO_METRIC = frozenset((type(None), str, bool, list, dict))  # a metric value that is none: no point (bool: not a number)
#: A backlog's steps are accounted as arrays from this many at once.
_COLUMNS_FROM = 1024
_INF = math.inf


class EventsFold:
    """The state built from one attempt's events.jsonl, rank 0's records (rank 0 speaks for the run).

    Attributes (all read by ``monitors/snapshot/observer.py``):
        stats: :class:`StepStats` of the step events' ``dt`` (seconds per optimizer step).
        detector: the :class:`FallbackDetector` fed the same steps.
        recompile_steps: global_step of each step flagged ``recompile`` (the last 1,000).
        run_start, run_end, dynamo_ev: the latest record of that kind (a dict as read), or None.
        last_step: the latest usable ``step`` record; last_logs: the latest ``log`` record's ``logs``,
            last_logs_step its ``step`` (the global_step it was logged at; None when not an int).
        scaling: the step time against the steps' batch shapes (:class:`ScalingFit`), and their padding.
        series: the ``log`` records' loss, learning rate, grad norm and eval loss over the whole run
            (name -> :class:`MinMaxSeries`, min and max per bin: an emitter-only run's loss plot).
        open_phase: the name of a ``phase`` begun and not yet ended (``save``, ``eval``), or None.
        slow_step_ends: global_step -> step_end (unix s) of the last SLOW_ENDS_KEPT slow steps.
        flagged_onset_end: step_end of the onset of the cluster that made the detector flag.
        unusable_steps: step events whose dt is not a finite number >= 0 or whose flags is not a
            list of strings (fed to nothing, counted).
    """

    def __init__(self) -> None:
        self.stats = StepStats()
        self.detector = FallbackDetector()
        self.recompile_steps: deque[int] = deque(maxlen=RECOMPILE_STEPS_KEPT)
        self.run_start: dict[str, Any] | None = None
        self.run_end: dict[str, Any] | None = None
        self.dynamo_ev: dict[str, Any] | None = None
        self.last_step: dict[str, Any] | None = None
        self.open_phase: Any = None
        self.last_logs: Any = None
        self.last_logs_step: int | None = None
        self.series: dict[str, MinMaxSeries] = {}
        self.loss_health = LossHealth()  # the training loss's log events judged as they come (issue 47)
        self.scaling = ScalingFit()
        self.slow_step_ends: dict[int, float] = {}  # insertion order: oldest first
        self.flagged_onset_end: float | None = None
        self.unusable_steps = 0
        #: ``eval`` / ``save`` -> the longest interval of a step flagged so (seconds): how long the run's
        #: evaluations and saves take, known to any view of the records (ARCHITECTURE.md R18)
        self.phase_longest_s: dict[str, float] = {}
        #: step records timed as k steps sharing one log update (logsteps.jsonl ``timing: shared``)
        self.shared_steps = 0
        #: step records whose dt the program printed itself (logsteps.jsonl ``timing: reported``)
        self.reported_steps = 0
        #: those records' arrival-time figures (``arrival_dt_s``, seconds): the check on the program's own
        self.arrival_stats = StepStats()
        #: The ledger's side of the steps (monitors/snapshot/ledger.py): the first and the last step's end (unix s,
        #: the records' clock), and each account's sum of step intervals (end to end: consecutive steps tile) and
        #: their count; the first step's interval is the attempt's start, never an account's.
        self.first_end: float | None = None
        self.last_end: float | None = None
        self.interval_s: dict[str, float] = {}
        self.interval_n: dict[str, int] = {}

    def fold(self, reader: EventReader) -> None:
        """Fold what ``reader`` gained, a read (:meth:`EventReader.iter_new`, ~450 events; decoded as the emitter's
        records where ``monitors/fold/records.py`` can) at a time: its steps fed to the statistics and the detector
        a column at a time.

        A step whose ``dt`` is not a finite number >= 0 (null: unknown) or whose ``flags`` is not a list of strings
        feeds nothing and is counted in :attr:`unusable_steps`; ``tokens`` / ``padded_tokens`` other than an integer
        in [0, 2**53) read as unknown (None). A line that is not JSON is counted by the reader. Raises nothing for
        what a file holds."""
        # A backlog allocates ~10^5 acyclic objects: the cyclic GC would walk them again and again (~18 % of an attach)
        with gc_paused():
            self._fold(reader)

    def _fold(self, reader: EventReader) -> None:
        cols = StepColumns()
        for batch in reader.iter_new(ReadDecoder()):
            if type(batch) is DecodedRead:
                self._fold_decoded(batch, cols)
            else:
                self._fold_batch(batch, cols)
            if len(cols) >= FEED_ROWS:
                self._feed(cols)
                cols = StepColumns()
        self._feed(cols)

    def _fold_batch(self, batch: list[dict[str, Any]], cols: StepColumns) -> None:
        """One read's events (~450): its steps appended to ``cols``, everything else folded in."""
        evs = self._steps_of(batch, list(map(eq, map(_KIND_OF, batch), repeat(KIND_STEP))))
        if not evs:
            return
        first = len(cols)
        flagged = cols.take(evs)
        if flagged is None:
            self._fold_steps_each(evs, cols)
            return
        self.last_step = evs[-1]
        extras = list(map(_WIDTH_OF, evs)).count(None) < len(evs) or list(map(_TIMING_OF, evs)).count(None) < len(evs)
        self._taken(evs, first, flagged, extras, cols)

    def _fold_decoded(self, recs: DecodedRead, cols: StepColumns) -> None:
        """A read decoded as the emitter's records (``monitors/fold/records.py``): as :meth:`_fold_batch` its dicts."""
        steps = self._steps_of(recs, is_step := list(map(is_, map(type, recs), repeat(EmittedStep))))
        if not steps:
            return
        first = len(cols)
        flagged, extras = cols.take_records(steps)
        self.last_step = parse_line(recs.lines[len(is_step) - 1 - is_step[::-1].index(True)])  # the record as read
        self._taken(steps, first, flagged, extras, cols)

    def _steps_of(self, batch: list[Any], is_step: list[bool]) -> list[Any]:
        """A read's step records (``is_step``: which they are); the others folded in."""
        if is_step.count(True) < len(batch):
            self._fold_others(list(compress(batch, map(not_, is_step))))
        return list(compress(batch, is_step))

    def _taken(self, evs: list[Any], first: int, flagged: list[int], extras: bool, cols: StepColumns) -> None:
        """What a read's steps (``evs``, taken into ``cols`` from row ``first``) tell beside their columns: the
        flagged ones' (``flagged``: positions in ``evs``) phases and recompiles, and each one's extras if any has."""
        for j in flagged:
            flags, dt, step = cols.flags[first + j], cols.dt[first + j], cols.step[first + j]
            for f in flags:
                if f in _PHASE_FLAGS and dt > self.phase_longest_s.get(f, 0.0):
                    self.phase_longest_s[f] = dt  # an interval that held it: its length at most
            if FLAG_RECOMPILE in flags and type(step) is int:
                self.recompile_steps.append(step)
        if extras:
            for j, ev in enumerate(evs):
                k = first + j
                self._step_extras(ev, cols.step[k], cols.dt[k], cols.flags[k], cols.tokens[k], cols.padded[k])

    def _fold_steps_each(self, evs: list[dict[str, Any]], cols: StepColumns) -> None:
        """A read's step records one at a time (see :meth:`fold` for what is usable)."""
        last_step = None
        recompile_steps = self.recompile_steps
        for ev in evs:
            try:  # every key is there in what the emitter writes: one lookup for all
                rank, step, dt, flags, tokens, padded, t, step_end = STEP_FIELDS(ev)
            except KeyError:
                rank, step, dt, flags, tokens, padded, t, step_end = map(ev.get, STEP_KEYS)
            if rank not in _RANK_0:
                continue  # rank 0 speaks for the run
            flags = flags or ()
            if (
                not (0.0 <= dt < _INF if type(dt) is float else type(dt) is int and 0 <= dt < _MAX_INT)
                or (flags and (type(flags) is not list or not all(type(f) is str for f in flags)))
            ):  # a NaN dt fails 0.0 <= dt; a bool is not an int here
                self.unusable_steps += 1
                continue
            if type(step) is not int:
                step = step_no(step)
            tokens, padded = token_count(tokens), token_count(padded)
            if type(t) is not float or not 0.0 <= t < _UNIX_MAX:
                t = unix_time(t)
            cols.append(step, float(dt), flags, tokens, padded, t, step_end)
            if flags:
                for f in flags:
                    if f in _PHASE_FLAGS and dt > self.phase_longest_s.get(f, 0.0):
                        self.phase_longest_s[f] = float(dt)  # an interval that held it: its length at most
            self._step_extras(ev, step, dt, flags, tokens, padded)
            last_step = ev
            if flags and FLAG_RECOMPILE in flags and type(step) is int:
                recompile_steps.append(step)
        if last_step is not None:
            self.last_step = last_step

    def _step_extras(self, ev: Any, step: Any, dt: Any, flags: Any, tokens: Any, padded: Any) -> None:
        """A usable step record's batch shape (the scaling fit's point) and how its time was taken."""
        width = ev.get("width")
        if width is not None and padded is not None:
            bs = ev.get("batch_size")
            self.scaling.add(float(dt), padded, width, bs if type(bs) is int else None, tokens, bool(flags))
        timing = ev.get("timing")
        if timing == "shared":
            self.shared_steps += 1
        elif timing == "reported":
            self.reported_steps += 1
            arrival = ev.get("arrival_dt_s")  # the supervisor's own figure beside the program's
            if type(arrival) is float and 0.0 <= arrival < _INF:
                self.arrival_stats.add(step, arrival, flags)

    def _fold_others(self, others: list[Any]) -> None:
        """A read's records other than steps (dicts, or records answering ``get`` as theirs would), rank 0's, in
        order."""
        logs: list[tuple[Any, int | None]] = []
        for ev in others:
            if ev.get("rank") not in _RANK_0:
                continue
            kind = ev.get("kind")
            if kind == KIND_RUN_START:
                self.run_start = ev
            elif kind == KIND_PHASE:
                self.open_phase = ev.get("name") if ev.get("state") == "begin" else None
            elif kind == KIND_DYNAMO:
                self.dynamo_ev = ev
            elif kind == KIND_LOG:
                self.last_logs = ev.get("logs")
                step = ev.get("step")
                self.last_logs_step = step if type(step) is int and 0 <= step < _MAX_INT else None
                logs.append((self.last_logs, self.last_logs_step))
            elif kind == KIND_RUN_END:
                self.run_end = ev
        if logs:
            self._log_series(logs)

    def _log_series(self, logs: list[tuple[Any, int | None]]) -> None:
        """The ``log`` records' metrics (``(logs, step)`` of each, in order) to their series, a series at a time;
        a new series takes its place among them where its first point came."""
        dicts = [d if isinstance(d, dict) else {} for d, _ in logs]
        at = [step for _, step in logs]
        new: list[tuple[int, str]] = []
        points: dict[str, tuple[list[int | None], list[Any]]] = {}
        present = set().union(*dicts)
        for name in METRICS_SHOWN_FIRST:
            if name not in present:
                continue  # no point: as if each record's were None
            got = list(map(_METRIC_OF[name], dicts))
            kinds = set(map(type, got))
            if kinds == {float}:  # every record has it, a float: nearly always
                steps, values = at, got
            elif kinds <= _NO_METRIC:
                continue
            else:
                keep = [type(v) in (int, float) for v in got]
                steps = list(compress(at, keep))
                values = [float(min(max(v, -2**1000), 2**1000)) if type(v) is int else v  # no OverflowError
                          for v in compress(got, keep)]
            if name not in self.series:
                new.append((next(i for i, v in enumerate(got) if type(v) in (int, float)), name))
            points[name] = (steps, values)
        for _, name in sorted(new, key=lambda e: (e[0], METRICS_SHOWN_FIRST.index(e[1]))):
            self.series[name] = MinMaxSeries()
        for name, (steps, values) in points.items():
            self.series[name].add_many(steps, values)
        judged = [n for n in (*LOSS_NAMES, *GRAD_NAMES) if n in points]
        for d, step in zip(dicts, at) if judged else ():  # in the records' order: a grad spike before the loss's
            for name in judged:
                v = d.get(name)
                if type(v) is float or type(v) is int:
                    self.loss_health.feed(name, step, float(min(max(v, -2**1000), 2**1000)))

    def _feed(self, cols: StepColumns) -> None:
        """Steps to the statistics, the ledger and the detector, one call each (each reaches the same state
        whatever the size of the chunks it is fed)."""
        if not len(cols):
            return
        self.stats.add_columns(cols.step, cols.dt, cols.flags, cols.tokens, cols.padded, cols.t)
        self._account(cols.flags, cols.end)
        slow_ends = self.slow_step_ends
        for i, v in self.detector.add_columns(cols.step, cols.dt, cols.flags, cols.tokens, cols.padded):
            # when a fallback alert happened, from the file: its onset (a slow step)'s end
            step, se = cols.step[i], cols.end[i]
            se = None if se != se else se  # NaN: the end is unknown
            if step is not None and se is not None:
                slow_ends[step] = se
                if len(slow_ends) > SLOW_ENDS_KEPT:
                    del slow_ends[next(iter(slow_ends))]
            if v.state == FLAGGED and self.flagged_onset_end is None:
                self.flagged_onset_end = slow_ends.get(self.detector.onset_step)  # type: ignore[arg-type]

    def _account(self, flags: list[Any], ends: Any) -> None:
        """Each step's interval (its end less the previous step's end) to its account (:data:`_LEDGER_ACCOUNTS`).
        A step whose end is unknown or earlier than the previous one's is left out of every account."""
        if len(ends) >= _COLUMNS_FROM and self._account_columns(flags, ends):
            return
        last, acc, cnt = self.last_end, self.interval_s, self.interval_n
        for fl, end in zip(flags, ends):
            end = end if type(end) is float and 0.0 <= end < _UNIX_MAX else unix_time(end)
            if end is None or (last is not None and end < last):
                continue
            if last is None or (fl and FLAG_FIRST in fl):
                if self.first_end is None:
                    self.first_end = end
                last = end
                continue
            key = TRAINING
            if fl:
                key = next((k for f, k in _LEDGER_ACCOUNTS if f in fl), TRAINING)
            acc[key] = acc.get(key, 0.0) + (end - last)
            cnt[key] = cnt.get(key, 0) + 1
            last = end
        self.last_end = last

    def _account_columns(self, flags: list[Any], ends: Any) -> bool:
        """:meth:`_account` of a backlog's ends (:class:`StepColumns`' array: unix seconds, NaN when unknown) as
        arrays (False, nothing done: not such an array). The same sums to the last bit: each account's intervals
        are added in order (a cumulative sum is sequential), a step counts when its end is at least every known end
        before it (the previous step's end is then the largest so far)."""
        if not isinstance(ends, array) or ends.typecode != "d":
            return False
        import numpy as np  # noqa: PLC0415 - a backlog's cost only

        e = np.frombuffer(ends, dtype=np.float64)
        last = self.last_end
        before = np.fmax.accumulate(np.concatenate(([-_INF if last is None else last], e)))  # NaN: passed over
        counts = e >= before[:-1]
        valid = np.flatnonzero(counts)
        if not len(valid):
            return True
        if self.first_end is None:
            self.first_end = float(e[valid[0]])
        key_of: dict[int, str | None] = {}  # a flagged step: its account, None for a first step's (no interval)
        for j in compress(range(len(flags)), flags):
            fl = flags[j]
            key_of[j] = None if FLAG_FIRST in fl else next((k for f, k in _LEDGER_ACCOUNTS if f in fl), TRAINING)
        if last is None:
            key_of[int(valid[0])] = None  # the attempt's start
        interval = e[valid] - before[valid]
        groups: dict[str, Any] = {}  # account -> positions in valid, in order
        plain = np.arange(len(valid))
        if key_of:
            flagged = np.zeros(len(e), dtype=bool)
            flagged[list(key_of)] = True
            special = flagged[valid]
            spos = np.flatnonzero(special)
            for pos, j in zip(spos.tolist(), valid[spos].tolist()):
                if (k := key_of[j]) is not None:
                    groups.setdefault(k, []).append(pos)
            plain = np.flatnonzero(~special)
        if len(plain):
            groups[TRAINING] = np.union1d(plain, groups.get(TRAINING, [])).astype(np.int64)
        for k, pos in sorted(groups.items(), key=lambda kv: kv[1][0]):  # a new account where one step alone adds it
            vals = interval[pos]
            self.interval_s[k] = float(np.cumsum(np.concatenate(([self.interval_s.get(k, 0.0)], vals)))[-1])
            self.interval_n[k] = self.interval_n.get(k, 0) + len(vals)
        self.last_end = float(before[-1])
        return True


_gc_lock = threading.Lock()
_gc_pausers = 0  # threads inside gc_paused now
_gc_was_enabled = False  # what the first of them found


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (reference counting still frees everything),
    and back as it was once the last thread inside such a block leaves (observers refresh in
    several TUI workers at once: each must not restore what another found). Process-wide, hence
    for bulk reads only."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()
