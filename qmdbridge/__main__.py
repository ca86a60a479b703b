"""``python -m qmdbridge``: the ``qmdbridge`` command (``qmdbridge/cli/main.py``), for an
environment where the console script is not on ``PATH``."""

import sys

from qmdbridge.cli.main import main

sys.exit(main())
