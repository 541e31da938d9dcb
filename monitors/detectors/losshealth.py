"""Loss health (issue 47): whether the training loss the run logs went bad, judged on the run's own spread (R11).

Fed each logged value of the training loss (and of the grad norm) in order, from the log's metrics and the emitter's
log events alike, it keeps:

* a robust window: the last ``WINDOW`` finite loss values; the median of its newest ``LEVEL_N`` is the level, the
  step-to-step noise of the whole window (1.4826 x the MAD of its successive differences / sqrt 2) the scale, never
  under ``REL_FLOOR`` of the level (a falling loss inflates neither; a loss flat to four digits does not make a 1 %
  wobble a spike);
* an **episode** from the first value ``Z_SPIKE`` scales above the level (its **onset**): the level and the scale are
  frozen there, so a rise the window slowly takes in is still measured from where it began. The episode is

  - ``spike`` while it lasts (the value's z, the peak);
  - ``persistent`` once the median of its last ``PERSIST_N`` values sits ``Z_PERSIST`` scales above the frozen level:
    the loss went up and stayed;
  - ``catastrophic`` at a value ``CATASTROPHIC_X`` times the largest of the run's first ``BASE_N`` values (Megatron's
    rule), or a value that is not a number;

  and it ends (recovered) after ``CALM_N`` values in a row back under ``Z_CLEAR`` scales of the level;
* the grad norm's own window: a grad-norm value ``Z_SPIKE`` scales above its level within the last ``GRAD_LEAD``
  logged loss values before an onset is named as its early warning.

Before ``MIN_N`` finite values there is no window to judge against: ``not judged``, with the reason. Only upward moves
count: a loss that falls fast (the first minutes of a run) never opens an episode. Pure: no I/O, no clock; its state is
its attributes (plain numbers, strings and bounded deques), saved with the events fold (:mod:`..fold.savedstate`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import TypedDict

from stepwatch.monitors.states import CATASTROPHIC, NOT_JUDGED, OK, PERSISTENT, SPIKE, EpisodeKind, LossState

#: Finite loss values the window holds (OLMo-core judges 6 sigma over 128 steps).
WINDOW = 128
#: Finite values before anything is judged; the newest of them the level is the median of.
MIN_N = 16
LEVEL_N = 16
#: A value this many scales above the window's level opens an episode.
Z_SPIKE = 6.0
#: The scale is never under this share of the level.
REL_FLOOR = 0.02
#: An episode's last PERSIST_N values with their median this many scales above the frozen level: persistent.
PERSIST_N = 5
Z_PERSIST = 3.0
#: CALM_N values in a row under Z_CLEAR scales above the frozen level end an episode.
CALM_N = 3
Z_CLEAR = 3.0
#: A value CATASTROPHIC_X times the largest of the first BASE_N values is catastrophic (from BASE_N values on).
CATASTROPHIC_X = 10.0
BASE_N = 100
#: A grad-norm spike within this many logged loss values before an onset is its early warning.
GRAD_LEAD = 3
#: Ended episodes kept (each is alerted, though it opened and ended between two looks).
ENDED_KEPT = 8
#: Names of the training loss, however the program names it (the first of them a run logs is judged), and of the
#: grad norm.
LOSS_NAMES = ("loss", "train_loss", "train/loss", "lm_loss", "total_loss")
GRAD_NAMES = ("grad_norm", "train/grad_norm")

#: What made an episode catastrophic.
NONFINITE = "nonfinite"
TEN_TIMES = "ten_times"


class Episode(TypedDict):
    """``loss_health.episode`` / ``.last``: one bad stretch of the loss."""

    kind: EpisodeKind
    onset_step: int | None
    #: the level and the scale the episode is measured from (the window's, frozen at its onset)
    level: float
    scale: float
    #: the worst value so far and its z (None: a value that was not a number)
    peak: float | None
    peak_z: float | None
    peak_step: int | None
    values: int
    #: the grad norm's spike before the onset (its step), else None
    grad_warning_step: int | None
    #: the step of the oldest value the level is the median of: a rollback point is a checkpoint at or before it
    level_from_step: int | None
    #: "nonfinite" or "ten_times" for a catastrophic episode, else ""
    why: str
    #: the step of the value that ended it (a past episode), else None
    recovered_step: int | None


class LossHealthPart(TypedDict):
    """The snapshot's ``loss_health``."""

    state: LossState
    metric: str | None
    #: finite loss values judged so far, and not-a-number ones
    values: int
    nonfinite: int
    #: the window's level and scale now (None before MIN_N values)
    level: float | None
    scale: float | None
    #: the open episode, else None; the last one that ended, else None; the last ENDED_KEPT that ended (newest last);
    #: how many there were
    episode: Episode | None
    last: Episode | None
    ended: list[Episode]
    episodes: int
    reason: str
    #: the rollback checkpoint the supervisor kept (kept.json: checkpoint, step, kept, how, onset_step), else None
    rollback: dict[str, object] | None


