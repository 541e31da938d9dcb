"""What the run is doing, from its log alone: training, evaluating, saving, finishing.

An un-instrumented run cannot call the emitter's ``phase()``; its log still says when it evaluates or saves,
in the words and bars of the programs people run (each seen in a real capture, tests/fixtures/real/):

- **evaluating**: an evaluation bar moving (Lightning's ``Validation DataLoader 0``, the HF Trainer's
  evaluation bar: no description like its training bar, a smaller total), HF's ``***** Running Evaluation
  *****``, an evaluation's result line (``{'eval_loss': …}``, nanoGPT's ``step 500: train loss …, val loss …``),
  timm's ``Test: [  3/3]`` lines, a line that starts ``Evaluating:``;
- **saving**: a checkpoint's bar (transformers' ``Writing model shards``), a line that saves
  (``Saving model checkpoint to …``, nanoGPT's ``saving checkpoint to out``, accelerate's ``Saving current
  state to …``, ``checkpoint saved``);
- **finishing**: the training bar at its total, ``max_steps`` reached, the Trainer's summary.

:class:`LogPhases` keeps the phase in force, when it began, the phases seen since the last training step
(the step records of that interval carry them as flags: ``eval``, ``save``; never a step time), and the
longest evaluation and save so far: a phase's budget is ``PHASE_BUDGET_FACTOR`` × its longest, at least
``PHASE_FLOOR_S`` (ARCHITECTURE.md R18). Standard library only.
"""

from __future__ import annotations

import re

from stepwatch.monitors.protocol import FLAG_EVAL, FLAG_SAVE
from stepwatch.monitors.states import EVALUATING, FINISHING, SAVING, STARTING, TRAINING

#: A save or an evaluation may run this many times its longest so far before it is judged stuck.
PHASE_BUDGET_FACTOR = 3.0
#: ... and at least this long (seconds): a first save has no history, and a big model's takes minutes.
PHASE_FLOOR_S = 300.0
#: The step-record flag of each phase that interrupts training.
PHASE_FLAGS = {EVALUATING: FLAG_EVAL, SAVING: FLAG_SAVE}

_SAVE_LINE = re.compile(r"\b(?:saving|saved|writing|wrote)\b.{0,80}?\b(?:checkpoints?|model|weights|state|shards?)\b"
                        r"|\bcheckpoints?\b.{0,40}?\b(?:saved|written)\b", re.I)
#: Never a metric name alone (``val_loss: 0.6`` is also the second row of Lightning's Rich bar, redrawn
#: while training): a line that starts an evaluation, or an evaluation's own result line.
_EVAL_LINE = re.compile(r"\*{3,} Running (?:Evaluation|Prediction) \*{3,}"
                        r"|^\s*+(?:Test|Eval|Evaluating|Validating|Validation)\b(?: DataLoader \d+)?\s*+[:\[━╸╺╾╼─]"
                        r"|^\s*+\{'eval_|^\s*+step \d+: train loss \S+,? val loss")
_FINISH_LINE = re.compile(r"`Trainer\.fit` stopped|\bTrainOutput\(|^\s*+\{'train_runtime'|"
                          r"(?i:^\W*(?:training|train) (?:is )?(?:complete|completed|finished|done)\b|"
                          r"^\W*(?:finished|done) training\b)")
#: A bar's description that is an evaluation's or a save's.
_EVAL_DESC = re.compile(r"\b(?:eval|valid|test|predict|sanity)", re.I)
_SAVE_DESC = re.compile(r"\b(?:writ|sav|shard|checkpoint)", re.I)
#: Lines longer than this are never searched for a phase word (a dumped tensor).
MAX_PHASE_LINE_CHARS = 4096


def line_phase(body: str) -> str | None:
    """The phase a log line announces (rank prefix and escapes removed): SAVING, EVALUATING, FINISHING or None."""
    if len(body) > MAX_PHASE_LINE_CHARS:
        return None
    if _FINISH_LINE.search(body):
        return FINISHING
    if _SAVE_LINE.search(body):
        return SAVING
    if _EVAL_LINE.search(body):
        return EVALUATING
    return None


