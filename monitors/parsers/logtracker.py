"""Which shape of training log this is, and the run's step and metrics from it, whatever the shape.

:class:`LogTracker` is a :class:`~stepwatch.monitors.parsers.hf_progress.ProgressTracker` (the HF
Trainer / plain tqdm bar, its log dicts) that also knows Lightning's TQDM bar (``Epoch 3:  34%|…| 44/128``:
epoch-relative, made global with the bar's total) and the line shapes of
:mod:`~stepwatch.monitors.parsers.logformats` (nanoGPT, Lightning's Rich bar, JSON lines, ``step N``
lines). The first shape that reports a training step locks the ``format``; from then on only that
shape moves the step, so a data-loading bar, an evaluation bar or a tokenizer's ``Map`` bar in the
same log never does. Lines of another rank than the tracker's (0 by default: rank 0 speaks for the
run) never move it either; the supervisor keeps one tracker per other rank that prints prefixed lines.

Every numeric metric a recogniser captures is kept as a series per name over the whole run
(:class:`~stepwatch.monitors.stats.minmax.MinMaxSeries`: bins of steps with their min and max, so a
spike is never averaged away), and the latest of each in :attr:`last_metrics`; an evaluation line's loss is ``eval_loss``. Summary
dicts printed at the end (``train_loss``, ``train_runtime``) never replace the training metrics.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

from stepwatch.monitors.parsers.epochscope import EpochScope
from stepwatch.monitors.parsers.barroles import TRAINING_BARS
from stepwatch.monitors.parsers.hf_progress import ProgressTracker, StepAdvance, parse_progress
from stepwatch.monitors.parsers.phases import MAX_PHASE_LINE_CHARS, LogPhases, bar_phase, line_phase
from stepwatch.monitors.parsers.logformats import (MAX_LINE_CHARS, RECOGNISERS, LineStep, UserPattern,
                                                   compile_patterns, compile_phase_lines, eval_metrics, lightning_rich, pairs, recognise,
                                                   strip_escapes, user_pattern)
from stepwatch.monitors.readers.rankprefix import rank_prefix
from stepwatch.monitors.runfiles import RUN_JSON, read_json
from stepwatch.monitors.detectors.losshealth import LossHealth
from stepwatch.monitors.stats.minmax import MinMaxSeries
from stepwatch.monitors.states import EVALUATING, SAVING

FORMAT_TQDM = "tqdm"  #: a tqdm bar: the HF Trainer's, accelerate's, a plain loop's (any description)
FORMAT_LIGHTNING_TQDM = "lightning_tqdm"  #: Lightning's TQDM bar, ``Epoch N`` (its counter restarts each epoch)
FORMAT_EPOCH_TQDM = "tqdm_epochs"  #: a plain loop's bar per epoch (``tqdm(desc=f"Epoch {e}/{E}")``)
FORMAT_HF_LOGDICT = "hf_logdict"  #: the HF Trainer's log dicts with no bar (``disable_tqdm=True``)
#: Every format name, as ``status --json`` ``log.format`` says it.
FORMATS = (FORMAT_TQDM, FORMAT_LIGHTNING_TQDM, FORMAT_EPOCH_TQDM, FORMAT_HF_LOGDICT, *RECOGNISERS)

#: A bar's description that names its epoch (and how many, ``Epoch 3/10``): its counter restarts every epoch.
_EPOCH_DESC = re.compile(r"^(?:train(?:ing)?\s*[-:]?\s*)?epoch\s*[:#]?\s*(\d{1,9})(?:\s*/\s*(\d{1,9}))?$", re.I)
#: Text that looks like a progress bar, recognised or not (Rich's bar glyphs, a rate).
_BAR_LIKE = re.compile(r"━|it/s|s/it")


@dataclass(frozen=True, slots=True)
class LogSettings:
    """What the run config's ``[log]`` table says that the log may not: ``max_steps`` (the run's total
    where the log never prints it), ``epochs`` (how many epochs an epoch-scoped counter runs) and
    ``logging_steps`` (optimizer steps per printed HF Trainer log dict when no bar is drawn; 1 by default); and the
    run's own words for an evaluation or a save (``eval_lines``, ``save_lines``: patterns, compiled in RE2), which
    a line is matched against before the words of the programs this knows (monitors/parsers/phases.py)."""

    #: the ``[log]`` keys the run config accepts: the user's own step ``patterns`` (regexes with named groups step,
    #: max_steps, dt_s and any metric; monitors/runsettings.py keeps them compiled) and ``examples`` the checklist
    #: tries them on before there is a log, and the fields below
    KEYS: ClassVar[tuple[str, ...]] = ("patterns", "examples", "max_steps", "epochs", "logging_steps", "eval_lines",
                                       "save_lines")

    max_steps: int | None = None
    epochs: int | None = None
    logging_steps: int = 1
    eval_lines: tuple[UserPattern, ...] = ()
    save_lines: tuple[UserPattern, ...] = ()

    def line_phase(self, body: str) -> str | None:
        """The phase a line announces: the run's own save or evaluation words first, then the known programs'."""
        if len(body) <= MAX_PHASE_LINE_CHARS:
            if any(rx.search(body) for rx in self.save_lines):
                return SAVING
            if any(rx.search(body) for rx in self.eval_lines):
                return EVALUATING
        return line_phase(body)
#: The first line Lightning's Trainer prints (lightning 2.x, tests/fixtures/real/lightning_*.log).
LIGHTNING_BANNER = "GPU available: "
#: Metric names kept at most, and bins per metric series (the whole run: bins merge as it grows).
MAX_SERIES = 64
#: Keys of the HF Trainer's end-of-run summary dict: never training metrics.
_SUMMARY_KEYS = ("train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second")


def is_summary(d: dict) -> bool:
    """The HF Trainer's end-of-run summary (``train_loss``, ``train_runtime`` …), not a training log
    dict. A training dict carries ``loss`` and, with ``include_num_input_tokens_seen``, the
    ``train_runtime`` so far too (transformers 4.5x): the summary is the one with ``train_loss``, or
    with summary keys and no ``loss``."""
    return "train_loss" in d or ("loss" not in d and any(k in d for k in _SUMMARY_KEYS))


class LogTracker(ProgressTracker):
    """Feed train.log's segments (as a ProgressTracker); ``format`` is the shape in force (None
    before any step), ``matched_lines`` how many of its lines moved or restated the step."""

    def __init__(self, patterns: list[UserPattern] = (), settings: LogSettings | None = None,  # type: ignore[assignment]
                 **kw) -> None:
        kw.setdefault("desc", TRAINING_BARS)
        super().__init__(**kw)
        self.patterns = list(patterns)
        self.settings = settings or LogSettings()
        self.scope = EpochScope()  # an epoch-scoped counter's epochs
        self.train_dicts = 0  # HF Trainer training log dicts (hf_logdict: each is logging_steps steps)
        self.bar_like_seen = False  #: text that looks like a progress bar (recognised or not)
        self.phases = LogPhases()  #: what the run is doing, as its log says
        self.format: str | None = None
        self.matched_lines = 0
        self.series: dict[str, MinMaxSeries] = {}  # the whole run per metric, min and max kept per bin
        self.loss_health = LossHealth()  # the training loss's values judged as they come (issue 47)
        self.last_metrics: dict[str, tuple[int | None, float]] = {}
        self._last_dict_step: int | None = None  # the last training log dict's own step ([log] logging_steps)
        self._line_at: tuple[float | None, int | None, bool] | None = None  # the current step's first arrival
        self._tail = False
        self.lines_seen = 0  #: complete lines fed
        self.lines_at_other_bar: int | None = None  #: lines_seen when a bar that is not training's last moved
        self.lightning_seen = False  #: Lightning's Trainer announced itself ("GPU available: ...")
        self._relabel: list[str] | None = None  # the last log dict's names, until the bar's redraw after it

    def feed(self, seg) -> list[StepAdvance]:
        """One segment; an unterminated one (the follower's tail) only as a bar: a line a
        recogniser reads is whole only at its newline."""
        self._tail = getattr(seg, "end", "\n") == ""
        if not self._tail and not getattr(seg, "is_note", False):
            self.lines_seen += 1
        others = self.other_bars
        try:
            return super().feed(seg)
        finally:
            self._tail = False
            if self.other_bars != others:
                self.lines_at_other_bar = self.lines_seen

    def feed_text(self, text: str, at_s: float | None = None, *, poll_seq: int | None = None,
                  live: bool = True) -> list[StepAdvance]:
        """One segment's text (see :class:`ProgressTracker`); the phase it shows is kept (:attr:`phases`)."""
        others = self.other_bars
        advs = self._read(text, at_s, poll_seq=poll_seq, live=live)
        if any(a.prev_step is None or a.step > a.prev_step for a in advs):
            self.phases.stepped(at_s, self.finished)
        elif self.other_bars != others and self.last_other is not None and self.last_other.rank in (None, self.rank):
            if (ph := bar_phase(self.last_other.desc, self.bar_desc)) is not None:
                self.phases.saw(ph, at_s)
        elif text and not advs and "%|" not in text:
            rank, body = rank_prefix(text)
            if rank in (None, self.rank) and (ph := self.settings.line_phase(strip_escapes(body))) is not None:
                self.phases.saw(ph, at_s)
        return advs

    def _read(self, text: str, at_s: float | None, *, poll_seq: int | None, live: bool) -> list[StepAdvance]:
        if not text:
            return []
        rank, body = rank_prefix(text)
        body = strip_escapes(body)
        if not self.lightning_seen and body.startswith(LIGHTNING_BANNER):
            self.lightning_seen = True
        if rank not in (None, self.rank):
            return super().feed_text(text, at_s, poll_seq=poll_seq, live=live) if self.format == FORMAT_TQDM else []
        if self.patterns and (self.format is None or self.format.startswith("pattern ")) and len(body) <= MAX_LINE_CHARS:
            for i, rx in enumerate(self.patterns, 1):  # the user's own patterns first, on any line
                ls = user_pattern(rx, body) if self.format in (None, f"pattern {i}") else None
                if ls is not None:
                    self.format = f"pattern {i}"
                    return self._line(ls, ls.metrics, at_s, poll_seq, live)
            if self.format is not None:
                return []
        if not self.bar_like_seen and _BAR_LIKE.search(body):
            self.bar_like_seen = True
        u = parse_progress(body) if "[" in body and "]" in body else None
        if u is not None and u.total and u.iter_unit == "it" and (m := _EPOCH_DESC.match(u.desc)):
            fmt = FORMAT_LIGHTNING_TQDM if self.lightning_seen else FORMAT_EPOCH_TQDM  # the same reading, named
            if self.format not in (None, fmt) or u.step > u.total:
                return []
            self.format = fmt
            epoch = int(m.group(1))
            step = self.scope.global_step(epoch, u.step, u.total)
            if u.step == 0 and self.global_step is not None and step < self.global_step:
                return []  # the bar's reset at an epoch's start, drawn before its new "Epoch N" desc
            epochs = int(m.group(2)) if m.group(2) else self.settings.epochs
            self.total = self.scope.total(epochs, epoch, u.total) or self.settings.max_steps
            # the postfix (Lightning's metrics) inside the bar's brackets: text glued after them is not its
            return self._advance(step, None, None, pairs(u.postfix), at_s, poll_seq, live)
        if u is None and self._tail:  # a line is whole only at its newline, but for a bar drawn in place:
            # Rich writes the newline *before* its next frame, so the newest frame is the tail (a hung run's
            # last step); its step and total are whole once it matched through "it/s", its metrics may not be
            ls = lightning_rich(body) if self.format in (None, "lightning_rich") else None
            if ls is None or ls.step == self.global_step:
                return []
            self.format = "lightning_rich"
            return self._line(ls, {}, at_s, poll_seq, live)
        if u is None and self.format in (None, *RECOGNISERS):
            got = recognise(body, self.format)
            if got is not None:
                self.format = got[0]
                return self._line(got[1], got[1].metrics, at_s, poll_seq, live)
            ev = eval_metrics(body)
            if ev:
                self._record(ev)
        if self.format not in (None, FORMAT_TQDM, FORMAT_HF_LOGDICT):
            return []
        if self.format == FORMAT_HF_LOGDICT or (self.format is None and u is None and "{" in body):
            return self._hf_logdict(text, at_s, poll_seq, live)

        n_logs, bar_before = self.n_logs, self.last  # a count, not len(logs): that stops growing at keep
        # tqdm's cursor moves ride on the next line: the Trainer's eval dict comes as "\x1b[A{'eval_loss': ..."
        advs = super().feed_text(strip_escapes(text), at_s, poll_seq=poll_seq, live=live)
        if advs:
            self.format = FORMAT_TQDM
            self.matched_lines += 1
        if self.last is not bar_before and self.last is not None and self.last.postfix:
            self._record(pairs(self.last.postfix))  # set_postfix(loss=...): the bar's own metrics
        relabel, self._relabel = self._relabel, None
        if self.n_logs != n_logs:  # a printed Trainer log dict
            d = self.logs[-1][1]
            if not is_summary(d) and (at := self._dict_step(d)) is not None:
                self._record(d, at)  # [log] logging_steps: the dict's own step, whatever the bar shows
            elif not is_summary(d):
                self._record(d)
                self._relabel = [k for k in d if k in self.series]
        elif relabel and self.last is not bar_before and self.global_step is not None:
            # tqdm.write redraws the bar right after the dict: its step is the dict's (the bar on file lagged
            # by up to tqdm's mininterval when the Trainer printed it)
            for k in relabel:
                if self.last_metrics[k][0] is not None and self.last_metrics[k][0] < self.global_step:
                    self.last_metrics[k] = (self.global_step, self.last_metrics[k][1])
                    self.series[k].restep_last(self.global_step)
                    self.loss_health.restep_last(k, self.global_step)
        return advs

    def _hf_logdict(self, text: str, at_s: float | None, poll_seq: int | None, live: bool) -> list[StepAdvance]:
        """The HF Trainer with no bar (``disable_tqdm=True``): each training log dict (it has ``loss``
        and ``epoch``; an evaluation's or the summary never) is ``logging_steps`` optimizer steps (the
        run config's ``[log] logging_steps``, 1 by default: the dicts carry no step of their own). The
        shape is taken at the second such dict with no training bar drawn before it."""
        n_logs = self.n_logs
        super().feed_text(strip_escapes(text), at_s, poll_seq=poll_seq, live=live)
        if self.n_logs == n_logs:
            return []
        d = self.logs[-1][1]
        if is_summary(d):
            return []
        if "loss" not in d or "epoch" not in d:  # an evaluation's dict: its metrics, no step
            self._record(d)
            return []
        self.train_dicts += 1
        if self.train_dicts < 2 or self.last is not None:
            # one dict is no shape yet (a bar may follow it), and a bar is the better signal; [log] logging_steps
            # says this one's step before any bar shows
            every = self.settings.logging_steps
            self._record(d, self.train_dicts * every if every > 1 and self.last is None else None)
            return []
        self.format = FORMAT_HF_LOGDICT
        return self._advance(self.train_dicts * self.settings.logging_steps, None, None, d, at_s, poll_seq, live)

    def _line(self, ls: LineStep, metrics: dict[str, float], at_s: float | None, poll_seq: int | None,
              live: bool) -> list[StepAdvance]:
        """One line's step: an epoch-scoped counter made global (:class:`EpochScope`), its total where known."""
        if ls.epoch is None or ls.epoch_step is None or not ls.steps_per_epoch:
            return self._advance(ls.step, ls.max_steps, ls.reported_dt_s, metrics, at_s, poll_seq, live)
        step = self.scope.global_step(ls.epoch, ls.epoch_step, ls.steps_per_epoch)
        if ls.max_steps and ls.epochs is None:
            self.total = ls.max_steps  # a pattern's own max_steps group
        else:
            self.total = (self.scope.total(ls.epochs or self.settings.epochs, ls.epoch, ls.steps_per_epoch,
                                           ls.total_is_steps_left) or self.settings.max_steps)
        return self._advance(step, None, ls.reported_dt_s, metrics, at_s, poll_seq, live)

    def _dict_step(self, d: dict) -> int | None:
        """A training log dict's own step where ``[log] logging_steps`` (> 1) says it: the Trainer logs at each
        multiple, so the dict after the one at step N is at N + logging_steps, and the first is counted from the
        start (with those read before any bar frame). A count far (over two intervals) from the bar is a resumed
        run's: the dict is at the multiple nearest the bar. None without it: the bar's step is the label (under
        ``torchrun --tee`` a rank's bar and dicts are tailed apart, so the bar may be a few steps off either way)."""
        every = self.settings.logging_steps
        if every <= 1 or "loss" not in d or "epoch" not in d:
            return None
        bar = self.global_step
        nxt = (self._last_dict_step if self._last_dict_step is not None else self.train_dicts * every) + every
        self._last_dict_step = nxt if bar is None or abs(nxt - bar) <= 2 * every else max(
            every, round(bar / every) * every)
        return self._last_dict_step

    def _record(self, metrics: dict[str, float], step: int | None = None) -> None:
        at = self.global_step if step is None else step
        for k, v in metrics.items():
            if k not in self.series:
                if len(self.series) >= MAX_SERIES:
                    continue
                self.series[k] = MinMaxSeries()
            self.series[k].add(at, v)
            self.loss_health.feed(k, at, v)
            self.last_metrics[k] = (at, v)

    def _advance(self, step: int, max_steps: int | None, reported_dt_s: float | None, metrics: dict[str, float],
                 at_s: float | None, poll_seq: int | None, live: bool) -> list[StepAdvance]:
        prev = self.global_step
        self.matched_lines += 1
        if max_steps:
            self.total = max_steps
        elif self.total is None and self.settings.max_steps:
            self.total = self.settings.max_steps
        if prev is not None and step == prev:
            self._record(metrics)  # a redraw with a new postfix (Lightning prints the loss after the step)
            return []
        self.finished = bool(self.total and step >= self.total)
        dt: float | None = reported_dt_s
        timed = at_s is not None and live
        if dt is None and prev is not None and step == prev + 1 and timed and self._line_at is not None:
            f_at, f_seq, f_live = self._line_at
            if f_live and f_at is not None and (poll_seq is None or f_seq != poll_seq) and at_s - f_at > 0:
                dt = at_s - f_at
        if dt is not None and math.isfinite(dt) and prev is not None and step > prev:
            self.step_times.append((step, dt))
        self.global_step = step
        self._line_at = (at_s, poll_seq, timed)
        self._record(metrics)
        return [StepAdvance(step, prev, dt, at_s, reported_dt_s)]


def own_run_record(run_dir: Path) -> dict:
    """run.json as read only when this process's user owns it (another user's file is never trusted with
    what runs on every log line); {} otherwise."""
    try:
        return read_json(Path(run_dir) / RUN_JSON, os.geteuid()) or {}
    except OSError:
        return {}


def run_patterns(run_dir: Path) -> list[UserPattern]:
    """The run config's ``[log] patterns`` as this user's own run.json records them, compiled (in RE2: linear
    in the line); [] otherwise or when they do not compile."""
    return patterns_of(own_run_record(run_dir))


def settings_of(run: dict) -> LogSettings:
    """``[log]`` max_steps, epochs and logging_steps of a run record; the defaults where absent or invalid."""
    log = (run.get("config") or {}).get("log") if isinstance(run.get("config"), dict) else None
    try:
        return log_settings(log) if isinstance(log, dict) else LogSettings()
    except ValueError:
        return LogSettings()


def log_settings(log: dict) -> LogSettings:
    """The ``[log]`` table's settings; ValueError naming a bad one (the counts each a whole number from 1, the
    phase lines a list of patterns RE2 compiles)."""
    got: dict[str, int] = {}
    for key in ("max_steps", "epochs", "logging_steps"):
        v = log.get(key)
        if v is None:
            continue
        if type(v) is not int or not 0 < v < 10**12:
            raise ValueError(f"{key} must be a whole number from 1; got {v!r}")
        got[key] = v
    return LogSettings(got.get("max_steps"), got.get("epochs"), got.get("logging_steps", 1),
                       compile_phase_lines(log["eval_lines"], "eval_lines") if "eval_lines" in log else (),
                       compile_phase_lines(log["save_lines"], "save_lines") if "save_lines" in log else ())


def patterns_of(run: dict) -> list[UserPattern]:
    """``[log] patterns`` of a run record (the supervisor's own, from its launcher), compiled; []
    when there are none or they do not compile."""
    log = (run.get("config") or {}).get("log") if isinstance(run.get("config"), dict) else None
    try:
        return compile_patterns(log.get("patterns", [])) if isinstance(log, dict) else []
    except ValueError:
        return []


#: Lines of log read with no shape recognised before the views say what to add.
HINT_AFTER_LINES = 50


def log_hint(t: LogTracker, steps_from_events: bool) -> str | None:
    """What to do when no shape reads this log (None while one does, or the emitter speaks)."""
    if t.format is not None or steps_from_events:
        return None
    if t.lines_at_other_bar is not None and t.lines_seen - t.lines_at_other_bar < HINT_AFTER_LINES:
        # a tokenizer's, a download's, a data-loading bar moved lately: training has not begun
        return f"waiting for the first training step ({t.lines_seen} lines of preprocessing)"
    if t.lightning_seen and t.lines_seen >= 5 and not t.bar_like_seen:
        return ("Lightning's progress bar is not in the log: its RichProgressBar draws into a file only while Rich "
                "takes it for a terminal (stepwatch sets TTY_INTERACTIVE=1 and TTY_COMPATIBLE=1 unless the run's "
                "env sets them); use TQDMProgressBar, or stepwatch.telemetry")
    if t.lines_seen >= HINT_AFTER_LINES and t.bar_like_seen:
        return (f"a progress bar is in the log but not a shape stepwatch knows ({t.lines_seen} lines): add [log] "
                "patterns to the run config (README: Reading any training log), or use stepwatch.telemetry")
    if t.lines_seen >= HINT_AFTER_LINES:
        return (f"no known shape matched {t.lines_seen} lines of the log: add [log] patterns to the run config "
                "(README: Reading any training log), or use stepwatch.telemetry")
    return None
