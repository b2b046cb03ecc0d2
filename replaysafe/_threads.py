"""A thread pool made on first use and made anew in a forked child.

A forked child has none of its parent's threads, and may have copied the pool's lock
mid-use: work handed to the copied pool would wait forever. The parent's pool is left
unclosed in the child (its threads are the parent's).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading


class ForkSafePool:
    """A lazily created ``ThreadPoolExecutor`` that a forked child replaces with its own."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._max_workers, thread_name_prefix=self._prefix
                )
            return self._pool
