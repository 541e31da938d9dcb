"""Package data: the demo training script, example run configs, recorded GPU samples."""
