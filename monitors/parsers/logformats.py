"""Recognisers for the training-log shapes people actually print, one line at a time.

Each recogniser takes one line's body (rank prefix already split off, terminal escapes removed) and
returns a :class:`LineStep` when the line reports an optimizer step, else None. Shapes, each from a
real capture under ``tests/fixtures/real/`` (its README says how it was made):

``nanogpt``
    karpathy/nanoGPT's ``train.py`` and its forks: ``iter 120: loss 2.3456, time 16.12ms, mfu 3.21%``.
    ``time`` is the program's own time of that iteration (``reported_dt_s``). Its evaluation line
    ``step 0: train loss 4.19, val loss 4.19`` is an evaluation, never a step (see :func:`eval_metrics`).
``lightning_rich``
    PyTorch Lightning's ``RichProgressBar`` written to a file (the supervisor sets Rich's
    ``TTY_COMPATIBLE`` / ``TTY_INTERACTIVE`` so it prints while running):
    ``Epoch 0/2  ━━━╺━━━ 2/40 0:00:00 • 0:00:01 46.08it/s loss: 2.902``; epoch-relative counters become a
    global step (epoch × batches per epoch + batch), and ``max_steps`` = (last epoch + 1) × batches. At 80
    columns a wide counter pushes the time remaining onto the next row: ``100/120 0:00:05 •        18.84it/s``.
``json``
    one JSON object per line with a step key (``step``, ``global_step``, ``iter``, ``iteration``)
    and numeric metrics; ``dt_s`` / ``step_time_s`` / ``time_ms`` are reported step times.
``step_line``
    ``step 42 loss 0.531``, ``Step 10/100 | loss=0.5 | lr=1e-4``, torchtitan's
    ``step:  10  loss:  7.1  memory: 12.3GiB(45%)  tps: 1,234  tflops: 5.6  mfu: 3.2%``: a ``step N``
    (``/M`` gives max_steps) followed by at least one ``key value`` / ``key=value`` / ``key: value``.
``pattern N``
    the user's own regular expressions (``[log] patterns`` in the run config, named groups ``step``,
    ``max_steps``, ``dt_s`` and any metric), tried before the shapes above. They run in RE2 (``google-re2``),
    whose time is linear in the line: a pattern that backtracks in Python's ``re`` (``(a+)+$``) on a hostile
    line would hold the GIL and freeze the supervisor, the views and the checklist. stepwatch's own
    expressions below stay in ``re`` (each is written so that no line makes it backtrack).

Lightning's TQDM bar (``Epoch 0:  34%|███▍ | 44/128 [...]``) and the HF Trainer / plain tqdm bar are
tqdm bars: :mod:`stepwatch.monitors.parsers.hf_progress` parses them, :mod:`.logtracker` picks.
Standard library only, but for RE2 (the user's patterns); never raises on any input.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import Protocol, cast

import re2

#: A line longer than this is no step line (a dumped tensor, a one-line config).
MAX_LINE_CHARS = 4096
#: Metrics kept from one line at most.
MAX_METRICS = 32

_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
#: A number as programs print it; atomic (Python 3.11 ``(?>...)``, possessive ``*+``): a run of digits
#: is read one way only, so no line makes a search backtrack over its splits (a 4,089-char line of
#: digits took 20 s before).
_NUM = r"(?>[-+]?(?:\d[\d,]*+\.?\d*+|\.\d++)(?:[eE][-+]?\d++)?|[-+]?(?:nan|inf))"


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, erase-line)."""
    return _CSI.sub("", text) if "\x1b" in text else text


def to_number(text: str) -> float | None:
    """``1,234`` -> 1234.0, ``nan`` -> nan; None when it is not a number."""
    try:
        return float(text.replace(",", ""))
    except (ValueError, OverflowError):
        return None


#: A step time a line reports is believed up to this (seconds); beyond it is no step time (1e308).
MAX_REPORTED_DT_S = 1e6


def _dt(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) and 0 <= v <= MAX_REPORTED_DT_S else None


