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


def writable_file(text: str) -> str:
    """A path a file can be written at: its directory exists and is writable, and it is no directory."""
    where = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(where):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no directory {where!r}")
    if os.path.isdir(text) or not os.access(where, os.W_OK) or (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: not a writable file")
    return text