def _robust(values: deque[float]) -> tuple[float, float]:
    """The window's level (the median of its newest LEVEL_N values: a loss that trends down is judged against where
    it is, not where it was) and its scale (1.4826 x the MAD of its successive differences / sqrt 2: the step-to-step
    noise, which a trend does not inflate), never under REL_FLOOR of the level."""
    recent = list(values)[-LEVEL_N:]
    level = statistics.median(recent)
    diffs = [b - a for a, b in zip(values, list(values)[1:])]
    noise = 1.4826 * statistics.median(abs(d - statistics.median(diffs)) for d in diffs) / math.sqrt(2) if diffs else 0.0
    return level, max(noise, REL_FLOOR * abs(level), 1e-12)


class LossHealth:
    """One metric's health (the training loss), fed in order with :meth:`add`; the grad norm with :meth:`add_grad`."""

    def __init__(self) -> None:
        self.metric = ""  # the loss's name, once one came
        self.window: deque[float] = deque(maxlen=WINDOW)
        self.wsteps: deque[int | None] = deque(maxlen=LEVEL_N)  # the steps of the window's newest LEVEL_N values
        self.values = 0
        self.nonfinite = 0
        self.first_max = 0.0  # the largest of the first BASE_N finite values
        self.first_n = 0
        # the open episode (kind "" when there is none), field by field
        self.kind = ""
        self.why = ""
        self.onset_step: int | None = None
        self.level = 0.0
        self.scale = 0.0
        self.peak: float | None = None
        self.peak_z: float | None = None
        self.peak_step: int | None = None
        self.peak_is_last = self.onset_is_last = False  # whether the newest value made the peak, opened the episode
        self.ep_values = 0
        self.calm = 0
        self.recent: deque[float] = deque(maxlen=PERSIST_N)
        self.grad_warning_step: int | None = None
        self.level_from_step: int | None = None  # the step of the oldest value the frozen level is the median of
        self.episodes = 0
        #: the episodes that ended (Episodes), newest last: a fast run's spike opens and ends between two looks
        self.ended: deque[dict[str, object]] = deque(maxlen=ENDED_KEPT)
        # the grad norm: its window, its last spike's step and how many loss values came since
        self.gwindow: deque[float] = deque(maxlen=WINDOW)
        self.grad_spike_step: int | None = None
        self.since_grad_spike = GRAD_LEAD + 1

    # -- feeding ----------------------------------------------------------------------------------
    def feed(self, name: str, step: int | None, value: float) -> None:
        """One logged metric: the training loss (the first of LOSS_NAMES the run logs) and the grad norm are judged,
        any other name is not this detector's."""
        if not self.metric and name in LOSS_NAMES:
            self.metric = name
        if name == self.metric and not self._again(self.window, value):
            self.add(step, value)
        elif name in GRAD_NAMES and not self._again(self.gwindow, value):
            self.add_grad(step, value)

    @staticmethod
    def _again(window: deque[float], value: float) -> bool:
        """The value the window ended with, again: a progress bar's redraw of its last logged loss (Lightning's
        ``loss=0.202`` on every frame until the next log), not a new value."""
        return bool(window) and window[-1] == value

    def add(self, step: int | None, value: float) -> None:
        """One logged loss value at ``step`` (None: not known)."""
        self.onset_is_last = self.peak_is_last = False
        self.since_grad_spike = min(self.since_grad_spike + 1, GRAD_LEAD + 1)
        if not math.isfinite(value):
            self.nonfinite += 1
            if not self.kind:
                self.level, self.scale = _robust(self.window) if len(self.window) >= MIN_N else (0.0, 0.0)
                self._open(step, None, None)
            self.kind, self.why, self.calm = CATASTROPHIC, NONFINITE, 0
            return
        self.values += 1
        if self.first_n < BASE_N:
            self.first_max, self.first_n = max(self.first_max, value), self.first_n + 1
        ten_times = self.first_n >= BASE_N and value >= CATASTROPHIC_X * self.first_max > 0
        if self.kind:
            self._in_episode(step, value, ten_times)
        elif len(self.window) >= MIN_N:
            level, scale = _robust(self.window)
            z = (value - level) / scale
            if z >= Z_SPIKE or ten_times:
                self.level, self.scale = level, scale
                self._open(step, value, z)
                if ten_times:
                    self.kind, self.why = CATASTROPHIC, TEN_TIMES
        self.window.append(value)
        self.wsteps.append(step)

    def add_grad(self, step: int | None, value: float) -> None:
        """One logged grad-norm value: a spike of its own window is remembered as an early warning."""
        if not math.isfinite(value):
            self.grad_spike_step, self.since_grad_spike = step, 0
            return
        if len(self.gwindow) >= MIN_N:
            level, scale = _robust(self.gwindow)
            if (value - level) / scale >= Z_SPIKE:
                self.grad_spike_step, self.since_grad_spike = step, 0
        self.gwindow.append(value)

    def restep_last(self, name: str, step: int | None) -> None:
        """The last value of ``name`` was labelled with a bar's step, and its own is now known (the log tracker's
        relabel): an onset or a peak it made moves with it."""
        if name != self.metric or not self.kind:
            return
        if self.onset_is_last:
            self.onset_step = step
        if self.peak_is_last:
            self.peak_step = step

    def _open(self, step: int | None, value: float | None, z: float | None) -> None:
        self.kind, self.why, self.onset_step = SPIKE, "", step
        self.peak, self.peak_z, self.peak_step = value, z, step
        self.peak_is_last = self.onset_is_last = True
        self.ep_values, self.calm = 1, 0
        self.recent.clear()
        if value is not None:
            self.recent.append(value)
        self.grad_warning_step = self.grad_spike_step if self.since_grad_spike <= GRAD_LEAD else None
        self.level_from_step = self.wsteps[0] if self.wsteps else None
        self.episodes += 1

    def _in_episode(self, step: int | None, value: float, ten_times: bool) -> None:
        self.ep_values += 1
        self.recent.append(value)
        z = (value - self.level) / self.scale if self.scale else math.inf
        self.peak_is_last = self.peak_z is None or z > self.peak_z
        if self.peak_is_last:
            self.peak, self.peak_z, self.peak_step = value, z, step
        if ten_times and self.kind != CATASTROPHIC:
            self.kind, self.why = CATASTROPHIC, TEN_TIMES
        elif (self.kind == SPIKE and len(self.recent) >= PERSIST_N
              and statistics.median(self.recent) >= self.level + Z_PERSIST * self.scale):
            self.kind = PERSISTENT
        self.calm = self.calm + 1 if z < Z_CLEAR else 0
        if self.calm >= CALM_N:
            self.ended.append(dict(self._episode(step)))
            self.kind = ""

    # -- reading ----------------------------------------------------------------------------------
    def _episode(self, recovered_step: int | None = None) -> Episode:
        return {"kind": self.kind, "onset_step": self.onset_step,  # type: ignore[typeddict-item]
                "level": round(self.level, 6), "scale": round(self.scale, 6),
                "peak": None if self.peak is None else round(self.peak, 6),
                "peak_z": None if self.peak_z is None else round(self.peak_z, 2), "peak_step": self.peak_step,
                "values": self.ep_values, "grad_warning_step": self.grad_warning_step,
                "level_from_step": self.level_from_step, "why": self.why,
                "recovered_step": recovered_step}

    def part(self) -> LossHealthPart:
        """The snapshot's ``loss_health``."""
        metric = self.metric or None
        level: float | None = None
        scale: float | None = None
        if len(self.window) >= MIN_N:
            level, scale = (round(x, 6) for x in _robust(self.window))
        state: LossState = self.kind or (OK if level is not None else NOT_JUDGED)  # type: ignore[assignment]
        reason = ("" if level is not None or self.kind else
                  f"{self.values} finite loss value{'s' if self.values != 1 else ''} logged so far; judged from {MIN_N}"
                  if metric is not None else "the run logs no training loss stepwatch reads")
        return {"state": state, "metric": metric, "values": self.values, "nonfinite": self.nonfinite,
                "level": level, "scale": scale, "episode": self._episode() if self.kind else None,
                "last": self.ended[-1] if self.ended else None, "ended": list(self.ended),  # type: ignore[typeddict-item]
                "episodes": self.episodes, "reason": reason, "rollback": None}


def episodes_of(lh: LossHealthPart) -> list[Episode]:
    """Every episode ``loss_health`` holds, oldest first: the last ENDED_KEPT that ended, then the open one."""
    return [*lh["ended"], *([lh["episode"]] if lh["episode"] is not None else [])]


def not_judged_part(reason: str) -> LossHealthPart:
    """``loss_health`` where no loss was read at all."""
    return {"state": NOT_JUDGED, "metric": None, "values": 0, "nonfinite": 0, "level": None, "scale": None,
            "episode": None, "last": None, "ended": [], "episodes": 0, "reason": reason, "rollback": None}
