"""``python -m replaysafe``: the same as the ``replaysafe`` command."""

import sys

from ._cli import main

sys.exit(main())
