"""A progress bar on stderr: which section runs, and how far its rounds have come.

On a terminal the bar is redrawn in place; elsewhere (a log, CI) a line is written
at each quarter of a run of rounds, so the output stays short.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")

_WIDTH = 24


class Progress:
    """The state of one benchmark run: the current section and the current run of rounds."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.section = ""
        self.index = 0
        self.sections = 0
        self.step = ""
        self.started = time.monotonic()

    def start_section(self, name: str, index: int, total: int) -> None:
        self.section, self.index, self.sections, self.step = name, index, total, ""
        self._draw(0, 0, force=True)

    def start_step(self, step: str) -> None:
        """A part of the section (one ledger, one load): named on the bar until the next."""
        self.step = step
        self._draw(0, 0, force=True)

    def rounds(self, items: Iterable[T], total: int) -> Iterator[T]:
        """``items`` (one per round), drawing the bar as each is done."""
        marks = {round(total * q / 4) for q in (1, 2, 3)} | {total}
        for done, item in enumerate(items, 1):
            yield item
            self._draw(done, total, force=done in marks)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, done: int, total: int, *, force: bool) -> None:
        if not self.sections or (not self.tty and not force):
            return
        where = f"[{self.index}/{self.sections}] {self.section}" + (f": {self.step}" if self.step else "")
        if total:
            filled = _WIDTH * done // total
            where += f" |{'#' * filled}{'.' * (_WIDTH - filled)}| {done}/{total} rounds"
        where += f" ({time.monotonic() - self.started:.0f} s)"
        if self.tty:
            self.stream.write("\r\x1b[2K" + where)
        else:
            self.stream.write(where + "\n")
        self.stream.flush()


#: The bar of this process's run (``python -m benchmarks`` sets its sections).
progress = Progress()
