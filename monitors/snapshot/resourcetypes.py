"""The status snapshot's types for what the run uses: its GPUs (and their energy), the host's
share of it, the run dir's disk, the Slurm job, the step-time fit over the batch shape and the
padding. Part of :mod:`.types` (which re-exports them): one ``TypedDict`` per part, every key always
present unless ``NotRequired``.

No ``from __future__ import annotations`` (see :mod:`.types`).
"""

from typing import Any, Literal, TypedDict

#: A JSON value copied from a run file unchecked (any shape a hostile file can hold).
FileValue = Any


class Disk(TypedDict):
    """``disk``: the run dir's file system (:mod:`.disk`)."""

    free_bytes: int | None
    total_bytes: int | None
    full: bool | None
    write_errors: list[str]
    #: bytes of the run's output train.log could not take (exit.json; None until the end is recorded)
    log_lost_bytes: int | None
    #: why, in the file system's words (``No space left on device``), or None
    log_lost_reason: str | None
    error: str | None


class Health(TypedDict):
    """``health`` (:mod:`.health`)."""

    processes: int
    cpu_cores: float | None
    cpu_cores_basis: str | None
    rss_bytes: int | None
    host_load_1m: float | None
    host_cores: int | None


class GpuDevice(TypedDict):
    """``gpu[]``: one device's row (:func:`stepwatch.monitors.gpu.reading.status_row`); the values are
    gpu.jsonl's, NaN and inf made null."""

    index: FileValue
    name: FileValue
    uuid: FileValue
    util_pct: FileValue
    power_w: FileValue
    power_limit_w: FileValue
    power_share: float | None
    mem_used_bytes: FileValue
    mem_total_bytes: FileValue
    sm_clock_mhz: FileValue
    temperature_c: FileValue
    sm_active_pct: FileValue
    sm_occupancy_pct: FileValue
    tensor_active_pct: FileValue
    used_by_run: FileValue
    run_ranks: list[int] | None
    verdict: str | None
    #: per null metric, why it is null
    unsupported: dict[str, str]


class DeviceHistory(TypedDict):
    """``gpu_history[index]``: the panel's sparklines, oldest first."""

    util_pct: list[float | None]
    power_share: list[float | None]


class Energy(TypedDict):
    """``energy`` (:class:`stepwatch.monitors.gpu.energy.EnergyMeter`)."""

    joules: float | None
    joules_per_step: float | None
    tokens_per_joule: float | None
    steps: int
    devices: list[int]
    source: str
    unsupported: str | None


class Scheduler(TypedDict):
    """``scheduler``: a Slurm run's job (:mod:`.scheduler`); null for a local run."""

    kind: Literal["slurm"]
    job_id: str | None
    state: str
    reason: str | None
    nodes: str | None
    exit_code: str | None
    time_limit_s: float | None
    time_left_s: float | None
    start_unix: float | None
    end_unix: float | None
    source: str | None
    error: str | None
    poll_age_s: float | None
    stale: bool
    previous_job_ids: list[str]


class Survivor(TypedDict):
    """``survivors[]``: a process of the ended run still alive."""

    pid: int
    create_time: float | None
    name: str | None
    rank: int | None
    pgid: int | None
    sid: int | None


class ScalingShares(TypedDict):
    linear: float | None
    quadratic: float | None
    constant: float | None


class Scaling(TypedDict):
    """``scaling``: the step-time fit over the batch shape (:mod:`stepwatch.monitors.detectors.scaling`)."""

    verdict: Literal["undetermined", "launch-bound", "quadratic", "linear"]
    reason: str | None
    steps: int
    distinct_widths: int
    a_s_per_token: float | None
    b_s_per_token_width: float | None
    c_s: float | None
    a_se: float | None
    b_se: float | None
    c_se: float | None
    r2: float | None
    residual_s: float | None
    residual_share: float | None
    shares: ScalingShares | None
    e_w: float | None
    e_w2: float | None
    e_w2_over_e_w_sq: float | None


class PaddingWidth(TypedDict):
    width: int
    padded_s: float
    unpadded_s: float
    padded_steps: int
    unpadded_steps: int
    padded_excess: float | None


class Padding(TypedDict):
    """``padding``: padded against unpadded steps."""

    share: float | None
    steps: int
    unpadded_steps: int
    unpadded_share: float | None
    same_width: list[PaddingWidth]
