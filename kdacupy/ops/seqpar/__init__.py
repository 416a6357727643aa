"""Sequence parallelism inside one GPU: segments, scan and split forward (split.py)."""
