"""One run's settings, typed: each table of the run config converted once.

launcher/config.py builds a :class:`RunSettings` while it validates a config (the run's ``RunConfig.settings``), and
:meth:`RunSettings.of_run` builds the same from run.json's ``config`` (its plain form, as ``config_to_json`` writes
it) for the supervisor and the views, so that no reader parses a table again. Each table's accepted keys are
declared once, as its settings type's ``KEYS`` (:data:`TABLE_TYPES`); launcher/config.py refuses any other by name
with them. ``[slurm]`` is the launcher's alone (launcher/slurm.py checks it): it is carried as its checked table.

Each parser here raises ValueError in the words the config's refusal shows after ``<where> [<table>]: ``. Pure: no
I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stepwatch.monitors.detectors.stall import StallSettings, stall_settings
from stepwatch.monitors.parsers.logformats import UserPattern, compile_patterns
from stepwatch.monitors.parsers.logtracker import LogSettings, log_settings
from stepwatch.monitors.restartsettings import RestartSettings, restart_settings
from stepwatch.monitors.watch.paging import LEVELS, PagingSettings, check_finished, paging_settings

#: ``[preflight] test_timeout_s`` and ``min_free_bytes`` unless set (1 GiB in the runs dir's file system).
DEFAULT_TEST_TIMEOUT_S = 600.0
DEFAULT_MIN_FREE_BYTES = 1 << 30
#: ``[export] linger_s`` unless set: how long the endpoint stays up after the run ended, for a last scrape.
EXPORT_LINGER_S = 15.0


class FinalWords(ValueError):
    """A refusal already in its final words: the config shows it as it is (no ``<where> [<table>]:`` before it)."""


@dataclass(frozen=True, slots=True)
class PreflightSettings:
    """``[preflight]``: what the checklist (launcher/preflight.py) runs and checks before a launch. ``test_command``
    and ``training_arguments`` as the config holds them (the checklist judges their shape and says so)."""

    KEYS: ClassVar[tuple[str, ...]] = ("test_command", "test_timeout_s", "training_arguments", "python",
                                       "min_free_bytes")

    test_command: Any = None
    test_timeout_s: float = DEFAULT_TEST_TIMEOUT_S
    training_arguments: Any = None
    python: str | None = None
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES


def preflight_settings(table: Mapping[str, Any]) -> PreflightSettings:
    """The ``[preflight]`` table's settings; ValueError naming a bad one."""
    for key in ("test_timeout_s", "min_free_bytes"):
        v = table.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise ValueError(f"{key} must be a positive number; got {v!r}")
    if "python" in table and not isinstance(table["python"], str):
        raise ValueError("python must be a path string")
    return PreflightSettings(test_command=table.get("test_command"),
                             test_timeout_s=float(table.get("test_timeout_s", DEFAULT_TEST_TIMEOUT_S)),
                             training_arguments=table.get("training_arguments"), python=table.get("python") or None,
                             min_free_bytes=int(table.get("min_free_bytes", DEFAULT_MIN_FREE_BYTES)))


@dataclass(frozen=True, slots=True)
class AlertSettings:
    """``[alerts]``: where alerts go (``command``, the push ``urls``: never in run.json, so () there), how loud
    (``min_level``), how often (``rate_limit_s``, ``retries``, ``command_timeout_s``), the finished page
    (``finished``: True, False or channel names) and the paging settings (monitors/watch/paging.py)."""

    KEYS: ClassVar[tuple[str, ...]] = ("command", "urls", "min_level", "rate_limit_s", "retries", "command_timeout_s",
                                       "finished", *PagingSettings.KEYS)

    command: tuple[str, ...] | None = None
    urls: tuple[str, ...] = ()
    min_level: str | None = None
    rate_limit_s: float | None = None
    retries: int | None = None
    command_timeout_s: float | None = None
    finished: bool | tuple[str, ...] = False
    paging: PagingSettings = field(default_factory=PagingSettings)


def alert_settings(table: Mapping[str, Any]) -> AlertSettings:
    """The ``[alerts]`` table's settings; ValueError naming a bad one (a URL never shown: it may hold a token)."""
    ac = table.get("command")
    if ac is not None and not (isinstance(ac, list) and ac and all(isinstance(a, str) for a in ac)):
        raise ValueError(f"command must be an argv list, e.g. [\"notify-send\", \"stepwatch\"]; got {ac!r}")
    urls = table.get("urls")
    if urls is not None and not (isinstance(urls, list) and all(isinstance(u, str) and "://" in u for u in urls)):
        raise ValueError("urls must be a list of apprise URLs (scheme://...), e.g. "
                         f"[\"ntfy://ntfy.sh/my-topic\"]; got a {type(urls).__name__} with an entry that is not one "
                         "(not shown: URLs may hold tokens)")
    lvl = table.get("min_level")
    if lvl is not None and lvl not in LEVELS:
        raise ValueError(f"min_level must be \"info\", \"warning\" or \"error\"; got {lvl!r}")
    if "finished" in table:
        check_finished(table["finished"])
    paging = paging_settings(table)  # confirm_s, channel_min_level, quiet hours, digests
    for key, hi in (("rate_limit_s", 86400), ("retries", 10), ("command_timeout_s", 600)):
        v = table.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi
                              or (key == "retries" and not isinstance(v, int))):
            raise ValueError(f"{key} must be a number from 0 to {hi}; got {v!r}")
    fin = table.get("finished", False)
    return AlertSettings(command=tuple(ac) if ac else None, urls=tuple(urls or ()), min_level=lvl,
                         rate_limit_s=_opt_float(table.get("rate_limit_s")), retries=table.get("retries"),
                         command_timeout_s=_opt_float(table.get("command_timeout_s")),
                         finished=tuple(fin) if isinstance(fin, list) else fin, paging=paging)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class ExportSettings:
    """``[export]``: ``prometheus`` (HOST:PORT or HOST:FIRST-LAST, served by the supervisor; None: no endpoint) and
    ``linger_s`` (how long the endpoint stays up after the run ended, for a last scrape)."""

    KEYS: ClassVar[tuple[str, ...]] = ("prometheus", "linger_s")

    prometheus: str | None = None
    linger_s: float = EXPORT_LINGER_S


