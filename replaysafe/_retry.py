"""Trying again: every retry in the package is tenacity, configured here.

Two uses. A ledger operation that failed with a transient error is tried again a
few times, quickly (the ledger's ``RetryPolicy``), by the sync and async drivers and
the lease renewer alike. A finishing write the ledger refused is tried again in the
background, with a growing pause, until the ledger answers (``_pending``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import tenacity

from ._errors import LedgerError

#: The pause between two rounds of background writes: from the first to the longest.
BACKGROUND_FIRST_PAUSE, BACKGROUND_LONGEST_PAUSE = 0.1, 5.0


def ledger_retrying(
    ledger: Any,
    is_transient: Callable[[BaseException], bool],
    give_up: Callable[[BaseException], LedgerError],
    *,
    asynchronous: bool,
) -> tenacity.Retrying | tenacity.AsyncRetrying:
    """Bounded retry of an operation whose first attempt failed with a transient error.

    It stops at the policy's attempts (the first one included) or seconds, or at the
    first error that is not transient; then ``give_up(last error)`` is raised.
    """

    def raise_given_up(state: tenacity.RetryCallState) -> NoReturn:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert error is not None
        raise give_up(error) from error

    settings: dict[str, Any] = {
        "stop": tenacity.stop_after_attempt(max(ledger.retry.attempts - 1, 1))
        | tenacity.stop_after_delay(ledger.retry.max_seconds)
        | _StopUnlessTransient(is_transient),
        "wait": tenacity.wait_random_exponential(multiplier=0.01, max=0.1),
        "retry": tenacity.retry_if_exception_type(Exception),
        "retry_error_callback": raise_given_up,
    }
    return tenacity.AsyncRetrying(**settings) if asynchronous else tenacity.Retrying(**settings)


class _StopUnlessTransient(tenacity.stop.stop_base):
    """Stop at an error that trying again cannot help."""

    def __init__(self, is_transient: Callable[[BaseException], bool]) -> None:
        self.is_transient = is_transient

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        return error is None or not self.is_transient(error)


class NoWriteMadeError(Exception):
    """A round of background writes wrote none of them: pause longer before the next."""


def background_retrying(nap: Callable[[float], None]) -> tenacity.Retrying:
    """Rounds of background writes until one makes progress; ``nap`` pauses between rounds
    (it may end early, when a new write comes in)."""
    return tenacity.Retrying(
        stop=tenacity.stop_never,
        wait=tenacity.wait_exponential(
            multiplier=BACKGROUND_FIRST_PAUSE, min=BACKGROUND_FIRST_PAUSE, max=BACKGROUND_LONGEST_PAUSE
        ),
        retry=tenacity.retry_if_exception_type(NoWriteMadeError),
        sleep=nap,
        reraise=True,
    )
