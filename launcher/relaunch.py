"""Relaunch: the config of a run's next attempt, read only from what its owner alone can write.

ARCHITECTURE.md R17: the owner's copy of the last launch (launcher/trust.py) and the config file it
names, never run.json, which a team's group may replace in a shared runs dir.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from stepwatch.launcher.checkpointpath import resume_at_exec
from stepwatch.launcher.checkpoints import Checkpoint, find_checkpoints, newest_complete, output_dir_of
from stepwatch.launcher.config import (TOP_KEYS, RunConfig, UntrustedConfig, config_to_json, diff_configs, load_config,
                                       validate_config)
from stepwatch.launcher.launch import LaunchRefused
from stepwatch.launcher.provenance import judge_provenance
from stepwatch.launcher.restartpolicy import resume_argv
from stepwatch.launcher.trust import launch_digest, read_owner_copy, read_private_json, shared_dir_problem
from stepwatch.monitors.runfiles import RUN_JSON, read_json


def relaunch_config(run_dir: Path) -> tuple[RunConfig, list[str]]:
    """The config for the next attempt of ``run_dir`` and what changed since the last one.

    What runs comes from a source only the invoking user can write (launcher/trust.py): the owner's
    copy of the last launch, and the config file it names when that file is the user's alone (as
    ssh treats ``authorized_keys``); a run launched from flags reuses the copy's config. run.json
    serves only where no copy exists (a launch by an older stepwatch) and the run dir and run.json
    are the user's alone. A run.json that differs from the copy is reported among the changes and
    ignored. Raises ConfigError / LaunchRefused.
    """
    source, why = read_owner_copy(run_dir)
    tampered: list[str] = []
    run = read_json(run_dir / RUN_JSON)
    if source is None:
        problem = shared_dir_problem(run_dir)
        if problem is None:
            source, problem = read_private_json(run_dir / RUN_JSON, str(run_dir / RUN_JSON))
        if source is None:
            raise LaunchRefused(
                f"REFUSING to relaunch {run_dir.name}: what to run is read only from a place that is yours alone, "
                f"and {why}; run.json cannot stand in for it: {problem}. Launch again from your own config "
                f"(stepwatch launch CONFIG, or stepwatch launch --name {run_dir.name} -- CMD)")
    elif run is not None and launch_digest(run) != source.get("digest"):
        tampered = [f"run.json differs from what you launched ({_what_differs(source, run)}): someone changed it; "
                    "it is ignored, and what you launched is relaunched"]
    cfg_json = source.get("config")
    old: dict[str, Any] = cfg_json if isinstance(cfg_json, dict) else {}
    config_path = source.get("config_path")
    if isinstance(config_path, str) and config_path:
        try:
            cfg = load_config(config_path, runs_dir_override=run_dir.parent)
        except UntrustedConfig as e:
            raise LaunchRefused(f"REFUSING to relaunch {run_dir.name}: {e}") from None
        if cfg.name != run_dir.name:
            raise LaunchRefused(f"the config file {config_path} now names the run {cfg.name!r}, "
                                f"not {run_dir.name!r}; launch it as a new run instead")
        if cfg.config_sha256 == source.get("config_sha256"):
            changes = []
        else:
            changes = diff_configs({k: v for k, v in old.items() if k != "runs_dir"},
                                   {k: v for k, v in config_to_json(cfg).items() if k != "runs_dir"})
            changes = changes or ["config file bytes changed (sha256), settings unchanged"]
    else:
        data = {k: old[k] for k in TOP_KEYS if k in old and k != "runs_dir"}  # the runs dir: where it is now
        if isinstance(data.get("alerts"), dict):  # run.json names push channels, never their URLs
            data["alerts"] = {k: v for k, v in data["alerts"].items() if k != "channels"}
        data.setdefault("name", source.get("name") or run_dir.name)
        data.setdefault("command", source.get("argv"))
        data.setdefault("cwd", source.get("cwd"))
        cfg = validate_config(data, Path("/"), "your copy of the launch", runs_dir_override=run_dir.parent)
        changes = []
    # the commit it launched: from the owner's copy, or from a run.json that matches it (a member's says nothing)
    moved = commit_change(source if "identity" in source else None if tampered else run, Path(cfg.cwd))
    return cfg, tampered + changes + ([moved] if moved else [])


#: Files a commit change names at most (the rest counted).
NAMED_FILES = 5
#: How the line that says the harness's commit moved begins (among relaunch_config's changes).
COMMIT_MOVED = "commit "


def commit_change(run: dict[str, Any] | None, cwd: Path) -> str | None:
    """``commit 1a2b3c4 → 5d6e7f8 since the last attempt (2 files changed: train.py, model.py)`` when the harness's
    HEAD moved since the attempt ``run`` describes (its identity, sampled at its launch); None when it did not or
    either is unknown. The files come from git; a commit git no longer has is said so."""
    import git  # noqa: PLC0415 - GitPython: only a relaunch pays for it

    ident = (run or {}).get("identity")
    old = ident.get("harness_commit") if isinstance(ident, dict) else None
    if not isinstance(old, str) or not old.isalnum() or len(old) != 40:
        return None
    try:
        repo = git.Repo(cwd, search_parent_directories=True)
        new = repo.head.commit.hexsha
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandError, ValueError):
        return None
    if new == old:
        return None
    head = f"{COMMIT_MOVED}{old[:7]} → {new[:7]} since the last attempt"
    try:
        files = [f for f in repo.git.diff("--name-only", old, new).splitlines() if f]
    except git.GitCommandError:
        return f"{head} (the last attempt's commit is no longer in the repository)"
    more = f", +{len(files) - NAMED_FILES} more" if len(files) > NAMED_FILES else ""
    return f"{head} ({len(files)} file{'s' if len(files) != 1 else ''} changed: {', '.join(files[:NAMED_FILES])}{more})"


def _what_differs(copy: dict[str, Any], run: dict[str, Any]) -> str:
    keys = [k for k in ("argv", "cwd", "env", "shell", "config", "config_path", "executable") if copy.get(k) != run.get(k)]
    return "its " + ", ".join(keys) if keys else "its record of the launch"


def newest_checkpoint_for(cfg: RunConfig) -> Checkpoint | None:
    """The newest complete checkpoint of ``cfg``'s run (launcher/checkpoints.py: the command's ``--output_dir``, or
    ``[restart] checkpoints``) that this run could have written (launcher/provenance.py: never one last written before
    its first launch), or None; None too when ``[restart] resume`` does not say how to resume from one."""
    s = cfg.settings.restart
    if s.resume is None:
        return None
    found = _checkpoints_of(cfg)
    run = read_json(cfg.run_dir / RUN_JSON, owner_uid=os.getuid()) or {}
    return newest_complete(judge_provenance(found, cfg.run_dir, run, None))


def _checkpoints_of(cfg: RunConfig) -> list[Checkpoint]:
    """Every checkpoint where ``cfg`` looks (launcher/checkpoints.py: the command's ``--output_dir``, ``[restart]
    checkpoints``), complete or not."""
    s = cfg.settings.restart
    cwd = Path(cfg.cwd)
    return find_checkpoints(output_dir_of([str(a) for a in cfg.command], cwd), s.checkpoints, cwd, s.complete_marker)


def resume_from(cfg: RunConfig, checkpoint: str | None, step: int | None, *, by: str, after_attempt: Any,
                restarts: int) -> bool:
    """Make ``cfg`` the attempt that resumes from ``checkpoint`` (its ``[restart] resume`` rule sets the argument; a
    shell string gets it quoted onto its end) and record it (run.json ``resumed_from``: ``by`` whom, after which
    attempt, the policy's restarts in a row). Returns whether the command resumes (else it starts from scratch).
    The path is handed normalised (no ``..``: launcher/checkpointpath.py judges it as the job will open it), and the
    command as it was is kept, to run from scratch if the path is refused at exec."""
    s = cfg.settings.restart
    checkpoint = os.path.normpath(checkpoint) if checkpoint else checkpoint
    if cfg.scratch_command is None:
        cfg.scratch_command = list(cfg.command)
    if cfg.shell:
        extra = resume_argv([], s.resume, checkpoint, step)
        cfg.command = [" ".join([*cfg.command, *map(shlex.quote, extra)])]
    else:
        cfg.command = resume_argv(list(cfg.command), s.resume, checkpoint, step)
    applied = bool(checkpoint and s.resume is not None)
    cfg.resumed_from = {"by": by, "restarts": restarts, "after_attempt": after_attempt,
                        "checkpoint": checkpoint if applied else None, "step": step if applied else None,
                        "unsafe_checkpoint": None}
    return applied


def resume_by_hand(cfg: RunConfig, run_dir: Path, checkpoint: Checkpoint) -> None:
    """The operator's relaunch from ``checkpoint`` (``r``'s "from checkpoint-N", ``relaunch --from-checkpoint``):
    recorded as theirs, after the attempt run.json names, with the policy's restarts in a row back at 0. Its path is
    judged now, so that the operator hears of an unsafe one before the checklist runs, and again right before exec
    (launcher/checkpointpath.py): LaunchRefused naming the directory, or a start from scratch where the config says."""
    attempt = (read_json(run_dir / RUN_JSON) or {}).get("attempt")
    resume_from(cfg, str(checkpoint.path), checkpoint.step, by="operator",
                after_attempt=attempt if type(attempt) is int else None, restarts=0)
    resume_at_exec(cfg, LaunchRefused)


def resume_newest_by_hand(cfg: RunConfig, run_dir: Path, path: str | None = None) -> Checkpoint:
    """``relaunch --from-checkpoint``: :func:`resume_by_hand` from this run's newest complete checkpoint, or with
    ``--checkpoint PATH`` from that one (another run's too: the operator's choice); LaunchRefused, naming why, when
    there is none, PATH is no complete checkpoint where the config looks, or the config has no ``[restart] resume``."""
    cp = _named_checkpoint(cfg, run_dir, path) if path else newest_checkpoint_for(cfg)
    if cp is None:
        raise LaunchRefused(f"REFUSING: --from-checkpoint: {run_dir.name} has no complete checkpoint to resume "
                            "from, or its config has no [restart] resume rule (\"hf\", \"lightning\" or a "
                            "template holding {checkpoint})")
    resume_by_hand(cfg, run_dir, cp)
    return cp


def _named_checkpoint(cfg: RunConfig, run_dir: Path, path: str) -> Checkpoint:
    """The complete checkpoint at ``path`` among those the config's rule finds (its provenance not judged: the operator
    chose it); LaunchRefused naming why it is not one."""
    s = cfg.settings.restart
    want = os.path.normpath(os.path.join(cfg.cwd, path))
    found = [c for c in _checkpoints_of(cfg) if os.path.normpath(str(c.path)) == want]
    if s.resume is None or not found or not found[0].complete:
        why = ("its config has no [restart] resume rule" if s.resume is None
               else f"it is not complete: {found[0].why}" if found
               else "it is none of the checkpoints the config's output dir or [restart] checkpoints names")
        raise LaunchRefused(f"REFUSING: --checkpoint {path}: {run_dir.name} cannot resume from it: {why}")
    return found[0]
