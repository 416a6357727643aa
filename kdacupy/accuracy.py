"""``python -m kdacupy.accuracy``: the entry point of ``kdacupy.cli.accuracy``."""
import sys

from .cli.accuracy import main

if __name__ == "__main__":
    sys.exit(main())
