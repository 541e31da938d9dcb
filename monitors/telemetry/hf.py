"""StepwatchCallback: the HF Trainer side of the emitter (transformers 5.24, checked against
``tests/fixtures/real/trainer_api_facts.json``).

The class is built on first use (:func:`build_callback_class`), so ``import stepwatch.telemetry``
never imports transformers. What the Trainer tells callbacks, and what is taken from it:

* ``on_train_begin(model=...)``: ``run_start`` with ``state.max_steps``, ``args.process_index`` /
  ``args.world_size`` as rank / world size, and ``model.config._attn_implementation`` as the resolved
  attention backend beside the requested one (the constructor argument; ARCHITECTURE.md R4).
* ``on_step_begin``: the start of the first step of the process. The batch is NOT among the kwargs
  (the facts file: model, processing_class, optimizer, lr_scheduler, train_dataloader,
  eval_dataloader), and the Trainer fetches the batch before calling it.
* ``on_step_end``: one ``step`` event, ``step = state.global_step`` (optimizer steps). Tokens come
  from ``state.num_input_tokens_seen`` when ``include_num_input_tokens_seen`` is on: its growth over
  the step is ``tokens`` in mode ``"non_padding"`` (attention-mask sum) and ``padded_tokens`` in mode
  ``"all"`` (``input_ids.numel()``); the Trainer gathers it over all ranks, so it is the whole step's
  count. Otherwise both are null. Then ``phase`` begin for ``control.should_evaluate`` /
  ``control.should_save``, which ``DefaultFlowCallback`` (always first in the list) has just set.
  The save and the evaluation run after ``on_step_end``; their cost lands in the next step's ``dt``
  (facts file: 0.166 s instead of ~0.017 s for the step after the save at step 6).
* ``on_evaluate`` / ``on_save``: ``phase`` end. The Trainer evaluates before it saves, so a save
  announced together with an evaluation begins when the evaluation ends.
* the batch shapes: a forward pre-hook on the model (:class:`BatchShapes`) reads each training
  forward's ``input_ids`` shape and, on the CPU, its attention mask's sum: the step event's
  ``batch_size``, ``width`` and, where the Trainer does not count them, ``padded_tokens`` / ``tokens``.
* ``on_log(logs=...)``: one ``log`` event with the dict as given (floats, not the printed strings).
* ``on_train_end``: ``run_end``; the file is closed (the next ``train()`` reopens it).
"""

from __future__ import annotations

from typing import Any

from stepwatch.telemetry.core import StepTelemetry, attn_implementation_of

_CLASS: type | None = None


def _tokens_mode(args: Any) -> str:
    mode = getattr(args, "include_num_input_tokens_seen", "no")
    if mode is True:
        return "all"
    if mode is False or mode is None:
        return "no"
    return str(mode)


class BatchShapes:
    """The optimizer step's batch shapes, seen by a forward pre-hook on the model: each training
    forward's ``input_ids`` shape (sequences b, padded width w: a tensor's shape is metadata, reading
    it never synchronises a device) and, for a mask on the CPU, its sum (the real tokens; a mask on
    a GPU would need a device sync to read: its real tokens stay unknown). With gradient accumulation
    the micro-batches of one optimizer step are summed (:meth:`take`)."""

    def __init__(self) -> None:
        self.micro: list[tuple[int, int]] = []
        self.real: int | None = 0
        self.handle: Any = None

    def install(self, model: Any) -> None:
        self.remove()
        self.micro, self.real = [], 0
        register = getattr(model, "register_forward_pre_hook", None)
        if register is not None:
            try:
                self.handle = register(self._hook, with_kwargs=True)
            except TypeError:  # a torch without with_kwargs: no shapes
                self.handle = None

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _hook(self, module: Any, args: Any, kwargs: Any) -> None:
        try:
            if not getattr(module, "training", False):
                return  # an evaluation's forward is not the step's
            ids = (kwargs or {}).get("input_ids")
            if ids is None and args:
                ids = args[0]
            shape = getattr(ids, "shape", None)
            if shape is None or len(shape) != 2:
                return
            self.micro.append((int(shape[0]), int(shape[1])))
            mask = (kwargs or {}).get("attention_mask")
            if self.real is not None and mask is not None and getattr(mask.device, "type", None) == "cpu":
                self.real += int(mask.sum())
            else:
                self.real = None
        except Exception:  # noqa: BLE001 - telemetry never breaks the step
            self.real = None

    def take(self) -> tuple[int | None, float | int | None, int | None, int | None]:
        """(sequences, width, padded tokens, real tokens) of the step's micro-batches, then reset;
        width is the token-weighted Σb·w² / Σb·w (an int when every micro-batch has one width)."""
        micro, real = self.micro, self.real
        self.micro, self.real = [], 0
        if not micro:
            return None, None, None, None
        b = sum(m[0] for m in micro)
        bw = sum(m[0] * m[1] for m in micro)
        widths = {m[1] for m in micro}
        width: float | int = micro[0][1] if len(widths) == 1 else round(sum(m[0] * m[1] ** 2 for m in micro) / bw, 3)
        return b, width, bw, real


