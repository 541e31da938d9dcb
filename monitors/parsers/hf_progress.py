"""Step numbers and approximate step times from HF Trainer / tqdm progress output in ``train.log``.

For runs without the telemetry emitter (ARCHITECTURE.md, "A step from the log to the screen"). What
is parsed, as it appears in the real captures under ``tests/fixtures/real/`` (torch 2.13, transformers 5.24,
tqdm 4.70):

* tqdm bars, written as ``\\r`` + bar and never ended by ``\\n`` while running::

      ' 10%|█         | 6/60 [00:00<00:00, 56.05it/s]'       (it/s form)
      '  5%|▌         | 1/20 [00:01<00:32,  1.73s/it]'       (s/it form: slower than 1 step/s)
      '  0%|          | 0/60 [00:00<?, ?it/s]'               (first update)
      'Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 175.41it/s]'   (another bar)

  bars of any width (the TTY capture fills 120 columns), with or without a ``desc:``, a postfix, a
  rank prefix (``[rank3]:`` / ``[default3]:``) and trailing text glued on (a dynamo record).
* printed log dicts: transformers 5 prints values formatted ``.4g`` as STRINGS, ints unquoted:
  ``{'loss': '5.558', 'grad_norm': '0.6336', 'learning_rate': '0.0009273', 'epoch': '0.1667'}``;
  parsed with :func:`ast.literal_eval` (:mod:`.hf_logdict`), values turned into floats.
* the final ``TrainOutput(global_step=60, ...)`` line.

Step times here are APPROXIMATE: they are arrival times of bar updates seen by a tailer (the poll
latency is in them, and tqdm only redraws every ``mininterval`` = 0.1 s, so fast steps are never seen
one by one). Where the emitter's ``events.jsonl`` has ``step`` events, events win.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from stepwatch.monitors.parsers.barroles import ROLE_OTHER, TRAINING_BARS, bar_role
from stepwatch.monitors.parsers.barstreams import BarStreams
from stepwatch.monitors.parsers.hf_logdict import parse_log_dict, parse_train_output
from stepwatch.monitors.readers.rankprefix import rank_prefix

__all__ = [
    "ProgressUpdate",
    "StepAdvance",
    "ProgressTracker",
    "parse_progress",
    "parse_log_dict",
    "parse_train_output",
    "parse_interval_s",
]

_SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}

# tqdm's default bar format: '{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]'
# with l_bar = '{desc}: {percentage:3.0f}%|' (or '{percentage:3.0f}%|' without desc).
_BAR = re.compile(
    r"(?P<desc>.*?)(?P<pct>\d{1,3})%\|(?P<bar>[^|]*)\|\s*"
    r"(?P<n>\d{1,12})/(?P<total>\d{1,12})\s*"
    r"\[(?P<elapsed>[^<,\]]+?)(?:<(?P<remaining>[^,\]]+?))?,\s*"
    r"(?P<rate>\?|\d{1,15}(?:\.\d{1,15})?)(?P<si>[kMGTP]?)(?P<unit>[A-Za-z_]+/s|s/[A-Za-z_]+)"
    r"(?P<postfix>[^\]]*)\]"
)
# no total: '{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]', e.g. '25it [00:03, 7.12it/s]'
# Every count has a bound (a step below 10**12, as monitors/parsers/logformats.py reads it) and starts where a run of
# digits starts: a 32 KiB line of digits is read in linear time and never reaches int()'s 4300-digit limit.
_BAR_NO_TOTAL = re.compile(
    r"(?P<desc>.*?)(?<!\d)(?P<n>\d{1,12})(?P<uname>[A-Za-z_]+) "
    r"\[(?P<elapsed>\d{1,9}:\d\d(?::\d\d)?),\s*"
    r"(?P<rate>\?|\d{1,15}(?:\.\d{1,15})?)(?P<si>[kMGTP]?)(?P<unit>[A-Za-z_]+/s|s/[A-Za-z_]+)"
    r"(?P<postfix>[^\]]*)\]"
)


def parse_interval_s(text: str | None) -> float | None:
    """tqdm's ``MM:SS`` / ``H:MM:SS`` (hours may exceed 24) -> seconds; ``?`` or junk -> None."""
    if not text:
        return None
    text = text.strip()
    parts = text.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    s = 0
    for p in parts:
        s = s * 60 + int(p)
    return float(s)


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    """One tqdm bar update.

    Attributes:
        step: the counter ``n`` (for the HF Trainer training bar: ``state.global_step``).
        total: the bar's total (``max_steps`` for the Trainer), None for a bar without a total.
        elapsed_s: tqdm's elapsed time, seconds (1 s resolution).
        remaining_s: tqdm's remaining estimate, seconds; None while it prints ``?``.
        rate: the rate as printed, in ``unit``; None while it prints ``?``.
        unit: ``"it/s"`` or ``"s/it"`` as printed (tqdm flips to ``s/it`` below 1 it/s; other units
            such as ``"examples/s"`` come from other bars).
        desc: the bar's description without the trailing ``:`` (``""`` for the Trainer's bar).
        percent: the printed percentage, None without a total.
        rank: from a ``[rankN]:`` / ``[defaultN]:`` prefix, else None.
        postfix: what ``set_postfix`` added after the rate (``, loss=0.123, lr=1e-4``), as printed.
    """

    step: int
    total: int | None
    elapsed_s: float | None
    remaining_s: float | None
    rate: float | None
    unit: str
    desc: str = ""
    percent: int | None = None
    rank: int | None = None
    postfix: str = ""

    @property
    def seconds_per_step(self) -> float | None:
        """tqdm's smoothed rate as seconds per iteration (EMA, not one step's time); None if unknown."""
        if self.rate is None or self.rate <= 0:
            return None
        if self.unit.startswith("s/"):
            return self.rate
        return 1.0 / self.rate

    @property
    def iter_unit(self) -> str:
        """The iteration unit name (``it`` for ``it/s`` and ``s/it``)."""
        return self.unit[:-2] if self.unit.endswith("/s") else self.unit[2:]


