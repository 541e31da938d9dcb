"""Watching torch dynamo from inside the training process, without importing torch.

Three sources, all real in torch 2.13 (``tests/fixtures/real/``):

* ``torch._dynamo.utils.counters``: a ``defaultdict(Counter)``. Real keys (dynamo_counters*.json):
  ``stats.unique_graphs``, ``stats.calls_captured``, ``frames.total`` / ``frames.ok``, ``graph_break``
  (absent until a break in a warm-cache run, an empty dict in a cold one), ``unimplemented`` (holds
  the "Dynamo recompile limit exceeded ..." text with a count), ``aot_autograd``, ``inductor``,
  ``aten_mm_info``, ``resumes``. There is **no** recompile key. :func:`counters_snapshot` copies it
  as plain dicts, read only with ``.items()``.
* Dynamo's own log records, seen by a :class:`logging.Handler` added to the ``torch._dynamo`` logger
  (torch registers that logger with its own stream handler and ``propagate=False``; records of
  ``torch._dynamo.convert_frame`` and of the ``recompiles`` artifact logger propagate up to it).
  The handler only counts; it changes no level, no propagation and no other handler, so what the
  user's log prints is unchanged.

  - the recompile-limit warning, printed even without ``TORCH_LOGS``: WARNING from
    ``torch._dynamo.convert_frame`` whose format string starts ``torch._dynamo hit config.``
    (``recompile_limit`` or ``accumulated_recompile_limit``);
  - ``TORCH_LOGS=recompiles`` (or ``recompiles_verbose``) records: DEBUG from
    ``torch._dynamo.guards.__recompiles`` starting ``Recompiling function``. Dynamo emits one for
    every recompile attempt, including the attempt that then hits the limit.
* ``torch._dynamo.callback_handler.register_start_callback``: called once per dynamo compilation with
  ``compile_id`` ``"<frame_id>/<frame_compile_id>"`` (``"!<ca_id>/<frame_id>/<n>"`` under compiled
  autograd). ``frame_compile_id > 0`` is a recompile of that frame. Measured on this torch: with
  ``recompile_limit=2`` and shapes 1..5, callbacks came for ``0/0`` and ``0/1`` only; the attempt that
  hit the limit (``0/2``) compiled nothing and fired no callback, while TORCH_LOGS printed a
  "Recompiling" record for it. So the recompile count is the callback count; without the callback
  API it is (records - limit hits), and null when neither can be observed.

Nothing here imports torch: everything is reached through ``sys.modules``, and only once
``torch._dynamo`` is already loaded (``import transformers.Trainer`` loads it; plain ``import torch``
does not, and then no compilation can have happened).

``torch._dynamo.reset()`` clears the compile callbacks; :meth:`DynamoObserver.check` re-registers and,
when ``frames.total`` moved while no callback was registered, marks the recompile count unknown.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

#: Start of the recompile-limit warning's format string (torch/_dynamo/convert_frame.py).
LIMIT_WARNING_PREFIX = "torch._dynamo hit config."
#: Start of a ``recompiles`` artifact record (torch/_dynamo/guards.py).
RECOMPILE_RECORD_PREFIX = "Recompiling function"
#: Logger names whose records count as recompile records.
RECOMPILE_LOGGER_SUFFIXES = (".__recompiles", ".__recompiles_verbose")
#: The logger the handler is added to.
DYNAMO_LOGGER = "torch._dynamo"
#: The logger that emits the recompile-limit warning.
CONVERT_FRAME_LOGGER = "torch._dynamo.convert_frame"

_COMPILE_ID_RE = re.compile(r"(?<!\d)(\d{1,12})/(\d{1,12})$")


def counters_snapshot(counters: Any) -> dict[str, dict[str, Any]] | None:
    """``torch._dynamo.utils.counters`` as ``{group: {key: count}}`` with string keys.

    Returns None when it cannot be read this time (another thread changed it while it was copied).
    """
    try:
        return {str(group): {str(k): v for k, v in dict(c).items()} for group, c in list(counters.items())}
    except Exception:
        return None


def frames_total(counters: Any) -> int:
    """``counters["frames"]["total"]`` read without creating the group; 0 when absent."""
    try:
        frames = counters.get("frames") if hasattr(counters, "get") else None
        return int(frames.get("total", 0)) if frames is not None else 0
    except Exception:
        return 0


def frame_compile_id(compile_id: Any) -> int | None:
    """``"0/3"`` -> 3, ``"!2/0/3"`` -> 3; None when the id names no frame compilation."""
    m = _COMPILE_ID_RE.search(str(compile_id).strip())
    return int(m.group(2)) if m else None


class _CountingHandler(logging.Handler):
    """Counts dynamo's recompile records and recompile-limit warnings; never formats, never raises.

    Python prints a WARNING that finds no handler at all through ``logging.lastResort``; the mere
    presence of this handler would silence that. So when it is the only handler a record meets, it
    passes the record on to ``logging.lastResort`` itself: what the user's log prints is unchanged.
    """

    def __init__(self, observer: DynamoObserver) -> None:
        super().__init__(logging.NOTSET)
        self._observer = observer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._observer.on_record(record)
        except Exception:  # a logging handler must not print tracebacks into the user's log
            pass
        try:
            self._keep_last_resort(record)
        except Exception:
            pass

    def _keep_last_resort(self, record: logging.LogRecord) -> None:
        last = logging.lastResort
        if last is None or record.levelno < last.level:
            return
        c: logging.Logger | None = logging.getLogger(record.name)
        while c is not None:
            for h in c.handlers:
                if h is not self:
                    return  # someone else handles it: Python would not have used lastResort
            c = c.parent if c.propagate else None
        last.handle(record)

    def handleError(self, record: logging.LogRecord) -> None:  # pragma: no cover - emit never raises
        pass


class DynamoObserver:
    """Counts recompiles and recompile-limit hits for the whole process (one per process).

    Counts start when :meth:`try_install` first finds ``torch._dynamo`` loaded. They are only
    *reported* (:meth:`recompiles`, :meth:`recompile_limit_hits`) when the observer saw everything:
    installed before dynamo converted its first frame (``frames.total == 0`` at install), and, for
    recompiles, no gap after a ``torch._dynamo.reset()``. Otherwise they are None: unknown, not 0.
    """

    def __init__(self) -> None:
        self.installed = False
        #: frames.total when the observer was installed (0: it saw every compilation).
        self.frames_total_at_install: int | None = None
        #: Dynamo compilations (compile-start callbacks, trigger DYNAMO).
        self.compiles = 0
        #: Compilations with frame_compile_id > 0.
        self.recompiles_cb = 0
        #: ``Recompiling function`` records seen (TORCH_LOGS=recompiles).
        self.recompile_records = 0
        #: Recompile-limit warnings seen.
        self.limit_hits = 0
        self.callback_registered = False
        self.callback_gap = False
        #: Were recompile records enabled at every check since install? (fallback source only)
        self.records_observable = False
        #: Was the convert_frame logger enabled for WARNING at every check since install?
        self.limit_observable = False
        self._frames_total_last = 0
        self._handler: _CountingHandler | None = None
        self._callback_handler: Any = None

    # --- installation -------------------------------------------------------------------------
    def try_install(self) -> bool:
        """Install the log handler and the compile callback if ``torch._dynamo`` is loaded.

        Cheap when already installed or when dynamo is not loaded (one ``sys.modules`` lookup).
        Never imports torch, never raises.
        """
        if self.installed:
            return True
        utils = sys.modules.get("torch._dynamo.utils")
        dyn = sys.modules.get("torch._dynamo")
        if utils is None or dyn is None:
            return False
        try:
            counters = getattr(utils, "counters", None)
            if counters is None:
                return False
            self.frames_total_at_install = frames_total(counters)
            self._frames_total_last = self.frames_total_at_install
            self._handler = _CountingHandler(self)
            logging.getLogger(DYNAMO_LOGGER).addHandler(self._handler)
            self._callback_handler = getattr(dyn, "callback_handler", None)
            self.callback_registered = self._register_callback()
            self.records_observable = self._records_enabled()
            self.limit_observable = self._limit_enabled()
            self.installed = True
        except Exception:
            return False
        return True

    def uninstall(self) -> None:
        """Remove the handler and the callback (tests; a process normally keeps one observer)."""
        if self._handler is not None:
            logging.getLogger(DYNAMO_LOGGER).removeHandler(self._handler)
        cbh = self._callback_handler
        if cbh is not None:
            try:
                if self.on_compile_start in cbh.start_callbacks:
                    cbh.start_callbacks.remove(self.on_compile_start)
            except Exception:
                pass
        self.installed = False

    def _register_callback(self) -> bool:
        cbh = self._callback_handler
        if cbh is None or not hasattr(cbh, "register_start_callback"):
            return False
        try:
            cbh.register_start_callback(self.on_compile_start)
            return True
        except Exception:
            return False

    @staticmethod
    def _records_enabled() -> bool:
        internal = sys.modules.get("torch._logging._internal")
        state = getattr(internal, "log_state", None)
        if state is None:
            return False
        try:
            return bool(state.is_artifact_enabled("recompiles") or state.is_artifact_enabled("recompiles_verbose"))
        except Exception:
            return False

    @staticmethod
    def _limit_enabled() -> bool:
        return logging.getLogger(CONVERT_FRAME_LOGGER).isEnabledFor(logging.WARNING)

    # --- the sources --------------------------------------------------------------------------
    def on_compile_start(self, args: Any) -> None:
        """Dynamo compile-start callback (``CallbackArgs(callback_trigger, compile_id)``)."""
        try:
            trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")
            if trigger != "DYNAMO":
                return
            self.compiles += 1
            n = frame_compile_id(getattr(args, "compile_id", ""))
            if n is not None and n > 0:
                self.recompiles_cb += 1
        except Exception:
            pass

    def on_record(self, record: logging.LogRecord) -> None:
        """Count one log record if it is a recompile record or the recompile-limit warning."""
        msg = record.msg if isinstance(record.msg, str) else ""
        if record.levelno >= logging.WARNING:
            if msg.startswith(LIMIT_WARNING_PREFIX):
                self.limit_hits += 1
        elif record.name.endswith(RECOMPILE_LOGGER_SUFFIXES) and msg.startswith(RECOMPILE_RECORD_PREFIX):
            self.recompile_records += 1

    # --- periodic check -----------------------------------------------------------------------
    def check(self, counters: Any) -> None:
        """About once a second: re-register a callback that ``torch._dynamo.reset()`` removed, and
        keep the observability flags honest. ``counters`` is ``torch._dynamo.utils.counters``."""
        if not self.installed:
            return
        total = frames_total(counters)
        if self.callback_registered:
            cbh = self._callback_handler
            try:
                present = self.on_compile_start in cbh.start_callbacks
            except Exception:
                present = True
            if not present:
                if total != self._frames_total_last:
                    self.callback_gap = True  # frames were converted while nobody listened
                self.callback_registered = self._register_callback()
        self._frames_total_last = total
        if not self._records_enabled():
            self.records_observable = False
        if not self._limit_enabled():
            self.limit_observable = False

    # --- what is reported ---------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """True when the observer was installed before dynamo converted any frame."""
        return self.installed and self.frames_total_at_install == 0

    def recompile_signal(self) -> int:
        """A number that grows by one per observed recompile (for the per-step flag); 0 if unknown."""
        if self.callback_registered or self.recompiles_cb:
            return self.recompiles_cb
        return max(0, self.recompile_records - self.limit_hits)

    def recompiles(self) -> int | None:
        """Recompiles observed in this process, or None when they could not all be observed."""
        if not self.complete:
            return None
        if self.callback_registered and not self.callback_gap:
            return self.recompiles_cb
        if self._callback_handler is None or not hasattr(self._callback_handler, "register_start_callback"):
            # no callback API: one record per recompile attempt, one of them per limit hit
            if self.records_observable and self.limit_observable:
                return max(0, self.recompile_records - self.limit_hits)
        return None

    def recompile_limit_hits(self) -> int | None:
        """Recompile-limit warnings observed in this process, or None when they could not be."""
        if not self.complete or not self.limit_observable:
            return None
        return self.limit_hits


#: The process's observer (logging handlers and dynamo callbacks are process-wide).
OBSERVER = DynamoObserver()
