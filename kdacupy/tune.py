"""``python -m kdacupy.tune``: the entry point of ``kdacupy.cli.tune``."""
import sys

from .cli.tune import main

if __name__ == "__main__":
    sys.exit(main())
