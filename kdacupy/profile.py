"""``python -m kdacupy.profile``: the entry point of ``kdacupy.cli.profile``."""
import sys

from .cli.profile import main

if __name__ == "__main__":
    sys.exit(main())
