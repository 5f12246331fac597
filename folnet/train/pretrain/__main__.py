"""``python -m folnet.train.pretrain`` (and ``torchrun ... -m folnet.train.pretrain``): the
``folnet pretrain`` command, for launchers that start a module rather than a script."""

import sys

from folnet.cli import main

sys.exit(main(["pretrain", *sys.argv[1:]]))
