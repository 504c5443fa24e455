"""``python -m raysim.cli ...``; also runnable as a file (``ray submit CLUSTER.yaml raysim/cli/__main__.py``)."""

import sys

from raysim.cli import main

if __name__ == "__main__":
    sys.exit(main())
