"""The ``[restart]`` table's settings, typed: what the restart policy (launcher/restartpolicy.py) decides with, read by
the supervisor and the views too (monitors/runsettings.py). Its keys are declared here once (``RestartSettings.KEYS``).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from stepwatch.monitors.states import OFF, RESTART_MODES, RestartMode

MODES = RESTART_MODES  # the modes and verdicts are state words: monitors/states.py
UNSAFE_CHECKPOINT = ("stop", "scratch")


@dataclass(frozen=True, slots=True)
class RestartSettings:
    #: the ``[restart]`` keys the run config accepts (launcher/config.py refuses any other by name)
    KEYS: ClassVar[tuple[str, ...]] = ("mode", "max_restarts", "backoff_s", "storm_attempts", "storm_window_s",
                                       "checkpoints", "complete_marker", "resume", "unsafe_checkpoint")

    mode: RestartMode = OFF
    max_restarts: int = 3
    backoff_s: float = 30.0
    storm_attempts: int = 3
    storm_window_s: float = 600.0
    checkpoints: str | None = None
    complete_marker: str | None = None
    resume: str | tuple[str, ...] | None = None
    unsafe_checkpoint: str = "stop"


def restart_settings(table: Mapping[str, Any]) -> RestartSettings:
    """The ``[restart]`` table's settings; ValueError naming a bad one."""
    got: dict[str, Any] = {}
    if "mode" in table:
        if table["mode"] not in MODES:
            raise ValueError(f'mode must be "off", "observe" or "enforce"; got {table["mode"]!r}')
        got["mode"] = table["mode"]
    for key, lo, hi in (("max_restarts", 0, 1000), ("storm_attempts", 2, 1000)):
        if key in table:
            if type(table[key]) is not int or not lo <= table[key] <= hi:
                raise ValueError(f"{key} must be a whole number from {lo} to {hi}; got {table[key]!r}")
            got[key] = table[key]
    for key in ("backoff_s", "storm_window_s"):
        if key in table:
            if type(table[key]) not in (int, float) or not 0 <= table[key] <= 86400:
                raise ValueError(f"{key} must be a number of seconds from 0 to 86400; got {table[key]!r}")
            got[key] = float(table[key])
    for key in ("checkpoints", "complete_marker"):
        if key in table:
            v = table[key]
            if not isinstance(v, str) or not v or v.startswith("/") or ".." in v.split("/"):
                raise ValueError(f"{key} must be a relative glob or file name inside the run's cwd; got {v!r}")
            got[key] = v
    if "resume" in table:
        r = table["resume"]
        if isinstance(r, list) and r and all(isinstance(a, str) for a in r) and any(
                "{checkpoint}" in a or "{step}" in a for a in r):
            got["resume"] = tuple(r)
        elif r in ("hf", "lightning"):
            got["resume"] = r
        else:
            raise ValueError('resume must be "hf", "lightning" or an argv list holding {checkpoint} or {step}; '
                             f"got {r!r}")
    if "unsafe_checkpoint" in table:
        if table["unsafe_checkpoint"] not in UNSAFE_CHECKPOINT:
            raise ValueError(f'unsafe_checkpoint must be "stop" or "scratch"; got {table["unsafe_checkpoint"]!r}')
        got["unsafe_checkpoint"] = table["unsafe_checkpoint"]
    return RestartSettings(**got)
