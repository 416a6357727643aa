"""Argument types the command-line tools share: a bad value is argparse's one-line
error naming the option (exit status 2), never a traceback."""
from __future__ import annotations

import argparse
import os


def at_least(lo: int):
    """An integer >= ``lo``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {n}")
        return n
    return parse


def head_dim(text: str) -> int:
    """A head dim K or V the kernels take (kdacupy/validation/head_dims.py: 16 to 256)."""
    from ..validation.head_dims import HEAD_DIMS, describe
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in {describe('forward')}, got {text!r}") from None
    if n not in HEAD_DIMS["forward"]:
        raise argparse.ArgumentTypeError(f"expected an integer in {describe('forward')}, got {n}")
    return n


def writable_file(text: str) -> str:
    """A path a file can be written at: its directory exists and is writable, and it is no directory."""
    where = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(where):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no directory {where!r}")
    if os.path.isdir(text) or not os.access(where, os.W_OK) or (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: not a writable file")
    return text
