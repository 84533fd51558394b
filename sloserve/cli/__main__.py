"""``python -m sloserve.cli``: the ``sloserve`` command."""

import sys

from sloserve.cli import main

sys.exit(main())
