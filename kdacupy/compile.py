"""``python -m kdacupy.compile``: the entry point of ``kdacupy.cli.compile``."""
import sys

from .cli.compile import main

if __name__ == "__main__":
    sys.exit(main())
