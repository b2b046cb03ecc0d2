"""The default ledger: ``set_default_ledger()`` or ``REPLAYSAFE_LEDGER_URL``."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ._constants import LEDGER_URL_ENV

if TYPE_CHECKING:
    from .ledgers import Ledger

_default: Ledger | None = None
# The ledger opened from the environment variable, with the URL it came from.
_from_env: tuple[str, Ledger] | None = None
_lock = threading.Lock()


def set_default_ledger(ledger: Ledger | None) -> None:
    """Use ``ledger`` for protected tools whose decorator and ``tool_call`` name none.

    ``None`` goes back to ``REPLAYSAFE_LEDGER_URL`` (or no ledger at all).
    """
    global _default
    _default = ledger


def default_ledger() -> Ledger | None:
    """The ledger set by ``set_default_ledger``, else the one ``REPLAYSAFE_LEDGER_URL`` names."""
    if _default is not None:
        return _default
    url = os.environ.get(LEDGER_URL_ENV)
    if not url:
        return None
    global _from_env
    with _lock:
        if _from_env is None or _from_env[0] != url:
            from .ledgers import open_ledger

            _from_env = (url, open_ledger(url))
        return _from_env[1]
