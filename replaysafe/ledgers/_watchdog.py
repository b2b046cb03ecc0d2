"""A client-side deadline for blocking socket reads that no driver option bounds.

libpq has no read timeout: against a stalled server (a stopped process, a
half-open connection whose kernel still acknowledges) a statement waits forever,
and ``statement_timeout`` cannot fire on a server that does not run. The watchdog
shuts down the socket of a statement that outlives its deadline; the blocked read
(sync, or an event loop's reader) then sees end-of-file and the driver raises.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator

#: Seconds an idle watchdog thread waits for new work before it exits.
_IDLE_EXIT = 5.0
#: Longest sleep between two looks at the deadlines.
_TICK = 0.25


class Deadline:
    """One guarded operation; ``expired`` once the watchdog cut its connection."""

    __slots__ = ("due", "expired", "fileno")

    def __init__(self, fileno: int, due: float) -> None:
        self.fileno = fileno
        self.due = due
        self.expired = False


class SocketWatchdog:
    """Cuts the connections of operations past their deadline; one daemon thread, started on demand."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # In a forked child the parent's thread is gone and its lock may be held.
        self._lock = threading.Lock()
        self._active: dict[int, Deadline] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, fileno: int, seconds: float) -> tuple[int, Deadline]:
        """Shut the socket ``fileno`` down once ``seconds`` have passed, unless ``disarm``ed before."""
        deadline = Deadline(fileno, time.monotonic() + seconds)
        token = next(self._tokens)
        with self._lock:
            self._active[token] = deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="replaysafe-io-watchdog", daemon=True)
                self._thread.start()
        return token, deadline

    def disarm(self, token: int) -> None:
        # Under the lock: once removed, the watchdog can no longer cut this socket,
        # which the pool may hand to another operation next.
        with self._lock:
            self._active.pop(token, None)

    @contextlib.contextmanager
    def guard(self, fileno: int, seconds: float) -> Iterator[Deadline]:
        """Within the block, the socket ``fileno`` is shut down once ``seconds`` have passed."""
        token, deadline = self.arm(fileno, seconds)
        try:
            yield deadline
        finally:
            self.disarm(token)

    def _watch(self) -> None:
        idle_since = time.monotonic()
        while True:
            now = time.monotonic()
            with self._lock:
                if not self._active:
                    if now - idle_since > _IDLE_EXIT:
                        self._thread = None
                        return
                else:
                    idle_since = now
                for token, deadline in list(self._active.items()):
                    if deadline.due <= now:
                        deadline.expired = True
                        del self._active[token]
                        _shut_down(deadline.fileno)
                nearest = min((d.due for d in self._active.values()), default=now + _TICK)
            time.sleep(min(max(nearest - now, 0.01), _TICK))


def _shut_down(fileno: int) -> None:
    """Shut the socket down (both ways) without closing the driver's descriptor."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fileno))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


watchdog = SocketWatchdog()