def build_callback_class() -> type:
    """Import transformers and return the ``StepwatchCallback`` class (built once, then cached).

    Raises ImportError when transformers is not installed."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from transformers import TrainerCallback

    class StepwatchCallback(TrainerCallback):
        """Writes ``events.jsonl`` for a ``transformers.Trainer`` run (keys: :mod:`stepwatch.monitors.protocol`).

        ``attn_implementation_requested``: the backend the harness asked for (the value it passed
        as ``attn_implementation=``), recorded beside the resolved one; None when it does not say.
        ``all_ranks``: every rank writes (``events.rank<N>.jsonl``); by default only rank 0.
        ``run_dir``: overrides ``STEPWATCH_RUN_DIR``. The :class:`StepTelemetry` doing the work is
        ``self.telemetry``.
        """

        def __init__(
            self,
            attn_implementation_requested: str | None = None,
            *,
            all_ranks: bool = False,
            run_dir: Any = None,
            check_interval_s: float = 1.0,
        ) -> None:
            self.attn_implementation_requested = attn_implementation_requested
            self.telemetry = StepTelemetry(
                run_dir=run_dir,
                attn_implementation_requested=attn_implementation_requested,
                all_ranks=all_ranks,
                start=False,
                check_interval_s=check_interval_s,
            )
            self._tokens_mode = "no"
            self._tokens_prev: int | None = None
            self._save_after_eval = False
            self._shapes = BatchShapes()

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            tel = self.telemetry
            self._tokens_mode = _tokens_mode(args)
            self._tokens_prev = getattr(state, "num_input_tokens_seen", None)
            self._save_after_eval = False
            self._shapes.install(model)
            tel.run_start(
                max_steps=getattr(state, "max_steps", None),
                attn_implementation_resolved=attn_implementation_of(model),
                model=model,
                rank=getattr(args, "process_index", None),
                world_size=getattr(args, "world_size", None),
            )

        def on_step_begin(self, args, state, control, **kwargs):
            self.telemetry.step_begin()

        def on_step_end(self, args, state, control, **kwargs):
            tel = self.telemetry
            if not tel.active:
                return
            tokens = padded = None
            if self._tokens_mode in ("all", "non_padding"):
                cur = getattr(state, "num_input_tokens_seen", None)
                if isinstance(cur, int) and isinstance(self._tokens_prev, int) and cur >= self._tokens_prev:
                    delta = cur - self._tokens_prev
                    if self._tokens_mode == "non_padding":
                        tokens = delta
                    else:
                        padded = delta
                self._tokens_prev = cur
            batch_size, width, shape_padded, real = self._shapes.take()
            step = state.global_step
            tel.step_end(tokens=tokens if tokens is not None else real,
                         padded_tokens=padded if padded is not None else shape_padded, step=step,
                         batch_size=batch_size, width=width)
            self._announce(control, step)

        def on_epoch_end(self, args, state, control, **kwargs):
            # epoch strategies set should_evaluate / should_save here, before the Trainer acts
            if self.telemetry.active:
                self._announce(control, state.global_step)

        def _announce(self, control, step):
            tel = self.telemetry
            evaluate = bool(getattr(control, "should_evaluate", False))
            save = bool(getattr(control, "should_save", False))
            if evaluate and not tel.phase_open("eval"):
                tel.phase("eval", "begin", step=step)
            if save and not tel.phase_open("save"):
                if evaluate:
                    self._save_after_eval = True  # the Trainer evaluates first, then saves
                else:
                    tel.phase("save", "begin", step=step)

        def on_evaluate(self, args, state, control, **kwargs):
            tel = self.telemetry
            tel.phase("eval", "end", step=state.global_step)
            if self._save_after_eval:
                self._save_after_eval = False
                tel.phase("save", "begin", step=state.global_step)

        def on_save(self, args, state, control, **kwargs):
            self._save_after_eval = False
            self.telemetry.phase("save", "end", step=state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.telemetry.log(logs if logs is not None else {}, step=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            self._shapes.remove()
            self.telemetry.run_end(step=state.global_step)
            self.telemetry.close()

    StepwatchCallback.__module__ = "stepwatch.telemetry"
    StepwatchCallback.__qualname__ = "StepwatchCallback"
    _CLASS = StepwatchCallback
    return _CLASS
