"""Collect facts about the installed transformers Trainer callback API, TrainerState,
attention-implementation resolution and TrainingArguments, by running a short real Trainer.

Usage (run by tools/capture_fixtures/capture.sh, from its staging folder):
    python scripts/trainer_api_facts.py --out-dir <run_dir> --json trainer_api_facts.json
"""
import argparse
import dataclasses
import inspect
import json
import platform
import time
import traceback
from typing import Any

import torch
import transformers
from torch.utils.data import Dataset
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

EVENTS = [
    "on_init_end",
    "on_train_begin",
    "on_epoch_begin",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_log",
    "on_save",
    "on_epoch_end",
    "on_train_end",
]


def tiny_cfg(**kw):
    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=256,
        **kw,
    )


class Synthetic(Dataset):
    def __init__(self, n=200, L=64):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, L), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i].clone()}


class Recorder(TrainerCallback):
    def __init__(self):
        self.step_end_times = []
        self.kwargs_seen = {}  # event -> {kwarg: type name}
        self.first_logs = None
        self.log_value_types = {}
        self.calls = {}

    def _rec(self, event, kwargs):
        self.calls[event] = self.calls.get(event, 0) + 1
        if event not in self.kwargs_seen:
            self.kwargs_seen[event] = {k: type(v).__name__ for k, v in kwargs.items()}

    def on_step_end(self, args, state, control, **kwargs):
        self.step_end_times.append((state.global_step, time.perf_counter()))
        self._rec("on_step_end", kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._rec("on_log", dict(kwargs, logs=logs))
        if self.first_logs is None and logs and "loss" in logs:
            self.first_logs = dict(logs)
            self.log_value_types = {k: type(v).__name__ for k, v in logs.items()}


def _make_passthrough(event):
    def fn(self, args, state, control, **kwargs):
        self._rec(event, kwargs)

    return fn


for _ev in EVENTS:
    if _ev not in ("on_step_end", "on_log"):
        setattr(Recorder, _ev, _make_passthrough(_ev))


def attn_resolution():
    out = {}
    for impl in [None, "sdpa", "eager", "flex_attention"]:
        key = str(impl)
        row = {}
        # (a) AutoModelForCausalLM.from_config(cfg, attn_implementation=...)
        try:
            kw = {} if impl is None else {"attn_implementation": impl}
            m = AutoModelForCausalLM.from_config(tiny_cfg(), **kw)
            row["from_config"] = m.config._attn_implementation
            try:
                x = torch.randint(0, 256, (2, 33))
                with torch.no_grad():
                    y = m(input_ids=x, attention_mask=torch.ones_like(x))
                row["from_config_forward"] = "ok, logits shape %s" % (list(y.logits.shape),)
            except Exception as e:  # noqa: BLE001
                row["from_config_forward"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
        except Exception as e:  # noqa: BLE001
            row["from_config"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
        # (b) LlamaConfig(attn_implementation=...) then LlamaForCausalLM(cfg)
        try:
            cfg = tiny_cfg() if impl is None else tiny_cfg(attn_implementation=impl)
            m = LlamaForCausalLM(cfg)
            row["config_kwarg_then_init"] = m.config._attn_implementation
        except Exception as e:  # noqa: BLE001
            row["config_kwarg_then_init"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
        out[key] = row
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()

    facts: dict[str, Any] = {
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
    }

    # callback method signatures
    facts["TrainerCallback_method_signatures"] = {
        name: str(inspect.signature(getattr(TrainerCallback, name)))
        for name in sorted(dir(TrainerCallback))
        if name.startswith("on_")
    }

    # TrainerState / TrainerControl fields
    facts["TrainerState_fields"] = {
        f.name: (str(f.type) if not isinstance(f.type, type) else f.type.__name__)
        for f in dataclasses.fields(TrainerState)
    }
    facts["TrainerControl_fields"] = [f.name for f in dataclasses.fields(TrainerControl)]

    # TrainingArguments
    ta_params = inspect.signature(TrainingArguments.__init__).parameters
    facts["TrainingArguments"] = {
        "has_warmup_ratio_param": "warmup_ratio" in ta_params,
        "warmup_steps_annotation": str(ta_params["warmup_steps"].annotation),
        "has_torch_compile": "torch_compile" in ta_params,
        "has_include_num_input_tokens_seen": "include_num_input_tokens_seen" in ta_params,
        "include_num_input_tokens_seen_default": repr(ta_params["include_num_input_tokens_seen"].default),
        "has_logging_first_step": "logging_first_step" in ta_params,
        "n_params": len(ta_params) - 1,
    }
    try:
        # a probe: this transformers may have dropped the parameter (then the call raises, and that is the fact)
        TrainingArguments(output_dir=a.out_dir + "/wr",
                          warmup_ratio=0.1, report_to="none", use_cpu=True)  # pyright: ignore[reportCallIssue]
        facts["TrainingArguments"]["warmup_ratio_0.1_result"] = "accepted"
    except Exception as e:  # noqa: BLE001
        facts["TrainingArguments"]["warmup_ratio_0.1_result"] = "%s: %s" % (type(e).__name__, str(e)[:300])

    facts["attn_implementation_resolution"] = attn_resolution()

    # short real run to see which kwargs each event gets
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_cfg())
    rec = Recorder()
    args = TrainingArguments(
        output_dir=a.out_dir,
        max_steps=12,
        per_device_train_batch_size=8,
        logging_steps=5,
        save_strategy="steps",
        save_steps=6,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        include_num_input_tokens_seen=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Synthetic(), callbacks=[rec])
    trainer.train()
    st = trainer.state
    facts["run"] = {
        "events_call_counts": rec.calls,
        "kwargs_passed_per_event": rec.kwargs_seen,
        "first_on_log_logs_dict": rec.first_logs,
        "first_on_log_value_types": rec.log_value_types,
        "final_state": {
            "global_step": st.global_step,
            "max_steps": st.max_steps,
            "epoch": st.epoch,
            "num_input_tokens_seen": st.num_input_tokens_seen,
            "logging_steps": st.logging_steps,
            "save_steps": st.save_steps,
            "train_batch_size": st.train_batch_size,
            "total_flos": st.total_flos,
            "log_history": st.log_history,
        },
        "step_end_perf_counter_deltas_s": [
            round(t1 - t0, 6)
            for (_, t0), (_, t1) in zip(rec.step_end_times, rec.step_end_times[1:])
        ],
        "step_end_global_steps": [s for s, _ in rec.step_end_times],
    }
    with open(a.json, "w") as f:
        json.dump(facts, f, indent=1, default=repr)
    print("wrote", a.json)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