def parse_progress(text: str) -> ProgressUpdate | None:
    """Parse one tqdm bar from the start of a segment; None when the segment is not a bar.

    Text glued after the closing ``]`` (e.g. a dynamo log record with no newline before it, as in
    ``hf_trainer_compile.log``) is ignored. Never raises.
    """
    if "[" not in text or "]" not in text:
        return None
    rank, rest = rank_prefix(text)
    if "%|" in rest:
        m = _BAR.match(rest)
        if m is None:
            return None
        total: int | None = int(m.group("total"))
        percent: int | None = int(m.group("pct"))
        remaining = parse_interval_s(m.group("remaining"))
    else:
        m = _BAR_NO_TOTAL.match(rest)
        if m is None:
            return None
        total = None
        percent = None
        remaining = None
    desc = m.group("desc").strip()
    if desc.endswith(":"):
        desc = desc[:-1].rstrip()
    rate_s = m.group("rate")
    rate = None if rate_s == "?" else float(rate_s) * _SI.get(m.group("si"), 1.0)
    return ProgressUpdate(
        step=int(m.group("n")),
        total=total,
        elapsed_s=parse_interval_s(m.group("elapsed")),
        remaining_s=remaining,
        rate=rate,
        unit=m.group("unit"),
        desc=desc,
        percent=percent,
        rank=rank,
        postfix=m.group("postfix"),
    )


class _SegmentLike(Protocol):
    text: str
    at_s: float
    poll_seq: int
    backfill: bool
    is_note: bool

    @property
    def end(self) -> str:  # read-only here, so a Segment's narrower ``End`` (a Literal of str) fits
        ...


@dataclass(frozen=True, slots=True)
class StepAdvance:
    """The training bar's counter moved forward.

    Attributes:
        step: the new global_step.
        prev_step: the step before (None for the first update seen).
        dt_s: seconds between the first arrival of ``prev_step`` and of ``step`` -- only when the
            counter advanced by exactly 1 between two consecutive updates that arrived in different
            polls of a live tail; otherwise None. Approximate (tail latency, poll spacing); events win.
        at_s: arrival time (unix seconds) of the update, None when unknown.
        reported_dt_s: the step's time as the program itself printed it (nanoGPT's ``time``), None
            when the line does not say (see :mod:`stepwatch.monitors.parsers.logtracker`).
    """

    step: int
    prev_step: int | None
    dt_s: float | None
    at_s: float | None
    reported_dt_s: float | None = None


