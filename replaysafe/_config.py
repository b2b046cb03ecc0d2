"""Process-wide settings: the default ledger, the global timeouts, the registered pauses, the test switch."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from ._constants import DISABLED_ENV, LEDGER_URL_ENV, UNSET, timeout_setting

if TYPE_CHECKING:
    from .ledgers import Ledger

_default: Ledger | None = None
# The ledger opened from the environment variable, with the URL it came from.
_from_env: tuple[str, Ledger] | None = None
_lock = threading.Lock()
#: The global timeouts (seconds, ``None`` for none) given to ``set_default_timeouts``;
#: ``UNSET`` for the built-in ones (``_constants.TOOL_TIMEOUT`` and ``NODE_TIMEOUT``),
#: which never move a tool to another thread (see ``_decorator``).
default_tool_timeout: float | None = UNSET
default_node_timeout: float | None = UNSET
#: Exceptions that pause every protected call (``register_pause``).
pauses: tuple[type[BaseException], ...] = ()
#: The in-doubt policy of a tool decorated without one: ``"rerun"``, or what ``replaysafe crashtest
#: --policy`` sets in the processes it runs (before the agent's tools are decorated).
default_in_doubt: Literal["rerun", "raise"] = "rerun"


def _disabled_by_environment() -> bool:
    return os.environ.get(DISABLED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


#: Protected tools run plainly: ``REPLAYSAFE_DISABLED=1`` when replaysafe was imported (or at the last
#: ``replaysafe.testing.reset()``), or inside ``replaysafe.testing.disabled()``. Read once, not per call.
disabled: bool = _disabled_by_environment()

#: What ``replaysafe.testing.reset()`` runs: each module holding process-wide state registers its own reset.
_resets: list[Callable[[], None]] = []


def on_reset(function: Callable[[], None]) -> Callable[[], None]:
    """Register ``function`` to run on ``replaysafe.testing.reset()``; returns it (usable as a decorator)."""
    _resets.append(function)
    return function


def reset() -> None:
    """Back to the state of a freshly imported replaysafe (settings read again from the environment)."""
    for function in _resets:
        function()


#: Counts resets: a tool's once-only warnings are said again after one (``tool.warned_* != generation``).
generation = 0


@on_reset
def _reset_settings() -> None:
    global _default, _from_env, default_tool_timeout, default_node_timeout, disabled, generation, default_in_doubt
    generation += 1
    default_in_doubt = "rerun"
    opened, _from_env = _from_env, None
    _default = None
    default_tool_timeout = default_node_timeout = UNSET
    disabled = _disabled_by_environment()
    if opened is not None:
        opened[1].close()  # the ledger REPLAYSAFE_LEDGER_URL opened: nobody else holds it


def set_default_ledger(ledger: Ledger | None) -> None:
    """Use ``ledger`` for protected tools whose decorator and ``tool_call`` name none.

    ``None`` goes back to ``REPLAYSAFE_LEDGER_URL`` (or no ledger at all).
    """
    global _default
    _default = ledger


def explicit_default_ledger() -> Ledger | None:
    """The ledger ``set_default_ledger`` set, if any (not the one ``REPLAYSAFE_LEDGER_URL`` would open)."""
    return _default


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

            try:
                ledger = open_ledger(url)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"${LEDGER_URL_ENV} names no usable ledger: {exc}") from None
            _from_env = (url, ledger)
        return _from_env[1]


def set_default_timeouts(*, tool_timeout: float | None = UNSET, node_timeout: float | None = UNSET) -> None:
    """Change the global timeouts (defaults: 300 s per tool, 900 s per ``node()``).

    ``None`` or ``0`` disables one. A decorator's ``timeout=``, a ``node(...)`` or a
    ``tool_call(tool_timeout=...)`` overrides the global value for its calls. A timeout
    given here is a hard deadline, like a decorator's ``timeout=``: a sync tool is
    interrupted, or run in a worker thread, and an async tool cancelled, when it passes it.
    """
    global default_tool_timeout, default_node_timeout
    if tool_timeout is not UNSET:
        default_tool_timeout = timeout_setting(tool_timeout, "tool_timeout")
    if node_timeout is not UNSET:
        default_node_timeout = timeout_setting(node_timeout, "node_timeout")


def register_pause(*exceptions: type[BaseException]) -> None:
    """Treat ``exceptions`` (and their subclasses) as pauses in every protected call.

    A pause is how a framework stops a tool for a human or an external event
    (LangGraph's ``GraphInterrupt``, Pydantic AI's ``ApprovalRequired``): the call is
    recorded as paused, neither failed nor in doubt, its completed steps are kept, and
    the next call of the same key runs the tool again with those steps replaying.
    Adapters register their framework's pauses; ``@replay_safe(pause_on=...)`` adds
    pauses for one tool. Registering a type twice has no further effect.
    """
    global pauses
    for exception in exceptions:
        if not (isinstance(exception, type) and issubclass(exception, BaseException)):
            raise TypeError(f"register_pause() takes exception classes, got {exception!r}")
    with _lock:
        pauses = (*pauses, *(e for e in dict.fromkeys(exceptions) if e not in pauses))


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a fork may copy it held by another thread (opening the ledger)


os.register_at_fork(after_in_child=_new_lock_in_child)