@dataclass(frozen=True, slots=True)
class LineStep:
    """One optimizer step a log line reports: ``step`` (global_step), ``max_steps`` where the line
    says it, ``reported_dt_s`` (the program's own time of that step, seconds) where it says it, and
    the numeric ``metrics`` it prints (``loss``, ``lr``, ...; NaN and inf kept: they are findings)."""

    step: int
    max_steps: int | None = None
    reported_dt_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    #: An epoch-scoped counter (Lightning's bars, timm's ``Train: 12 [  16/22``, a user pattern's
    #: ``epoch`` group): the epoch as printed, the counter within it and its total per epoch; ``step``
    #: is then epoch × steps_per_epoch + counter, the best this one line can say (the tracker keeps
    #: each epoch's own length, :mod:`.epochscope`). ``epochs``: how many epochs, where the line says.
    epoch: int | None = None
    epoch_step: int | None = None
    steps_per_epoch: int | None = None
    epochs: int | None = None
    #: Lightning with ``max_steps`` and no ``max_epochs`` (its Rich bar's ``Epoch 0/-2``): the counter's
    #: total is min(batches per epoch, steps left), not the epoch's length alone.
    total_is_steps_left: bool = False


# --- nanoGPT -----------------------------------------------------------------------------------
_NANOGPT = re.compile(rf"^\s*+iter (\d{{1,12}}): loss ({_NUM}), time ({_NUM})ms(?:, mfu ({_NUM})%)?", re.I)


def nanogpt(body: str) -> LineStep | None:
    m = _NANOGPT.match(body)
    if not m:
        return None
    loss, ms = to_number(m.group(2)), to_number(m.group(3))
    metrics = {"loss": loss} if loss is not None else {}
    if m.group(4) is not None and (mfu := to_number(m.group(4))) is not None and mfu >= 0:
        metrics["mfu_pct"] = mfu  # nanoGPT prints -100% until its running estimate exists
    return LineStep(int(m.group(1)), None, _dt(ms / 1000.0 if ms is not None else None), metrics)


# --- Lightning's Rich bar ------------------------------------------------------------------------
_RICH = re.compile(
    r"^\s*+Epoch (\d{1,9})/(-?\d{1,9})[━╺╸╾╼─\s]++(\d{1,12})/(\d{1,12})\s++"
    r"(\d++:\d\d:\d\d)\s*+•\s*+(?:(\S++)\s++)?([\d.]++|\?)\s*+it/s\s*+(.*)$")


def lightning_rich(body: str) -> LineStep | None:
    m = _RICH.match(body)
    if not m:
        return None
    epoch, last_epoch, n, per_epoch = (int(m.group(i)) for i in (1, 2, 3, 4))
    if per_epoch <= 0 or n > per_epoch:
        return None
    if last_epoch < 0:  # max_epochs=-1 (max_steps only): "Epoch 0/-2", the bar's total is min(batches, steps left)
        return LineStep(epoch * per_epoch + n, None, None, pairs(m.group(8)), epoch, n, per_epoch, None, True)
    return LineStep(epoch * per_epoch + n, (last_epoch + 1) * per_epoch, None, pairs(m.group(8)), epoch, n, per_epoch,
                    last_epoch + 1)


# --- JSON per line -------------------------------------------------------------------------------
STEP_KEYS = ("global_step", "step", "iter", "iteration", "trainer/global_step")
_NOT_JSON_METRICS = frozenset((*STEP_KEYS, "max_steps", "total_steps"))
_DT_KEYS = {"dt_s": 1.0, "step_time_s": 1.0, "iter_time_s": 1.0, "time_s": 1.0, "step_time_ms": 1e-3, "time_ms": 1e-3}


def json_line(body: str) -> LineStep | None:
    s = body.strip()
    if len(s) < 2 or s[0] != "{" or s[-1] != "}" or '"' not in s:
        return None
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    step = next((obj[k] for k in STEP_KEYS if type(obj.get(k)) is int and 0 <= obj[k] < 10**12), None)
    if step is None:
        return None
    metrics: dict[str, float] = {}
    for k, v in obj.items():
        if isinstance(k, str) and type(v) in (int, float) and k not in _NOT_JSON_METRICS and len(metrics) < MAX_METRICS:
            try:
                metrics[k[:64]] = float(v)
            except OverflowError:  # an int of 400 digits is no metric
                continue
    dt = next((_dt(metrics[k] * f) for k, f in _DT_KEYS.items() if k in metrics), None)
    ms = obj.get("max_steps", obj.get("total_steps"))
    return LineStep(step, ms if type(ms) is int and 0 < ms < 10**12 else None, dt, metrics)


