"""``python -m privasr`` runs the command line."""

import sys

from privasr.cli import main

if __name__ == "__main__":
    sys.exit(main())
