"""A tiny HF Trainer program for the restart policy's live tests: its preamble (arguments, data, model) and its
training arguments; a test adds what kills it and where (a callback, a Trainer subclass)."""

#: argparse (``--output_dir``, ``--resume_from_checkpoint``), 320 synthetic 16-token rows, a 2-layer Llama of width 32
PREAMBLE = r'''
import argparse, os, signal
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--output_dir", required=True)
ap.add_argument("--resume_from_checkpoint")
a = ap.parse_args()


class Tokens(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = [torch.randint(0, 128, (16,), generator=g) for _ in range(320)]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
args = TrainingArguments(output_dir=a.output_dir, max_steps=80, per_device_train_batch_size=4, save_steps=20,
                         logging_steps=1, report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0)
'''