# --- step N ... key value ----------------------------------------------------------------------
_STEP = re.compile(r"(?:^|[\s|\[(,;-])[Ss]tep\b\s*+[:=#]?\s*+(\d{1,12})(?:\s*+/\s*+(\d{1,12}))?\b(?!\.\d|\s*+%)(.*)$")
_PAIR = re.compile(rf"((?>[A-Za-z_][\w./-]{{0,63}}))\s*+(?::|=)?\s*+({_NUM})(?![\d.])(%|ms|s|GiB|MiB|GB|MB)?(?![A-Za-z])")
#: Words that precede a number in prose ("step 3 of 5"), never a metric's name.
_NOT_METRICS = frozenset({"of", "to", "in", "for", "at", "by", "from", "with", "and", "or", "is", "after", "before",
                          "over", "out", "than", "per", "x"})
_UNIT = {"ms": ("_s", 1e-3), "s": ("_s", 1.0), "%": ("_pct", 1.0), "GiB": ("_gib", 1.0), "MiB": ("_gib", 1 / 1024),
         "GB": ("_gb", 1.0), "MB": ("_gb", 1e-3)}
_EVAL = re.compile(r"\b(?:val|valid|validation|eval|test)\b[ _/]?(?:loss)?", re.I)


def pairs(text: str) -> dict[str, float]:
    """``loss: 7.1  memory: 12.3GiB(45%)  tps: 1,234`` -> ``{loss: 7.1, memory_gib: 12.3, tps: 1234.0}``;
    a unit goes into the name (``time 16ms`` -> ``time_s: 0.016``)."""
    out: dict[str, float] = {}
    for m in _PAIR.finditer(text):
        v = to_number(m.group(2))
        if v is None or len(out) >= MAX_METRICS:
            continue
        key, unit = m.group(1).rstrip(":=./-"), m.group(3)
        if key.lower() in _NOT_METRICS:
            continue
        if unit:
            suffix, f = _UNIT[unit]
            key, v = key + suffix, v * f
        out.setdefault(key, v)
    return out


def step_line(body: str) -> LineStep | None:
    m = _STEP.search(body)
    if not m or _EVAL.search(body):
        return None
    metrics = pairs(m.group(3))
    if not metrics:
        return None  # "Step 3/5: loading shards" is no optimizer step
    total = int(m.group(2)) if m.group(2) else None
    dt = next((_dt(metrics[k]) for k in ("step_time_s", "time_s", "dt_s", "iter_time_s") if k in metrics), None)
    return LineStep(int(m.group(1)), total if total else None, dt, metrics)


_EVAL_LOSS = re.compile(rf"\b(val|valid|validation|eval|test)[ _/]?loss\b\s*+[:=]?\s*+({_NUM})", re.I)


def eval_metrics(body: str) -> dict[str, float]:
    """``eval_loss`` from an evaluation line (``step 2000: train loss 2.1, val loss 2.3``,
    ``val_loss=0.195``), {} otherwise."""
    m = _EVAL_LOSS.search(body) if len(body) <= MAX_LINE_CHARS else None
    v = to_number(m.group(2)) if m else None
    return {"eval_loss": v} if v is not None else {}


# --- the user's own patterns ([log] patterns in the run config) ----------------------------------
MAX_PATTERNS = 16
MAX_PATTERN_CHARS = 500


class UserMatch(Protocol):
    """What :func:`user_pattern` reads of a match (RE2's ``_Match``, as ``re.Match`` has it)."""

    def group(self, name: str, /) -> str | None: ...

    def groupdict(self) -> dict[str, str | None]: ...


class UserPattern(Protocol):
    """A compiled user pattern: RE2's ``_Regexp`` (``google-re2``), searched in linear time."""

    @property
    def pattern(self) -> str: ...

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    def search(self, text: str, /) -> UserMatch | None: ...


