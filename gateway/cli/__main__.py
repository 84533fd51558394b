"""``python -m gateway.cli``: the ``sloserve`` command."""

import sys

from gateway.cli import main

sys.exit(main())
