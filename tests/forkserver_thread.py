"""A module that starts a thread when imported (tests/test_crashtest_forkserver.py): a process that has
imported it cannot be forked safely."""

from __future__ import annotations

import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, name="started-on-import", daemon=True).start()
