"""`python -m captioner <command>` is the same as the `captioner` console script."""

import sys

from captioner.cli import main

if __name__ == "__main__":
    sys.exit(main())
