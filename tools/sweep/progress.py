"""The progress of a sweep: points done, running, failed, and the time left.

On a terminal a rich progress bar (``done/total``, ``running``, ``failed``,
elapsed, ETA from the finishing rate); elsewhere (CI logs, pipes) one line per
finished point, so a log shows where a long sweep got to.  ``quiet`` shows
nothing.
"""
from __future__ import annotations

import sys

__all__ = ["SweepProgress"]


class SweepProgress:
    def __init__(self, total: int, resumed: int, *, quiet: bool = False, stream=None):
        self.total = total
        self.done = 0
        self.failed = 0
        self.active = 0
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self._bar = None
        if not quiet and self.stream.isatty() and total:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("running {task.fields[running]}  failed {task.fields[failed]}"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(file=self.stream), transient=False)
            self._task = self._bar.add_task(f"sweep ({resumed} resumed)" if resumed else "sweep", total=total,
                                            running=0, failed=0)
            self._bar.start()

    def running(self, n: int) -> None:
        self.active = n
        if self._bar is not None:
            self._bar.update(self._task, running=n)

    def finished(self, label: str, status: str, wall_s) -> None:
        self.done += 1
        if status != "finished":
            self.failed += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self.failed)
        elif not self.quiet:
            wall = f"{wall_s:.2f} s" if isinstance(wall_s, (int, float)) else "-"
            self.stream.write(f"[{self.done}/{self.total}] {label}: {status} ({wall})\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
