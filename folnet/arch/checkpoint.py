"""Moved to `folnet.arch.io.model_dir` (folnet's model directory format). The old import path
keeps working: importing it gives that module itself."""

import sys

from folnet.arch.io import model_dir

sys.modules[__name__] = model_dir
