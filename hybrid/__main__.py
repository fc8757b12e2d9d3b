"""``python -m hybrid ...``: the ``hybrid`` command (see :mod:`hybrid.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
