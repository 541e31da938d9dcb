"""``stepwatch demo``: the bundled tiny training run, launched through the real launcher.

The demo job (``assets/demo_train.py``) needs a git work tree to pass the clean-tree gate, so the
demo keeps its own throw-away harness repository at ``<runs_dir>/.demo-harness``: the script is
copied there and committed whenever the bundled copy changes. The run itself is an ordinary run
named ``demo`` under the runs dir, so ``status``, ``watch``, ``attach`` and ``relaunch`` work on it.
"""

from __future__ import annotations

import importlib.util

import sys
from importlib import resources
from pathlib import Path

import git

from stepwatch.launcher.config import RunConfig
from stepwatch.monitors.runfiles import DIR_MODE, FILE_MODE, write_bytes_atomic

DEMO_NAME = "demo"
HARNESS_DIRNAME = ".demo-harness"
SCRIPT = "demo_train.py"


class DemoUnavailable(RuntimeError):
    """The demo cannot run here (torch or transformers missing); the message names the extra."""


def check_training_stack() -> None:
    """Raise DemoUnavailable naming what to install when torch or transformers is missing."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise DemoUnavailable(
            f"the demo trains a real model and needs {' and '.join(missing)}: "
            f"pip install torch==2.13.0 && pip install 'stepwatch[train]'")


def prepare_harness(runs_dir: Path) -> tuple[Path, str]:
    """Create or update the demo's git repo under ``runs_dir``; returns (path, what was done)."""
    repo_dir = runs_dir / HARNESS_DIRNAME
    src = resources.files("stepwatch.assets").joinpath(SCRIPT).read_bytes()
    if (repo_dir / ".git").is_dir():
        repo = git.Repo(repo_dir)
        action = "reused"
    else:
        repo_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        repo = git.Repo.init(repo_dir)
        action = "created"
    target = repo_dir / SCRIPT
    if not target.exists() or target.read_bytes() != src or repo.is_dirty(untracked_files=True):
        write_bytes_atomic(target, src, mode=FILE_MODE)  # whatever the umask: the checklist warns of a repo others write
        repo.index.add([SCRIPT])
        with repo.config_writer() as cw:
            cw.set_value("user", "name", "stepwatch demo")
            cw.set_value("user", "email", "demo@stepwatch.invalid")
        repo.index.commit("stepwatch demo harness")
        if action == "reused":
            action = "updated"
    return repo_dir, action


#: Replayed by the demo's GPU sampler when this machine has no NVML: a synthetic H100 recording,
#: labelled "recorded:<file>" in every gpu.jsonl record and on screen, never taken for live data.
DEMO_GPU_RECORDING = "synthetic_h100_healthy_compute_bound.jsonl"


def nvml_unavailable_reason() -> str | None:
    """Why NVML cannot be used here (e.g. "NVML Shared Library Not Found"), or None when it can."""
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return None
    except Exception as e:  # pynvml raises its own NVMLError subclasses, or OSError/ImportError
        return str(e) or type(e).__name__


def gpu_recording_env(choice: str, headless: bool = False) -> tuple[dict[str, str], str]:
    """The environment for the demo's supervisor (its GPU sampler) and a line saying what it reads.

    ``choice``: "auto" (replay the bundled recording only when NVML is unavailable), "none" (the
    real NVML path, degrading to "NVML unavailable"), or a recording file name / path.
    """
    from stepwatch.monitors.gpu.sampler import ENV_GPU_RECORDING  # noqa: PLC0415

    if choice == "none":
        return {}, "GPU: live NVML"
    if choice == "auto":
        why = nvml_unavailable_reason()
        if why is None:
            return {}, "GPU: live NVML"
        return ({ENV_GPU_RECORDING: DEMO_GPU_RECORDING},
                f"GPU: NVML unavailable here ({why}); the demo REPLAYS a recorded synthetic H100 "
                f"({DEMO_GPU_RECORDING}), labelled 'recorded' in {'stepwatch status' if headless else 'the GPU panel'}")
    if Path(choice).expanduser().exists():  # a path from where the command was typed, not the run's cwd
        choice = str(Path(choice).expanduser().resolve())
    return {ENV_GPU_RECORDING: choice}, f"GPU: replaying the recording {choice}"


def demo_config(runs_dir: Path, script_args: list[str]) -> tuple[RunConfig, str]:
    """The demo's run config (name ``demo``) and a line saying which harness repo it uses."""
    check_training_stack()
    harness, action = prepare_harness(runs_dir)
    cfg = RunConfig(name=DEMO_NAME, command=[sys.executable, SCRIPT, *script_args], cwd=harness.resolve(),
                    runs_dir=runs_dir)
    return cfg, f"demo harness: {action} throw-away git repo {harness} (commit {git.Repo(harness).head.commit.hexsha[:12]})"


