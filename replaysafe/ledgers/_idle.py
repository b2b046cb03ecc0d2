"""The idle connections a ledger holds itself, shared by every backend that holds its own."""

from __future__ import annotations

from typing import Generic, TypeVar

C = TypeVar("C")

_NOTHING: tuple[()] = ()


class IdleConnections(Generic[C]):
    """Connections not in use, newest first.

    Taking one and keeping one are a list pop and an append, each atomic (under the GIL, or
    the list's own lock without it): no lock for threads to queue on, and never a wait. What
    is closed is handed back to the caller to close, so that a sync and an async backend
    close theirs each their own way.
    """

    __slots__ = ("_conns", "closed")

    def __init__(self) -> None:
        self._conns: list[C] = []
        #: Set by ``close()``: from then on a connection kept is closed instead.
        self.closed = False

    def __len__(self) -> int:
        return len(self._conns)

    def pop(self) -> C | None:
        """The newest idle connection, taken out; ``None`` when there is none."""
        try:
            return self._conns.pop()
        except IndexError:
            return None

    def keep(self, conn: C) -> list[C] | tuple[()]:
        """Keep ``conn`` for the next operation; what is returned is the caller's to close:
        nothing, or, once closed, ``conn`` with any other connection kept meanwhile."""
        self._conns.append(conn)
        # Looked at after the append: a close() that emptied the list before it is seen here.
        return self.close() if self.closed else _NOTHING

    def close(self) -> list[C]:
        """Keep no more: every idle connection, taken out for the caller to close."""
        self.closed = True
        taken = []
        while (conn := self.pop()) is not None:
            taken.append(conn)
        return taken