class ProgressTracker:
    """Turn a stream of log segments into global_step, total, tqdm's rate, step times and log dicts.

    Feed it every segment of ``train.log`` in order (``feed(seg)``; notes are skipped), and after
    each poll also ``follower.partial_segment`` (the latest bar is unterminated until the next one
    comes): feeding the same bar again is a no-op.

    Which bar is the training bar: a bar whose ``desc`` equals ``desc`` (``""`` for the HF Trainer,
    whose bar has no description; ``None`` accepts any desc; :data:`TRAINING_BARS` judges by the
    description's words, :meth:`_desc_is_training`), whose iteration unit is ``it``, from
    ``rank`` (a bar with another rank prefix is ignored; unprefixed bars are accepted). Among those,
    the tracker locks onto a total: ``expected_total`` (e.g. ``max_steps`` from run_start) if given,
    else the first total seen, switching to a strictly larger total if one appears (the Trainer's
    evaluation bar also has no desc, but its total is the number of eval batches). Bars such as
    ``Writing model shards:`` never move global_step.

    Step times (``StepAdvance.dt_s`` and :attr:`step_times`) are APPROXIMATE -- arrival times of
    consecutive updates that differ by exactly one step, seen live (``backfill`` segments from the
    attach window and updates that arrived in the same poll give none). tqdm redraws at most every
    0.1 s, so runs faster than ~10 steps/s yield few. Events (``events.jsonl``) win where they exist.

    Attributes:
        global_step: latest training-bar counter (or the ``TrainOutput`` global_step), None before.
        total: the locked total (max_steps), None before.
        last: the latest training-bar :class:`ProgressUpdate`.
        rate, unit: tqdm's rate as printed in the latest update (``it/s`` flips to ``s/it``).
        step_times: ``deque[tuple[int, float]]`` of (step, seconds), the last ``keep`` durations.
        logs: ``deque[tuple[int | None, dict[str, float]]]`` of (global_step when printed -- it may
            lag by the updates tqdm skipped --, log dict), the last ``keep``.
        last_log: the latest log dict that was not the final summary.
        summary: the final summary dict (the one with ``train_loss``), None before.
        finished: True once the bar reached its total or ``TrainOutput`` was printed.
    """

    def __init__(
        self,
        *,
        desc: str | None = "",
        rank: int | None = 0,
        expected_total: int | None = None,
        keep: int = 10_000,
    ) -> None:
        self.desc = desc
        self.rank = rank
        self.expected_total = expected_total
        self.total: int | None = expected_total
        self.global_step: int | None = None
        self.last: ProgressUpdate | None = None
        self.step_times: deque[tuple[int, float]] = deque(maxlen=keep)
        self.logs: deque[tuple[int | None, dict[str, float]]] = deque(maxlen=keep)
        self.n_logs = 0  # log dicts seen in all (``logs`` keeps the last ``keep``)
        self.last_log: dict[str, float] | None = None
        self.summary: dict[str, float] | None = None
        self.finished = False
        self.other_bars = 0  # updates of bars that are not the training bar
        self.last_other: ProgressUpdate | None = None
        self.bar_desc: str | None = None  # with desc=TRAINING_BARS: the training bar's description
        self.streams = BarStreams() if desc == TRAINING_BARS else None  # several processes' bars, told apart
        self._rejected_totals: set[int] = set()  # larger totals judged to be evaluation bars
        # first arrival of the current counter value: (at_s, poll_seq, live)
        self._first_seen: tuple[float | None, int | None, bool] | None = None

    @property
    def rate(self) -> float | None:
        return self.last.rate if self.last else None

    @property
    def unit(self) -> str | None:
        return self.last.unit if self.last else None

    def is_training_bar(self, u: ProgressUpdate) -> bool:
        """Whether ``u`` belongs to the training bar (see the class docstring); may lock the total."""
        if self.desc == TRAINING_BARS:
            if not self._desc_is_training(u):
                return False
        elif self.desc is not None and u.desc != self.desc:
            return False
        if u.iter_unit != "it":
            return False
        if self.rank is not None and u.rank is not None and u.rank != self.rank:
            return False
        if u.total is None:
            return self.total is None
        if self.total is None:
            self.total = u.total
            return True
        if u.total == self.total:
            return True
        if self.expected_total is None and u.total > self.total and u.total not in self._rejected_totals:
            if not (self.finished or not self.global_step or u.step > self.global_step):
                # a bar with more batches, first seen behind the locked bar's counter while that bar
                # is under way: an evaluation mid-training (it starts at 0), never the training bar
                self._rejected_totals.add(u.total)
                return False
            # We locked onto a smaller (evaluation?) bar first, which is done, never moved, or is
            # behind this one: the larger one is the training bar.
            self.total = u.total
            self._first_seen = None
            self.finished = False
            if self.streams is not None:
                self.streams = BarStreams()
            return True
        return False

    def _desc_is_training(self, u: ProgressUpdate) -> bool:
        """``desc=TRAINING_BARS``: the first bar of a training or neutral description is locked on (its
        desc: :attr:`bar_desc`); a bar of another description takes over when it names training and the
        locked one does not, when the locked bar ran to its end and this one starts (a preparation bar
        before the training loop's), or when it speaks the same way with a larger total (the inner loop of
        ``trange(3, desc="Epoch")`` around ``tqdm(loader, desc="Iteration")``). Never an eval/save bar."""
        role = bar_role(u.desc)
        if role == ROLE_OTHER or u.iter_unit != "it":
            return False
        if self.bar_desc is None or u.desc == self.bar_desc:
            self.bar_desc = u.desc
            return True
        locked = bar_role(self.bar_desc)
        inner = role == locked and u.total is not None and self.total is not None and u.total > self.total
        if role > locked or inner or (self.finished and role == locked and (u.total is None or u.step < u.total)):
            self.bar_desc, self.total, self.finished, self._first_seen = u.desc, self.expected_total, False, None
            self._rejected_totals.clear()
            self.streams = BarStreams()  # another bar: its counter starts its own streams
            return True
        return False

    def feed(self, seg: _SegmentLike) -> list[StepAdvance]:
        """Feed one :class:`stepwatch.monitors.readers.textlog.Segment` (or anything with the same attributes)."""
        if getattr(seg, "is_note", False):
            return []
        live = not getattr(seg, "backfill", False)
        return self.feed_text(seg.text, at_s=getattr(seg, "at_s", None), poll_seq=getattr(seg, "poll_seq", None), live=live)

    def feed_text(
        self,
        text: str,
        at_s: float | None = None,
        *,
        poll_seq: int | None = None,
        live: bool = True,
    ) -> list[StepAdvance]:
        """Feed one segment's text with its arrival time (unix seconds; None: unknown, no dt).

        ``poll_seq`` identifies the read it came in (updates from the same read give no dt);
        ``live=False`` marks history (no dt). Returns the advances it caused (0 or 1).
        """
        if not text:
            return []
        u = parse_progress(text)
        if u is None:
            self._other_text(text)
            return []
        if not self.is_training_bar(u):
            self.other_bars += 1
            self.last_other = u  # an evaluation's, a save's, a tokenizer's bar: what the run is doing
            return []
        own = u.rank is not None and u.rank == self.rank
        if self.streams is not None and not self.streams.is_headline(u.step, self.finished, own):
            return []  # another process's bar in the same log: its own stream, never the run's step
        self.last = u
        prev = self.global_step
        if u.total is not None and u.step >= u.total:
            self.finished = True
        elif prev is not None and u.step < prev:
            self.finished = False  # the counter went back: a new bar (a second train(), a resume)
        if prev is not None and u.step == prev:
            return []  # a redraw: after a log dict, the final summary bar printed twice, a re-fed partial
        timed = at_s is not None and live
        adv_dt: float | None = None
        if prev is not None and u.step == prev + 1 and timed and self._first_seen is not None:
            f_at, f_seq, f_live = self._first_seen
            if f_live and f_at is not None and (poll_seq is None or f_seq is None or poll_seq != f_seq):
                dt = at_s - f_at  # type: ignore[operator]
                if dt > 0:
                    adv_dt = dt
                    self.step_times.append((u.step, dt))
        # a counter that went back means a new bar (a second train() call, a resumed run): no dt
        self.global_step = u.step
        self._first_seen = (at_s, poll_seq, timed)
        return [StepAdvance(u.step, prev, adv_dt, at_s)]

    def _other_text(self, text: str) -> None:
        rank, _ = rank_prefix(text)
        if self.rank is not None and rank is not None and rank != self.rank:
            return  # another rank's log dict or TrainOutput is never this tracker's (rank 0 speaks for the run)
        if "{" in text:
            d = parse_log_dict(text)
            if d:  # a dict without a number (the model card's) is no training log
                if "train_loss" in d:
                    self.summary = d
                else:
                    self.last_log = d
                self.logs.append((self.global_step, d))
                self.n_logs += 1
                return
        if "TrainOutput(" in text:
            gs = parse_train_output(text)
            if gs is not None:
                self.global_step = gs
                self.finished = True