#: RE2's options for a user pattern: its parse errors come back as ValueError, never on stderr. The
#: binding (google-re2) has no fallback to ``re``: what RE2 cannot parse raises ``re2.error``.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_ENGINE = "the linear-time engine (RE2)"
#: What RE2 refuses that ``re`` takes, as RE2's error names it, in an operator's words.
_PERL_OPERATORS = (("(?=", "a look-ahead (?=...)"), ("(?!", "a negative look-ahead (?!...)"),
                   ("(?<=", "a look-behind (?<=...)"), ("(?<!", "a negative look-behind (?<!...)"),
                   ("(?>", "an atomic group (?>...)"), ("(?(", "a conditional group (?(...)...)"),
                   ("(?#", "a comment (?#...)"))
#: ``{,3}``: ``re`` reads "0 to 3 times", RE2 the literal text ``{,3}``; refused rather than read otherwise.
_OPEN_REPEAT = re.compile(r"(?:^|[^\\])(?:\\\\)*+\{,\d*+\}")


def _refusal(p: str, err: str) -> str:
    """Why RE2 refuses ``p`` (its error ``err``), in words that say what to change."""
    what, _, op = err.partition(": ")
    feature, advice = None, "rewrite it without"
    if what == "invalid perl operator":
        feature = next((words for start, words in _PERL_OPERATORS if op.startswith(start)), None)
        if op.startswith("(?P"):
            feature = "a backreference (?P=name)" if "(?P=" in p else "a recursion (?P>name)" if "(?P>" in p else None
        elif feature is None and op.startswith("(?") and op[2:3].isalpha():
            feature, advice = f"the inline flag {op})", "rewrite it without (RE2 knows the flags i, m, s and U)"
    elif what == "invalid escape sequence":
        feature = "a backreference " + op if op[1:2].isdigit() else f"the escape {op}"
        if op == r"\Z":
            advice = r"write \z (or $) for the end of the line"
    elif what == "bad repetition operator" and len(op) >= 2 and op.endswith("+") and op[-2] in "*+?}":
        feature, advice = f"a possessive quantifier {op}", f"write {op[:-1]} (RE2 never backtracks)"
    elif what == "invalid repetition size":
        return f"repeats more than {_ENGINE} allows ({op}: at most 1000, nested repeats multiplied)"
    elif what.startswith("pattern too large"):
        return f"is too large for {_ENGINE} once compiled: fewer or smaller repeats"
    if feature is not None:
        return f"uses {feature}, which {_ENGINE} does not support: {advice}"
    try:
        re.compile(p)
    except re.error as e:  # a plain syntax error: re's words (with the position) are the familiar ones
        return f"is not a regular expression: {e}"
    return f"is not a regular expression {_ENGINE} accepts: {err}"


def compile_user_pattern(p: str) -> UserPattern:
    """One user pattern in RE2; ValueError with the reason (not the pattern: the caller names it)."""
    if _OPEN_REPEAT.search(p):
        raise ValueError(f"writes a repeat as {{,n}}, which {_ENGINE} reads as the literal text: write {{0,n}} "
                         r"(or \{ for a brace)")
    if r"\C" in p.replace("\\\\", ""):
        raise ValueError(rf"uses \C (one byte, which can split a character), which {_ENGINE} does not support "
                         "here: write . for a character")
    try:
        # cast: the binding is untyped; its _Match.group(one name) is str | None (a tuple only for several)
        return cast(UserPattern, re2.compile(p, _RE2_OPTIONS))
    except re2.error as e:
        err = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(_refusal(p, err)) from None
    except UnicodeError:  # a lone surrogate read from JSON
        raise ValueError("is not valid text (a lone surrogate)") from None


def _compile_list(patterns: object, key: str | None, kind_words: str) -> list[tuple[int, str, UserPattern]]:
    """A list of user patterns (``[log] patterns``: ``key`` None; else that key's) compiled in RE2, each with its place
    and text; ValueError naming the bad one (``kind_words``: what the list must be, said when it is not a list of
    strings, or holds an empty one)."""
    if not isinstance(patterns, list) or not all(isinstance(p, str) and (p or key is None) for p in patterns):
        raise ValueError(kind_words)
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(f"{key + ': ' if key else ''}at most {MAX_PATTERNS} patterns; got {len(patterns)}")
    out = []
    for i, p in enumerate(patterns, 1):
        which = f"{key + ' ' if key else ''}pattern {i}"
        if len(p) > MAX_PATTERN_CHARS:
            raise ValueError(f"{which} is longer than {MAX_PATTERN_CHARS} characters")
        try:
            out.append((i, p, compile_user_pattern(p)))
        except ValueError as e:
            raise ValueError(f"{which} {p!r} {e}") from None
    return out


