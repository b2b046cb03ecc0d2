"""An agent for the fork server's tests (tests/test_crashtest_forkserver.py): it notes, in its case's
directory, whether a module it imports was already imported when its own file was loaded, a string's
hash (which differs between processes with other hash seeds), and whether its garbage collector is on and
leaves objects frozen before it started alone."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

# Read before this file's own imports: True only in a run forked from a server that imported it ahead.
IMPORTED_AHEAD = "xml.dom.minidom" in sys.modules

import xml.dom.minidom  # noqa: E402, F401  # a module of the standard library no other code here imports

from crashtest_agents import protected  # noqa: E402


def main() -> None:
    run = os.environ["REPLAYSAFE_CRASHTEST_RUN"]
    folder = Path(os.environ["REPLAYSAFE_CRASHTEST_DIR"])
    (folder / f"imported-ahead-{run}").write_text(str(IMPORTED_AHEAD))
    (folder / f"hash-{run}").write_text(str(hash("replaysafe")))  # differs between processes' hash seeds
    (folder / f"collector-{run}").write_text(f"on={gc.isenabled()} frozen={gc.get_freeze_count() > 0}")
    protected()
