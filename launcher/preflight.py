"""The pre-launch checklist (ARCHITECTURE.md, "Rules of the code"): each item pass / fail / warn /
skipped, with the reason.

Items, in order: working tree committed; test suite green (and the runner really ran tests);
training arguments checked by NAME against the installed ``transformers.TrainingArguments`` in the
run's own interpreter; config validated before anything heavy; watchdog tested negative; log will
rotate; provenance will record resolved values (the script imports the emitter).

The whole result is recorded in run.json (``preflight``), present-and-null.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stepwatch.launcher.config import ConfigError, RunConfig, resolve_executable
from stepwatch.launcher.identity import TreeState, read_tree
from stepwatch.launcher.rotate import plan_rotation
from stepwatch.launcher.trust import group_name
from stepwatch.monitors.runfiles import open_regular
from stepwatch.monitors.watch.stacks import py_spy
from stepwatch.monitors.watchdog import self_test

OUTPUT_TAIL_CHARS = 2000

# Run in the job's interpreter: prints the accepted keyword names of TrainingArguments as JSON.
_SIGNATURE_PROBE = r"""
import inspect, json, sys
try:
    import transformers
    from transformers import TrainingArguments
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"})); sys.exit(0)
params = inspect.signature(TrainingArguments).parameters
print(json.dumps({"version": transformers.__version__, "names": [n for n, p in params.items()
      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]}))
"""

_NO_TESTS_RE = re.compile(r"\bno tests ran\b|\bcollected 0 items\b|^Ran 0 tests", re.I | re.M)


@dataclass
class Item:
    """One checklist line: ``status`` is "pass", "fail", "warn" or "skipped"; ``detail`` is free JSON."""

    id: str
    title: str
    status: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Checklist:
    """All items; ``failed`` lists the ids of failing items."""

    items: list[Item]

    @property
    def failed(self) -> list[str]:
        return [i.id for i in self.items if i.status == "fail"]

    def to_json(self, override_reason: str | None = None, allow_dirty_reason: str | None = None) -> dict[str, Any]:
        """The record for run.json: items, failed ids, and which overrides were used."""
        items = []
        for it in self.items:
            d = asdict(it)
            d["overridden"] = it.status == "fail" and (
                (it.id == "clean_tree" and allow_dirty_reason is not None)
                or (it.id != "clean_tree" and override_reason is not None))
            items.append(d)
        return {"items": items, "failed": self.failed, "override_reason": override_reason}


def check_clean_tree(tree: TreeState) -> Item:
    """Item 1: tracked modifications or staged changes fail; untracked files only warn."""
    title = "working tree committed"
    if tree.repo_root is None or tree.error:
        return Item("clean_tree", title, "fail", tree.error or "not a git work tree")
    if tree.dirty:
        files = tree.modified + tree.staged
        return Item("clean_tree", title, "fail",
                    f"{len(tree.modified)} modified, {len(tree.staged)} staged: {', '.join(files[:5])}"
                    + (" ..." if len(files) > 5 else ""), {"modified": tree.modified, "staged": tree.staged})
    writers = _repo_writers(Path(tree.repo_root))
    if tree.untracked:
        return Item("clean_tree", title, "warn",
                    f"clean, but {len(tree.untracked)} untracked file(s) are not part of the commit: "
                    f"{', '.join(tree.untracked[:5])}" + (f"; {writers}" if writers else ""), {"untracked": tree.untracked})
    if writers:
        return Item("clean_tree", title, "warn", f"clean at {tree.identity.get('describe')}, but {writers}")
    return Item("clean_tree", title, "pass", f"clean at {tree.identity.get('describe')}")


def _repo_writers(root: Path) -> str | None:
    """Why others could change the code that runs as you (the repository's top dir or its .git is writable by a
    group or by everyone), or None. ARCHITECTURE.md R17: a shared repository is the team's choice, said, not refused."""
    for d in (root, root / ".git"):
        try:
            st = d.lstat()
        except OSError:
            continue
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode):
            who = "everyone" if st.st_mode & stat.S_IWOTH else f"group {group_name(st.st_gid)}"
            return (f"{d} is writable by {who}: they can change the code that runs as you on the next launch or "
                    f"relaunch (chmod g-w,o-w it if that is not meant)")
    return None


