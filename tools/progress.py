"""A one-line progress display for long runs on a terminal (virtual time reached, wall rate).

Called by the clock once per virtual time step; it looks at the wall clock only
every 1024 steps so the hot path stays cheap.
"""
from __future__ import annotations

import time

from emulator.units import format_time


class Progress:
    def __init__(self, stream, every_s: float = 0.5):
        self.stream = stream
        self.every_s = every_s
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.steps = 0
        self.shown = False

    def __call__(self, t_ps: int) -> None:
        self.steps += 1
        if self.steps & 1023:
            return
        now = time.perf_counter()
        if now - self.last < self.every_s:
            return
        self.last = now
        rate = self.steps / (now - self.t0)
        self.stream.write(f"\r  virtual time {format_time(t_ps):>12}  {self.steps:,} steps  "
                          f"{rate:,.0f} steps/s  wall {now - self.t0:.1f} s ")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()