def export_settings(table: Mapping[str, Any]) -> ExportSettings:
    """The ``[export]`` table's settings; ValueError naming a bad one (FinalWords: the address's own refusal)."""
    if "prometheus" in table:
        from stepwatch.monitors.export.prometheus import parse_address  # noqa: PLC0415 - prometheus_client: only here

        if not isinstance(table["prometheus"], str):
            raise ValueError(f"prometheus must be a string HOST:PORT; got {table['prometheus']!r}")
        try:
            parse_address(table["prometheus"])
        except ValueError as e:
            raise FinalWords(str(e)) from None
    v = table.get("linger_s")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 3600):
        raise ValueError(f"linger_s must be a number of seconds from 0 to 3600; got {v!r}")
    return ExportSettings(prometheus=table.get("prometheus"), linger_s=float(table.get("linger_s", EXPORT_LINGER_S)))


#: The run config's tables with a settings type here, in the order a config lists and checks them ([slurm], the
#: launcher's, comes between restart and export): each type's ``KEYS`` are the table's accepted keys.
TABLE_TYPES: dict[str, Any] = {"preflight": PreflightSettings, "alerts": AlertSettings, "log": LogSettings,
                               "stall": StallSettings, "restart": RestartSettings, "export": ExportSettings}


def log_patterns(table: Mapping[str, Any]) -> tuple[UserPattern, ...]:
    """``[log] patterns``, compiled in RE2 (linear in the line); ValueError naming a bad one."""
    return tuple(compile_patterns(table.get("patterns", [])))


def check_examples(table: Mapping[str, Any]) -> None:
    """ValueError unless ``[log] examples`` is a list of log lines."""
    ex = table.get("examples", [])
    if not (isinstance(ex, list) and all(isinstance(x, str) for x in ex)):
        raise ValueError(f"examples must be a list of log lines (strings); got {ex!r}")


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Every table of one run's config, typed (the defaults for a table the config leaves out)."""

    preflight: PreflightSettings = field(default_factory=PreflightSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    log: LogSettings = field(default_factory=LogSettings)
    #: ``[log] patterns``, compiled
    patterns: tuple[UserPattern, ...] = ()
    stall: StallSettings = field(default_factory=StallSettings)
    restart: RestartSettings = field(default_factory=RestartSettings)
    #: ``[slurm]`` as launcher/slurm.py checked it; None: the run starts here, not through sbatch
    slurm: Mapping[str, Any] | None = None
    export: ExportSettings = field(default_factory=ExportSettings)

    @property
    def paging(self) -> PagingSettings:
        """``[alerts]``'s paging settings (monitors/watch/paging.py)."""
        return self.alerts.paging

    @classmethod
    def of_run(cls, run: Mapping[str, Any]) -> RunSettings:
        """The settings of a run record (run.json's ``config``): a table absent, not a table, or invalid gives that
        table's defaults (a hostile file's value is never a reason to judge or page differently than the defaults
        would); ``[alerts] urls`` are never there (alerts.urls.json holds them)."""
        config = run.get("config")
        return cls.of_config(config if isinstance(config, Mapping) else {})

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """The settings of a config's plain form (``config_to_json``), each table's defaults where it is invalid."""
        def table(name: str) -> Mapping[str, Any]:
            t = config.get(name)
            return t if isinstance(t, Mapping) else {}

        alerts = {k: v for k, v in table("alerts").items() if k != "channels"}  # run.json's names of the push URLs
        slurm = config.get("slurm")
        return cls(preflight=_or_default(preflight_settings, table("preflight"), PreflightSettings),
                   alerts=_or_default(alert_settings, alerts, AlertSettings),
                   log=_or_default(log_settings, table("log"), LogSettings),
                   patterns=_or_default(log_patterns, table("log"), tuple),
                   stall=_or_default(stall_settings, table("stall"), StallSettings),
                   restart=_or_default(restart_settings, table("restart"), RestartSettings),
                   slurm=dict(slurm) if isinstance(slurm, Mapping) else None,
                   export=_or_default(export_settings, table("export"), ExportSettings))


def _or_default(parse: Any, table: Mapping[str, Any], default: Any) -> Any:
    try:
        return parse(table)
    except ValueError:
        return default()
