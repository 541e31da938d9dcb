"""Run configuration: a TOML file (stdlib ``tomllib``) or the flags of ``stepwatch launch``.

A run config names the run, the command (an argv list, never a shell unless ``shell = true``), the
working directory (the harness checkout, inside a git work tree), the runs directory and extra
environment variables, plus the ``[preflight]`` and ``[alerts]`` tables that later checks read.
Unknown keys are an error that names the key and the accepted ones (ARCHITECTURE.md R13: validate
names, not only values). Relative paths in a file are relative to the file's directory.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepwatch.launcher.restartpolicy import RESTART_KEYS, restart_settings
from stepwatch.launcher.slurm import SLURM_KEYS, validate_slurm_table
from stepwatch.launcher.trust import CONFIG_REFUSAL, config_file_problem
from stepwatch.monitors.parsers.logformats import compile_patterns
from stepwatch.monitors.detectors.stall import STALL_KEYS, stall_settings
from stepwatch.monitors.watch.paging import PAGING_KEYS, check_finished, paging_settings
from stepwatch.monitors.parsers.logtracker import log_settings
from stepwatch.monitors.rundirs import RunsDirError, default_runs_dir, resolve_runs_dir
from stepwatch.monitors.runfiles import open_regular

TOP_KEYS = ("name", "command", "cwd", "runs_dir", "env", "shell", "preflight", "alerts", "log", "stall", "restart", "slurm",
            "export")
#: ``[export]``: ``prometheus`` (HOST:PORT or HOST:FIRST-LAST, served by the supervisor) and
#: ``linger_s`` (how long the endpoint stays up after the run ended, for a last scrape).
EXPORT_KEYS = ("prometheus", "linger_s")
PREFLIGHT_KEYS = ("test_command", "test_timeout_s", "training_arguments", "python", "min_free_bytes")
ALERTS_KEYS = ("command", "urls", "min_level", "rate_limit_s", "retries", "command_timeout_s", "finished", *PAGING_KEYS)
#: ``[log]``: the user's own step patterns (regexes with named groups step, max_steps, dt_s and any
#: metric) and example lines the checklist tries them on before there is a log; what the log may not
#: say: ``max_steps``, ``epochs`` (of an epoch-scoped counter), ``logging_steps`` (per HF log dict); and the run's own
#: words for an evaluation or a save (``eval_lines``, ``save_lines``: patterns searched in a line).
LOG_KEYS = ("patterns", "examples", "max_steps", "epochs", "logging_steps", "eval_lines", "save_lines")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


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
    for table, accepted, label in ((data, TOP_KEYS, where),
                                   (data.get("preflight"), PREFLIGHT_KEYS, f"{where} [preflight]"),
                                   (data.get("alerts"), ALERTS_KEYS, f"{where} [alerts]"),
                                   (data.get("log"), LOG_KEYS, f"{where} [log]"),
                                   (data.get("stall"), STALL_KEYS, f"{where} [stall]"),
                                   (data.get("slurm"), SLURM_KEYS, f"{where} [slurm]"),
                                   (data.get("export"), EXPORT_KEYS, f"{where} [export]")):
        if isinstance(table, dict):
            try:
                _check_unknown(table, accepted, label)
            except ConfigError as e:
                problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))


def _validate(data: dict[str, Any], base: Path, where: str, runs_dir_override: Path | None = None) -> RunConfig:
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
    preflight = data.get("preflight", {})
    if not isinstance(preflight, dict):
        raise ConfigError(f"{where}: [preflight] must be a table")
    _check_unknown(preflight, PREFLIGHT_KEYS, f"{where} [preflight]")
    for key in ("test_timeout_s", "min_free_bytes"):
        v = preflight.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise ConfigError(f"{where} [preflight]: {key} must be a positive number; got {v!r}")
    if "python" in preflight and not isinstance(preflight["python"], str):
        raise ConfigError(f"{where} [preflight]: python must be a path string")
    alerts = data.get("alerts", {})
    if not isinstance(alerts, dict):
        raise ConfigError(f"{where}: [alerts] must be a table")
    _check_unknown(alerts, ALERTS_KEYS, f"{where} [alerts]")
    ac = alerts.get("command")
    if ac is not None and not (isinstance(ac, list) and ac and all(isinstance(a, str) for a in ac)):
        raise ConfigError(f"{where} [alerts]: command must be an argv list, e.g. [\"notify-send\", \"stepwatch\"]; got {ac!r}")
    urls = alerts.get("urls")
    if urls is not None and not (isinstance(urls, list) and all(isinstance(u, str) and "://" in u for u in urls)):
        raise ConfigError(f"{where} [alerts]: urls must be a list of apprise URLs (scheme://...), e.g. "
                          f"[\"ntfy://ntfy.sh/my-topic\"]; got a {type(urls).__name__} with an entry that is not one "
                          "(not shown: URLs may hold tokens)")
    lvl = alerts.get("min_level")
    if lvl is not None and lvl not in ("info", "warning", "error"):
        raise ConfigError(f"{where} [alerts]: min_level must be \"info\", \"warning\" or \"error\"; got {lvl!r}")
    try:
        if "finished" in alerts:
            check_finished(alerts["finished"])
        paging_settings(alerts)  # confirm_s, channel_min_level, quiet hours, digests (monitors/watch/paging.py)
    except ValueError as e:
        raise ConfigError(f"{where} [alerts]: {e}") from None
    for key, hi in (("rate_limit_s", 86400), ("retries", 10), ("command_timeout_s", 600)):
        v = alerts.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi
                              or (key == "retries" and not isinstance(v, int))):
            raise ConfigError(f"{where} [alerts]: {key} must be a number from 0 to {hi}; got {v!r}")
    log = data.get("log", {})
    if not isinstance(log, dict):
        raise ConfigError(f"{where}: [log] must be a table, e.g. [log] patterns = ['step (?P<step>\\d+) loss (?P<loss>\\S+)']")
    try:
        compile_patterns(log.get("patterns", []))
    except ValueError as e:
        raise ConfigError(f"{where} [log]: {e}") from None
    try:
        log_settings(log)
    except ValueError as e:
        raise ConfigError(f"{where} [log]: {e}") from None
    ex = log.get("examples", [])
    if not (isinstance(ex, list) and all(isinstance(x, str) for x in ex)):
        raise ConfigError(f"{where} [log]: examples must be a list of log lines (strings); got {ex!r}")
    stall = data.get("stall", {})
    if not isinstance(stall, dict):
        raise ConfigError(f"{where}: [stall] must be a table, e.g. [stall] busy_floor_s = 600")
    try:
        stall_settings(stall)
    except ValueError as e:
        raise ConfigError(f"{where} [stall]: {e}") from None
    restart = data.get("restart", {})
    if not isinstance(restart, dict):
        raise ConfigError(f'{where}: [restart] must be a table, e.g. [restart] mode = "observe"')
    _check_unknown(restart, RESTART_KEYS, f"{where} [restart]")
    try:
        restart_settings(restart)  # launcher/restartpolicy.py
    except ValueError as e:
        raise ConfigError(f"{where} [restart]: {e}") from None
    try:
        slurm = validate_slurm_table(data["slurm"], where) if "slurm" in data else None
        export = _export_table(data.get("export", {}), where)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return RunConfig(name=name, command=list(command), cwd=cwd, runs_dir=runs_dir, env=dict(env), shell=shell,
                     preflight=dict(preflight), alerts=dict(alerts), log=dict(log), stall=dict(stall), restart=dict(restart), slurm=slurm,
                     export=export)


def _export_table(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [export] must be a table, e.g. [export] prometheus = \"127.0.0.1:9464\"")
    if "prometheus" in table:
        from stepwatch.monitors.export.prometheus import parse_address  # noqa: PLC0415

        if not isinstance(table["prometheus"], str):
            raise ValueError(f"{where} [export]: prometheus must be a string HOST:PORT; got {table['prometheus']!r}")
        parse_address(table["prometheus"])
    v = table.get("linger_s")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 3600):
        raise ValueError(f"{where} [export]: linger_s must be a number of seconds from 0 to 3600; got {v!r}")
    return dict(table)


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
    cfg = _validate(data, path.parent, str(path), runs_dir_override)
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
    return _validate(data, Path.cwd(), "flags", runs_dir_override=rd)


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
