"""Finding runs: RUN arguments (a path or a name under the runs dir) and the list of runs."""

from __future__ import annotations

from pathlib import Path

from monitors.runfiles import RUN_JSON, read_json


class RunNotFound(LookupError):
    """RUN names no run directory; the message says where it looked (CLI exit code 2)."""


def resolve_run(arg: str, runs_dir: Path) -> Path:
    """``arg`` as a run directory: an existing directory path with a run.json, else ``runs_dir/arg``.

    Raises RunNotFound naming both places looked at.
    """
    p = Path(arg).expanduser()
    if p.is_dir() and (p / RUN_JSON).exists():
        return p.resolve()
    q = runs_dir / arg
    if q.is_dir() and (q / RUN_JSON).exists():
        return q.resolve()
    raise RunNotFound(f"no run {arg!r}: neither {p.resolve()} nor {q} is a run directory (one with a {RUN_JSON}). "
                      f"List runs with: stepwatch runs --runs-dir DIR")


def list_runs(runs_dir: Path) -> list[Path]:
    """Run directories directly under ``runs_dir`` (those holding a run.json), newest launch first."""
    if not runs_dir.is_dir():
        return []
    found = []
    for d in runs_dir.iterdir():
        if d.is_dir() and (d / RUN_JSON).exists():
            rj = read_json(d / RUN_JSON) or {}
            found.append((rj.get("launched_at_unix") or 0.0, d))
    return [d for _, d in sorted(found, key=lambda x: -x[0])]
