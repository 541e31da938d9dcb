"""Run configuration: a TOML file (stdlib ``tomllib``) or the flags of ``stepwatch launch``.

A run config names the run, the command (an argv list, never a shell unless ``shell = true``), the
working directory (the harness checkout, inside a git work tree), the runs directory and extra
environment variables, plus the ``[preflight]`` and ``[alerts]`` tables that later checks read.
Unknown keys are an error that names the key and the accepted ones (ARCHITECTURE.md R13: validate
names, not only values). Relative paths in a file are relative to the file's directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from collections.abc import Callable

from stepwatch.launcher.slurm import SLURM_KEYS, validate_slurm_table
from stepwatch.launcher.trust import CONFIG_REFUSAL, config_file_problem
from stepwatch.monitors.rundirs import RunsDirError, default_runs_dir, resolve_runs_dir
from stepwatch.monitors.runfiles import open_regular
from stepwatch.monitors.runsettings import (TABLE_TYPES, FinalWords, RunSettings, alert_settings, check_examples,
                                            export_settings, log_patterns, preflight_settings)
from stepwatch.monitors.detectors.stall import stall_settings
from stepwatch.monitors.parsers.logtracker import log_settings
from stepwatch.monitors.restartsettings import restart_settings

#: The tables a config may hold, in order, each with its accepted keys (declared once, beside its settings type:
#: monitors/runsettings.py ``TABLE_TYPES``; ``[slurm]``'s in launcher/slurm.py).
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    **{name: TABLE_TYPES[name].KEYS for name in ("preflight", "alerts", "log", "stall", "restart")},
    "slurm": SLURM_KEYS, "export": TABLE_TYPES["export"].KEYS}
#: The top-level keys: the run's own, then its tables.
TOP_KEYS = ("name", "command", "cwd", "runs_dir", "env", "shell", *TABLE_KEYS)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
T = TypeVar("T")


class ConfigError(ValueError):
    """A run config that cannot be used; the message names what was wrong and how to fix it."""


class UntrustedConfig(ConfigError):
    """A config file others can write (or another user's): it cannot say what runs as this user
    (launcher/trust.py ``config_file_problem``, ARCHITECTURE.md R17)."""


@dataclass
class RunConfig:
    """One run's configuration, with every path absolute.

    ``command`` is the argv list (or a one-element list holding a shell string when ``shell``).
    ``config_path``/``config_sha256``/``config_data`` are set when it came from a file.
    """

    name: str
    command: list[str]
    cwd: Path
    runs_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    shell: bool = False
    preflight: dict[str, Any] = field(default_factory=dict)
    alerts: dict[str, Any] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    #: ``[stall]``: the floors of the stall, busy and evaluation/save budgets (monitors/detectors/stall.py)
    stall: dict[str, Any] = field(default_factory=dict)
    restart: dict[str, Any] = field(default_factory=dict)
    #: set by the restart policy for the attempt it starts: the checkpoint it resumes from, and its step
    resumed_from: dict[str, Any] | None = None
    #: the command before a resume argument was added: what runs when the checkpoint is refused at exec and
    #: ``[restart] unsafe_checkpoint = "scratch"`` (launcher/checkpointpath.py)
    scratch_command: list[str] | None = None
    #: ``[slurm]``: submit through sbatch instead of starting here (launcher/slurm.py); None: local
    slurm: dict[str, Any] | None = None
    #: ``[export]``: the supervisor's Prometheus endpoint (monitors/export/prometheus.py)
    export: dict[str, Any] = field(default_factory=dict)
    #: every table, typed (monitors/runsettings.py): what the launcher reads; the tables above are their plain form,
    #: as run.json records it (config_to_json)
    settings: RunSettings = field(default_factory=RunSettings)
    config_path: Path | None = None
    config_sha256: str | None = None
    config_data: dict[str, Any] | None = None

    @property
    def run_dir(self) -> Path:
        """``<runs_dir>/<name>``."""
        return self.runs_dir / self.name


def _check_unknown(table: dict, accepted: tuple[str, ...], where: str) -> None:
    unknown = [k for k in table if k not in accepted]
    if unknown:
        raise ConfigError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)}; "
            f"accepted keys are: {', '.join(accepted)}"
        )


def _unknown_keys(data: dict[str, Any], where: str) -> None:
    """Every unknown key at every level in one error (a newcomer fixes them all in one go)."""
    problems = []
    for table, accepted, label in ((data, TOP_KEYS, where), *((data.get(name), TABLE_KEYS[name], f"{where} [{name}]")
                                                              for name in TABLE_KEYS if name != "restart")):
        if isinstance(table, dict):
            try:
                _check_unknown(table, accepted, label)
            except ConfigError as e:
                problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))


def validate_config(data: dict[str, Any], base: Path, where: str, runs_dir_override: Path | None = None) -> RunConfig:
    """The config ``data`` (a TOML document's tables; paths relative to ``base``) checked and typed, its settings
    converted once (``RunConfig.settings``); ConfigError naming every unknown key, else the first bad value
    (``where`` begins each message)."""
    _unknown_keys(data, where)
    for key in ("name", "command"):
        if key not in data:
            raise ConfigError(f"{where}: missing required key {key!r}")
    name = data["name"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(
            f"{where}: 'name' must be letters, digits, '.', '_' or '-' (at most 128, not starting with "
            f"a dot or dash); got {name!r}"
        )
    shell = data.get("shell", False)
    if not isinstance(shell, bool):
        raise ConfigError(f"{where}: 'shell' must be true or false; got {shell!r}")
    command = data["command"]
    if shell:
        if isinstance(command, str):
            command = [command]
        if not (isinstance(command, list) and len(command) == 1 and isinstance(command[0], str)):
            raise ConfigError(f"{where}: with shell = true, 'command' must be one string")
    else:
        if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
            raise ConfigError(
                f"{where}: 'command' must be a non-empty list of strings (an argv, e.g. "
                f"[\"python\", \"train.py\"]); got {command!r}. Set shell = true to run a shell string."
            )
    cwd = Path(os.path.expanduser(str(data.get("cwd", ".")))) if isinstance(data.get("cwd", "."), str) else None
    if cwd is None:
        raise ConfigError(f"{where}: 'cwd' must be a path string")
    if os.path.islink(base / cwd) and not os.path.exists(base / cwd):  # a loop, or a link to nothing
        raise ConfigError(f"{where}: cwd {base / cwd} is a symlink that names no directory (a loop, or to nothing)")
    cwd = Path(os.path.realpath(base / cwd))
    rd = data.get("runs_dir")
    if rd is not None and not isinstance(rd, str):
        raise ConfigError(f"{where}: 'runs_dir' must be a path string; got {rd!r}")
    try:
        if runs_dir_override is not None:
            runs_dir = runs_dir_override
        elif rd is None:
            runs_dir = resolve_runs_dir(base / "runs") if where != "flags" else default_runs_dir()
        else:
            runs_dir = resolve_runs_dir(base / os.path.expanduser(rd))
    except RunsDirError as e:
        raise ConfigError(str(e) if where == "flags" else f"{where}: {e}") from None
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f"{where}: 'env' must be a table of string values, e.g. env = {{ CUDA_VISIBLE_DEVICES = \"0\" }}")
    for k, v in env.items():
        if not ENV_NAME_RE.match(k):
            raise ConfigError(f"{where}: env name {k!r} is not a valid environment variable name "
                              "(letters, digits and '_', not starting with a digit)")
        if "\0" in v:
            raise ConfigError(f"{where}: env {k} holds a NUL byte, which no environment can carry")
    preflight, pre = _table(data, "preflight", where, preflight_settings)
    alerts, al = _table(data, "alerts", where, alert_settings)
    log, (patterns, log_s, _) = _table(data, "log", where, lambda t: (log_patterns(t), log_settings(t), check_examples(t)))
    stall, stall_s = _table(data, "stall", where, stall_settings)
    restart, restart_s = _table(data, "restart", where, restart_settings)
    try:
        slurm = validate_slurm_table(data["slurm"], where) if "slurm" in data else None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    export, export_s = _table(data, "export", where, export_settings)
    settings = RunSettings(preflight=pre, alerts=al, log=log_s, patterns=patterns, stall=stall_s, restart=restart_s,
                           slurm=slurm, export=export_s)
    return RunConfig(name=name, command=list(command), cwd=cwd, runs_dir=runs_dir, env=dict(env), shell=shell,
                     preflight=preflight, alerts=alerts, log=log, stall=stall, restart=restart, slurm=slurm,
                     export=export, settings=settings)


#: What a table that is not one is refused with, after ``<where>: [<table>] must be a table``.
_TABLE_EXAMPLES = {"preflight": "", "alerts": "", "log": ", e.g. [log] patterns = ['step (?P<step>\\d+) loss (?P<loss>\\S+)']",
                   "stall": ", e.g. [stall] busy_floor_s = 600", "restart": ', e.g. [restart] mode = "observe"',
                   "export": ', e.g. [export] prometheus = "127.0.0.1:9464"'}


def _table(data: dict[str, Any], name: str, where: str, parse: Callable[[dict[str, Any]], T]) -> tuple[dict[str, Any], T]:
    """``[name]`` of ``data`` (a copy; {} when absent) and its settings as ``parse`` makes them; ConfigError naming
    what is wrong."""
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [{name}] must be a table{_TABLE_EXAMPLES[name]}")
    _check_unknown(table, TABLE_KEYS[name], f"{where} [{name}]")
    try:
        return dict(table), parse(table)
    except FinalWords as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:
        raise ConfigError(f"{where} [{name}]: {e}") from None


def load_config(path: str | os.PathLike[str], runs_dir_override: Path | None = None) -> RunConfig:
    """Read and validate a run config file.

    Raises ConfigError (file missing, TOML syntax error with its line, unknown or ill-typed keys), and
    UntrustedConfig for a file others can write or replace (every command that runs a config reads it here:
    launch, preflight, alerts test, relaunch, the TUI's launch key; ARCHITECTURE.md R17).
    ``runs_dir_override`` (the ``--runs-dir`` flag) wins over the file's ``runs_dir``.
    """
    path = Path(os.path.realpath(path))  # never Path.resolve: a symlink loop is a one-line refusal below
    try:
        fd = open_regular(path)
        if fd is None:
            raise ConfigError(f"config path is not a regular file: {path}")
        with os.fdopen(fd, "rb") as f:  # judged on the descriptor read: a file swapped in after a check is not read
            problem = config_file_problem(path, os.fstat(f.fileno()))
            if problem is not None:
                raise UntrustedConfig(f"REFUSING the config file {path}: {problem}. {CONFIG_REFUSAL}")
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a directory, not a TOML file: {path}") from None
    except OSError as e:  # unreadable (permissions, I/O): one line, as the others
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses per level: a 100,000-deep array is no config
        raise ConfigError(f"{path}: not valid TOML: nested too deeply to read") from None
    cfg = validate_config(data, path.parent, str(path), runs_dir_override)
    cfg.config_path = path
    cfg.config_sha256 = hashlib.sha256(raw).hexdigest()
    cfg.config_data = data
    return cfg


def config_from_flags(command: list[str], name: str | None, cwd: str | None, runs_dir: str | None,
                      env: list[str] | None = None) -> RunConfig:
    """Build a config from ``stepwatch launch [--name N] [--cwd C] [--env K=V] -- CMD ARGS``.

    The default name is the command's basename (e.g. ``train``). Raises ConfigError.
    """
    if not command:
        raise ConfigError("no command given: use `stepwatch launch CONFIG.toml` or `stepwatch launch -- CMD ARGS...`")
    env_map: dict[str, str] = {}
    for item in env or []:
        if "=" not in item:
            raise ConfigError(f"--env takes KEY=VALUE; got {item!r}")
        k, v = item.split("=", 1)
        env_map[k] = v
    if name is None:  # the script's name (`python train.py --lr 1` -> train), else the program's
        script = next((a for a in command[1:] if a.endswith(".py")), None)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(script or command[0]).stem).lstrip(".-") or "run"
    data: dict[str, Any] = {"name": name, "command": command, "env": env_map}
    if cwd is not None:
        data["cwd"] = cwd
    try:
        rd = resolve_runs_dir(runs_dir) if runs_dir else None
    except RunsDirError as e:
        raise ConfigError(str(e)) from None
    return validate_config(data, Path.cwd(), "flags", runs_dir_override=rd)


def resolve_executable(cfg: RunConfig) -> str:
    """Return the absolute path of the command's program, as the child will run it.

    Raises ConfigError when it is neither on PATH (the child's PATH, config env included) nor an
    executable file relative to ``cwd``. With ``shell = true`` the program is /bin/sh.
    """
    if cfg.shell:
        return "/bin/sh"
    prog = cfg.command[0]
    if os.sep in prog:
        p = Path(prog) if os.path.isabs(prog) else cfg.cwd / prog
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
        raise ConfigError(f"command not found or not executable: {p}")
    path_var = cfg.env.get("PATH", os.environ.get("PATH", ""))
    found = shutil.which(prog, path=path_var)
    if not found:
        raise ConfigError(f"command not found on PATH: {prog!r} (PATH={path_var})")
    return found


def config_to_json(cfg: RunConfig) -> dict[str, Any]:
    """The config as recorded in run.json (``config``): plain JSON values."""
    return {
        "name": cfg.name, "command": cfg.command, "cwd": str(cfg.cwd), "runs_dir": str(cfg.runs_dir),
        "env": cfg.env, "shell": cfg.shell, "preflight": cfg.preflight, "alerts": public_alerts(cfg.alerts),
        **({"log": cfg.log} if cfg.log else {}),  # absent when unused: a relaunch's diff stays quiet
        **({"stall": cfg.stall} if cfg.stall else {}),
        **({"restart": cfg.restart} if cfg.restart else {}),
        **({"slurm": cfg.slurm} if cfg.slurm is not None else {}),
        **({"export": cfg.export} if cfg.export else {}),
    }


def public_alerts(alerts: dict[str, Any]) -> dict[str, Any]:
    """The ``[alerts]`` table as run.json may show it to anyone who can read the run dir: the push
    URLs (tokens, passwords) replaced by their channels' names (scheme and host, ``channels``); the
    URLs themselves go to the 0600 ``alerts.urls.json`` beside it."""
    from stepwatch.monitors.snapshot.alerts import push_channel_names  # noqa: PLC0415

    out = {k: v for k, v in alerts.items() if k != "urls"}
    if alerts.get("urls"):
        out["channels"] = push_channel_names(alerts["urls"])
    return out


def diff_configs(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Human lines saying what changed between two ``config_to_json`` dicts (empty: nothing)."""
    if old is None:
        return ["no earlier config recorded"]
    lines = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            lines.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return lines
