"""``python -m rlhfkit`` = the ``rlhfkit`` command."""

import sys

from .cli import main

sys.exit(main())
