"""``python -m folnet ...`` runs the command line (same as the ``folnet`` script)."""

import sys

from folnet.cli import main

sys.exit(main())
