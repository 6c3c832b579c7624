"""``python -m pipeopt``: the command line (:func:`pipeopt.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
