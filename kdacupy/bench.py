"""``python -m kdacupy.bench``: the entry point of ``kdacupy.cli.bench``."""
import sys

from .cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