def check_test_suite(cfg: RunConfig) -> Item:
    """Item 2: run ``[preflight] test_command`` in cwd with a timeout.

    Exit code 0 with tests run passes. Exit 5 (pytest: no tests collected) or "no tests ran" in the
    output is a FAIL: an instrument nobody runs is not an instrument (ARCHITECTURE.md R10).
    """
    title = "test suite green"
    cmd = cfg.settings.preflight.test_command
    if cmd is None:
        return Item("test_suite", title, "skipped", "no [preflight] test_command in the config")
    if not (isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd)):
        return Item("test_suite", title, "fail", f"[preflight] test_command must be an argv list; got {cmd!r}")
    timeout = cfg.settings.preflight.test_timeout_s
    env = dict(os.environ)
    env.update(cfg.env)
    try:
        p = subprocess.run(cmd, cwd=cfg.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
    except FileNotFoundError:
        return Item("test_suite", title, "fail", f"test runner not found: {cmd[0]!r} (is it installed in the run's environment?)")
    except subprocess.TimeoutExpired as e:
        tail = (e.output or b"").decode(errors="replace")[-OUTPUT_TAIL_CHARS:]
        return Item("test_suite", title, "fail", f"timed out after {timeout:g} s", {"command": cmd, "output_tail": tail})
    out = p.stdout.decode(errors="replace")
    detail = {"command": cmd, "returncode": p.returncode, "output_tail": out[-OUTPUT_TAIL_CHARS:]}
    last = next((ln.strip() for ln in reversed(out.splitlines()) if ln.strip()), "")
    if p.returncode == 5 or _NO_TESTS_RE.search(out):
        return Item("test_suite", title, "fail", f"the runner ran no tests (exit {p.returncode}): {last}", detail)
    if p.returncode != 0:
        return Item("test_suite", title, "fail", f"exit {p.returncode}: {last}", detail)
    return Item("test_suite", title, "pass", last or "exit 0", detail)


def job_python(cfg: RunConfig) -> str | None:
    """The run's own interpreter: ``[preflight] python``, else the command's program when it is a
    Python (``python``, ``python3.11``, ...), else None."""
    if cfg.settings.preflight.python:
        return cfg.settings.preflight.python
    if cfg.shell:
        return None
    try:
        exe = resolve_executable(cfg)
    except ConfigError:
        return None
    return exe if re.match(r"^python[0-9.]*$", Path(exe).name) else None


def check_training_arguments(cfg: RunConfig) -> Item:
    """Item 3: ``[preflight] training_arguments`` names checked against the installed
    ``inspect.signature(transformers.TrainingArguments)``, in the run's interpreter, in a subprocess.
    Unknown names fail, each with the closest accepted names (difflib)."""
    title = "arguments checked by name"
    kwargs = cfg.settings.preflight.training_arguments
    if kwargs is None:
        return Item("training_arguments", title, "skipped", "no [preflight] training_arguments in the config")
    if not isinstance(kwargs, dict):
        return Item("training_arguments", title, "fail", "[preflight] training_arguments must be a table of kwargs")
    py = job_python(cfg)
    if py is None:
        return Item("training_arguments", title, "fail",
                    "cannot tell the run's interpreter: set [preflight] python = \"/path/to/venv/bin/python\"")
    try:
        p = subprocess.run([py, "-c", _SIGNATURE_PROBE], cwd=cfg.cwd, capture_output=True, text=True, timeout=120)
        info = json.loads(p.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return Item("training_arguments", title, "fail", f"could not read the signature with {py}: {e}")
    if "error" in info:
        return Item("training_arguments", title, "fail", f"{py} cannot import transformers: {info['error']}")
    accepted = set(info["names"])
    unknown = [k for k in kwargs if k not in accepted]
    detail = {"python": py, "transformers": info["version"], "unknown": {}}
    if unknown:
        for k in unknown:
            detail["unknown"][k] = difflib.get_close_matches(k, sorted(accepted), n=3, cutoff=0.5)
        parts = [f"{k} (closest: {', '.join(v) or 'none'})" for k, v in detail["unknown"].items()]
        return Item("training_arguments", title, "fail",
                    f"not accepted by TrainingArguments in transformers {info['version']}: {'; '.join(parts)}", detail)
    return Item("training_arguments", title, "pass",
                f"{len(kwargs)} names accepted by TrainingArguments in transformers {info['version']} ({py})", detail)


def check_config(cfg: RunConfig) -> Item:
    """Item 4: command exists, cwd exists, runs dir writable, disk free above the threshold
    (``[preflight] min_free_bytes``, default 1 GiB, read with ``shutil.disk_usage``)."""
    title = "config validated"
    problems = []
    try:
        exe = resolve_executable(cfg)
    except ConfigError as e:
        problems.append(str(e))
        exe = None
    if not cfg.cwd.is_dir():
        problems.append(f"cwd does not exist: {cfg.cwd}")
    probe_dir = cfg.runs_dir
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    free = None
    if not os.access(probe_dir, os.W_OK):
        problems.append(f"runs dir not writable: {cfg.runs_dir} ({probe_dir} is not writable)")
    else:
        try:
            with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".stepwatch-probe-"):
                pass
        except OSError as e:
            problems.append(f"runs dir not writable: {e}")
    try:
        free = shutil.disk_usage(probe_dir).free
    except OSError:
        pass
    need = cfg.settings.preflight.min_free_bytes
    if free is not None and free < need:
        problems.append(f"only {free / 2**30:.2f} GiB free under {probe_dir} (need {need / 2**30:.2f} GiB)")
    detail = {"executable": exe, "free_bytes": free, "min_free_bytes": need}
    if problems:
        return Item("config", title, "fail", "; ".join(problems), detail)
    return Item("config", title, "pass", f"command {exe}; {free / 2**30:.1f} GiB free" if free else f"command {exe}", detail)


def check_watchdog() -> Item:
    """Item 5: the watchdog self-test (start, watch, SIGKILL a throwaway process; dead within 2 s); and py-spy, which
    a stall's page needs for the stacks it names (a warning without it: the page goes out without them)."""
    r = self_test()
    spy = py_spy()
    status = "fail" if not r.ok else "pass" if spy else "warn"
    words = r.detail if spy else f"{r.detail}; py-spy not found: a stall's page will carry no stacks (pip install py-spy)"
    return Item("watchdog", "watchdog tested negative", status, words,
                {"noticed_after_s": r.noticed_after_s, "py_spy": spy})


def check_rotation(cfg: RunConfig) -> Item:
    """Item 6: which files the launch will rename to what (pass; informational)."""
    plan = plan_rotation(cfg.run_dir) if cfg.run_dir.exists() else []
    if not plan:
        return Item("log_rotation", "log will rotate", "pass", "first attempt: nothing to rotate", {"renames": []})
    renames = [[a.name, b.name] for a, b in plan]
    return Item("log_rotation", "log will rotate", "pass",
                "; ".join(f"{a} -> {b}" for a, b in renames), {"renames": renames})


def check_provenance(cfg: RunConfig) -> Item:
    """Item 7 (a heuristic, and says so): warn when the command's script does not mention
    ``stepwatch.telemetry`` — without the emitter the run only has log-derived step times."""
    title = "provenance will record resolved values"
    scripts = [Path(a) if os.path.isabs(a) else cfg.cwd / a for a in cfg.command if a.endswith(".py")]
    scripts = [s for s in scripts if s.is_file()]
    if not scripts:
        return Item("provenance", title, "warn",
                    "heuristic: no .py script in the command to look into; if the job does not use "
                    "stepwatch.telemetry, step times come from the log only")
    for s in scripts:
        try:
            text = s.read_text(errors="replace")
        except OSError:
            continue
        if "stepwatch.telemetry" in text or "StepwatchCallback" in text or "StepTelemetry" in text:
            return Item("provenance", title, "pass", f"heuristic: {s.name} imports stepwatch.telemetry")
    return Item("provenance", title, "warn",
                f"heuristic (a text search): {', '.join(s.name for s in scripts)} does not import stepwatch.telemetry; "
                "the run will have log-derived step times only, no versions or attention backend on record")


#: The earlier log the log-format item reads at most (bytes, lines).
LOG_TRY_BYTES = 256 * 1024
LOG_TRY_LINES = 2000
SHAPES_WORDS = ("tqdm bars with any description and their postfix (HF Trainer, accelerate, a plain loop, one bar "
                "per epoch), Lightning's TQDM and Rich bars (max_epochs or max_steps), the HF Trainer's log dicts "
                "with no bar, nanoGPT's iter lines, JSON lines, step N lines")


def _earlier_log_lines(run_dir: Path) -> tuple[str | None, list[str]]:
    """The newest earlier attempt's train log of this run (name, its first lines), or (None, [])."""
    try:
        logs = sorted((p for p in run_dir.glob("train*.log") if p.is_file() and not p.is_symlink()),
                      key=lambda p: p.stat().st_mtime)
    except OSError:
        return None, []
    if not logs:
        return None, []
    try:  # never through a symlink, never a FIFO swapped in, only a file of the launching user
        fd = open_regular(logs[-1], os.geteuid())
        if fd is None:
            return None, []
        with os.fdopen(fd, "rb") as f:
            text = f.read(LOG_TRY_BYTES).decode("utf-8", "replace")
    except OSError:
        return None, []
    return logs[-1].name, [ln for ln in re.split(r"\r\n|\r|\n", text) if ln.strip()][:LOG_TRY_LINES]


def check_log_format(cfg: RunConfig) -> Item:
    """Item 8: how the training log will be read. The ``[log] patterns`` and the built-in shapes are
    tried on the last attempt's log and on ``[log] examples``; a pattern that matches nothing it was
    tried on fails (the run's steps would go unseen), one with nothing to try on is a warning."""
    from stepwatch.monitors.parsers.logformats import compile_patterns, user_pattern  # noqa: PLC0415
    from stepwatch.monitors.parsers.logtracker import LogTracker, log_settings  # noqa: PLC0415

    title = "training log will be read"
    try:  # validated at config load; a config built otherwise is refused here, with the reason
        patterns = compile_patterns(cfg.log.get("patterns", []))
    except ValueError as e:
        return Item("log_format", title, "fail", f"[log] {e}", {"earlier_log": None, "lines_tried": 0, "format": None,
                                                               "matched_lines": 0, "patterns": []})
    examples = list(cfg.log.get("examples", []))
    name, lines = _earlier_log_lines(cfg.run_dir)
    tracker = LogTracker(patterns, log_settings(cfg.log))  # validated at config load
    for ln in lines:
        tracker.feed_text(ln)
    detail = {"earlier_log": name, "lines_tried": len(lines), "format": tracker.format,
              "matched_lines": tracker.matched_lines, "patterns": []}
    problems, untried = [], []
    for i, rx in enumerate(patterns, 1):
        in_log = sum(1 for ln in lines if user_pattern(rx, ln) is not None)
        in_examples = sum(1 for ln in examples if user_pattern(rx, ln) is not None)
        detail["patterns"].append({"pattern": i, "log_lines": in_log, "examples": in_examples})
        if lines or examples:
            if not in_log and not in_examples:
                tried = ([f"the {len(lines)} line(s) of the last attempt's {name}"] if name else []) + (
                    [f"its {len(examples)} example(s)"] if examples else [])
                problems.append(f"pattern {i} matched none of {' nor '.join(tried)}")
        else:
            untried.append(f"pattern {i}")
    if problems:
        return Item("log_format", title, "fail", "; ".join(problems) + ": fix the pattern, or the run's steps go unseen",
                    detail)
    seen = (f"the last attempt's {name} reads as {tracker.format} ({tracker.matched_lines} lines)" if tracker.format
            else f"no recogniser matched the {len(lines)} line(s) of the last attempt's {name}" if name else None)
    if not name and examples:  # no earlier log: the examples show how the run's log will be read
        ex = LogTracker(patterns, log_settings(cfg.log))
        for ln in examples:
            ex.feed_text(ln)
        detail["format"], detail["matched_lines"] = ex.format, ex.matched_lines
        seen = (f"its {len(examples)} example(s) read as {ex.format} (step {ex.global_step}"
                + (f" of {ex.total}" if ex.total else "") + ")" if ex.format
                else f"no recogniser matched its {len(examples)} example(s)")
        tracker = ex
    if untried:
        return Item("log_format", title, "warn", f"{', '.join(untried)} not tried: no earlier log of this run and no "
                    "[log] examples; add examples = [\"a line of your log\"] to check them now", detail)
    if seen and not tracker.format:
        return Item("log_format", title, "warn", f"{seen}: add [log] patterns (named groups step, loss, ...) or "
                    f"use stepwatch.telemetry; known shapes: {SHAPES_WORDS}", detail)
    if patterns:
        return Item("log_format", title, "pass", f"{len(patterns)} [log] pattern(s) match their examples or the last "
                    "log" + (f"; {seen}" if seen else ""), detail)
    return Item("log_format", title, "pass", seen or f"no earlier log to try; known shapes: {SHAPES_WORDS}; "
                "add [log] patterns for another", detail)


def check_alert_channels(cfg: RunConfig) -> Item:
    """Item 9: each alert channel could deliver (launcher/alertcheck.py)."""
    from stepwatch.launcher.alertcheck import alert_channels_verdict  # noqa: PLC0415 - apprise, only when asked

    return Item("alert_channels", "alert channels checked", *alert_channels_verdict(cfg))


def run_checklist(cfg: RunConfig, tree: TreeState | None = None) -> Checklist:
    """Run every item for ``cfg`` (the test suite may take up to its timeout). Never raises."""
    tree = tree or read_tree(cfg.cwd, cfg.runs_dir)
    return Checklist([
        check_clean_tree(tree), check_test_suite(cfg), check_training_arguments(cfg), check_config(cfg),
        check_watchdog(), check_rotation(cfg), check_provenance(cfg), check_log_format(cfg), check_alert_channels(cfg),
    ])


_MARKS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "skipped": "SKIP"}


def format_checklist(cl: Checklist) -> list[str]:
    """Readable lines, one per item: ``[PASS] working tree committed: reason``."""
    return format_checklist_json(cl.to_json())


def format_checklist_json(record: dict[str, Any]) -> list[str]:
    """The same lines from run.json's ``preflight`` record (overridden failures say so)."""
    return [f"[{_MARKS.get(i.get('status'), '?')}] {i.get('title')}: {i.get('reason')}"
            + (" (overridden)" if i.get("overridden") else "") for i in record.get("items", [])]

