"""Parsers of what a training program prints: HF/tqdm progress, torch dynamo records."""