def bar_phase(desc: str, training_desc: str | None) -> str | None:
    """The phase a bar that is not the training bar shows: an evaluation's (its words, or the training bar's
    own description with another total: the HF Trainer's), a save's, or None (a tokenizer's, a download's)."""
    if _SAVE_DESC.search(desc):
        return SAVING
    if _EVAL_DESC.search(desc) or (training_desc is not None and desc == training_desc):
        return EVALUATING
    return None


class LogPhases:
    """The phase in force (``name``, since ``since_s``), fed by the tracker: :meth:`stepped` at each training
    step, :meth:`saw` at each phase a line or a bar announces."""

    def __init__(self) -> None:
        self.name = STARTING
        self.since_s: float | None = None
        self.since_step: set[str] = set()  #: phases seen since the last training step
        self._ready: set[str] = set()  # the flags of the steps made since the last take_flags
        self.longest_s: dict[str, float] = {}  #: the longest evaluation and save so far, seconds
        self.count: dict[str, int] = {}  #: evaluations and saves seen
        self.floor_s = PHASE_FLOOR_S  #: the budget's floor (``[stall] phase_floor_s`` sets it per run)
        self.source = "log"  #: who said the phase in force: ``log`` (a line, a bar), ``stacks`` (the processes' stacks)
        #: what the stacks of a step past its budget showed (the phase, the step they saw): set by the supervisor's
        #: stack thread (one assignment), taken by the next look (monitors/snapshot/phase.py follow_stacks)
        self.stacks_saw: tuple[str, int | None] | None = None
        self.stacks_step: int | None = None  #: the step a phase the stacks said holds for; it ends when the run steps on

    def saw(self, phase: str, at_s: float | None, source: str = "log") -> None:
        """A line or a bar (``source``: or the stacks) says ``phase``. Before the first training step nothing
        interrupts training, and after the last one an evaluation or a save is part of finishing."""
        if self.name in (STARTING, FINISHING) and phase != FINISHING:
            return  # before the first training step nothing interrupts it; after the last, all is finishing
        if phase != self.name:
            self.name, self.since_s, self.source = phase, at_s, source
            if phase in PHASE_FLAGS:
                self.count[phase] = self.count.get(phase, 0) + 1
        if phase in PHASE_FLAGS:
            self.since_step.add(PHASE_FLAGS[phase])

    def stepped(self, at_s: float | None, finished: bool) -> None:
        """A training step: a phase that interrupted training ends here (its duration is learned)."""
        if self.name in PHASE_FLAGS and self.since_s is not None and at_s is not None and at_s >= self.since_s:
            d = at_s - self.since_s
            self.longest_s[self.name] = max(self.longest_s.get(self.name, 0.0), d)
        name = FINISHING if finished else TRAINING
        if name != self.name:
            self.name, self.since_s, self.source = name, at_s, "log"
        self._ready |= self.since_step  # the phases before this step are its interval's: its records' flags
        self.since_step = set()

    def learn(self, phase: str, seconds: float) -> None:
        """An interval of ``phase`` lasted up to ``seconds`` (a flagged step's record: the supervisor timed it
        as it happened, where a view that reads the log at once sees every phase last 0 s)."""
        if phase in PHASE_FLAGS and seconds > self.longest_s.get(phase, 0.0):
            self.longest_s[phase] = seconds

    def take_flags(self) -> list[str]:
        """The flags of the phases that ran before the training steps seen since the last call (for those
        steps' records); a phase seen after the last step waits for the next one."""
        flags, self._ready = sorted(self._ready), set()
        return flags

    def budget_s(self, phase: str | None = None) -> float | None:
        """How long ``phase`` (the one in force by default) may run before it is judged stuck; None for a phase
        with no budget of its own (training: the step budget; starting, finishing: not judged here)."""
        phase = phase or self.name
        if phase not in PHASE_FLAGS:
            return None
        return max(self.floor_s, PHASE_BUDGET_FACTOR * self.longest_s.get(phase, 0.0))