def compile_patterns(patterns: object) -> list[UserPattern]:
    """``[log] patterns`` compiled in RE2; ValueError naming the bad pattern and what is wrong (not a
    list of strings, a regex error, what RE2 does not support, no ``(?P<step>...)`` group)."""
    out = []
    for i, p, rx in _compile_list(patterns, None, "patterns must be a list of regular expressions (strings)"):
        if "step" not in rx.groupindex:
            raise ValueError(f"pattern {i} {p!r} has no (?P<step>...) group: which number is the optimizer step?")
        if "epoch" in rx.groupindex and "steps_per_epoch" not in rx.groupindex:
            raise ValueError(f"pattern {i} {p!r} has an (?P<epoch>...) group but no (?P<steps_per_epoch>...): "
                             "the counter's total per epoch is what makes its step global")
        out.append(rx)
    return out


def compile_phase_lines(patterns: object, key: str) -> tuple[UserPattern, ...]:
    """``[log] eval_lines`` / ``save_lines`` (``key``): the run's own words for an evaluation or a save, each a
    pattern searched in a line, compiled in RE2 like ``patterns`` (no group needed); ValueError naming the bad one."""
    return tuple(rx for _i, _p, rx in _compile_list(
        patterns, key, f"{key} must be a list of regular expressions (non-empty strings), e.g. [\"running eval\"]"))


def user_pattern(rx: UserPattern, body: str) -> LineStep | None:
    """One user pattern against one line of at most MAX_LINE_CHARS: ``step`` (an integer), ``max_steps``,
    ``dt_s`` (seconds), and every other named group that holds a number as a metric."""
    if len(body) > MAX_LINE_CHARS:
        return None  # a dumped tensor, a one-line config: no step line, and no line to search
    try:
        m = rx.search(body)
    except UnicodeError:  # a lone surrogate: RE2 reads UTF-8
        return None
    if not m:
        return None
    printed = m.group("step")  # None when the group did not take part in the match
    if printed is None or not (printed.isascii() and printed.isdigit()) or len(printed) > 12:
        return None  # a global_step is a plain count below 10**12: 12 ASCII digits at most
    step = int(printed)
    # The named groups with a meaning of their own (step, max_steps, dt_s, epoch, steps_per_epoch, epochs); any other
    # named group is a metric. ``epoch`` with ``steps_per_epoch`` (the counter's total) makes ``step`` a counter
    # within the epoch (timm's ``Train: 12 [  16/22``); ``epochs``: how many epochs the run has.
    got = {k: to_number(v) for k, v in m.groupdict().items() if v is not None}
    ms, dt = got.pop("max_steps", None), got.pop("dt_s", None)
    epoch, per_epoch, epochs = (_count(got.pop(k, None)) for k in ("epoch", "steps_per_epoch", "epochs"))
    got.pop("step", None)
    metrics = {k: v for k, v in got.items() if v is not None}
    max_steps = int(ms) if ms and ms.is_integer() and 0 < ms < 1e12 else None
    if epoch is not None and per_epoch:  # a counter within the epoch
        return LineStep(epoch * per_epoch + step, max_steps or (epochs * per_epoch if epochs else None), _dt(dt),
                        metrics, epoch, step, per_epoch, epochs or None)
    return LineStep(step, max_steps, _dt(dt), metrics)


def _count(v: float | None) -> int | None:
    """A printed count (an epoch, a total) as an int below 10**12, else None."""
    return int(v) if v is not None and v.is_integer() and 0 <= v < 1e12 else None


#: In the order they are tried: the most specific shape first.
RECOGNISERS: dict[str, Callable[[str], LineStep | None]] = {
    "nanogpt": nanogpt,
    "lightning_rich": lightning_rich,
    "json": json_line,
    "step_line": step_line,
}


def recognise(body: str, only: str | None = None) -> tuple[str, LineStep] | None:
    """``(name, step)`` of the first recogniser that matches ``body`` (only ``only`` when given)."""
    if len(body) > MAX_LINE_CHARS or not body.strip():
        return None
    for name, fn in RECOGNISERS.items():
        if only is not None and name != only:
            continue
        got = fn(body)
        if got is not None:
            return name, got
    return None
