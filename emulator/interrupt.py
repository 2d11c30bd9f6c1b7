"""Stopping a run from outside: Ctrl-C, SIGTERM and the wall-clock guard, one mechanism.

A :class:`StopSwitch` is entered around everything a run does in the main thread
(building the machine, generating inputs, the Trio run, the workload check).
It turns SIGINT and SIGTERM into the stop reason ``interrupted`` and its
wall-clock deadline (``signal.setitimer`` -> SIGALRM) into ``wall-timeout``.
How the stop takes effect depends on the phase:

* **synchronous Python** (build, input generation, check): the signal handler
  raises :class:`RunStopped` at once.  Python runs signal handlers between
  bytecodes of the main thread, so this works inside any pure-Python loop;
  a single long C call (one huge numpy operation) delays it until it returns.
* **inside the Trio run**: raising at an arbitrary bytecode could land inside
  Trio's scheduler, so the handler first asks the run to stop cleanly
  (``System.request_stop``: a flag the clock's per-step hook reads, plus
  ``TrioToken.run_sync_soon``, which is signal-safe, to reach the run even when
  virtual time does not move).  Both pull the clock's virtual-time limit down to
  now, so the run ends exactly like a ``time-limit`` stop, between time steps:
  the actors are cancelled and the trace footer is written.  If the run has not
  stopped :data:`GRACE_S` later (an actor stuck in one long synchronous
  computation, or a loop that neither steps the clock nor polls for I/O), the
  SIGALRM re-armed by the handler raises :class:`RunStopped` where the main
  thread is; ``System.run`` catches it and still writes a partial result and
  the trace footer.  A second Ctrl-C does the same at once.
* **stuck in one C call** (a huge numpy allocation or random fill): no Python
  signal handler runs until the call returns.  Given ``on_stuck``, a watchdog
  thread calls ``on_stuck(reason)`` when the main thread still has not left the
  switch :data:`STUCK_S` after the wall-clock deadline (a timer thread, no
  signal needed) or after a stop request was seen; the runner then writes the
  partial result from that thread and ends the process.  This needs the C call
  to release the GIL (numpy's long loops do).  Limitation: Ctrl-C itself is
  only *seen* when Python runs its handler, so Ctrl-C during one long C call
  takes effect when the call returns; the wall-clock guard has no such limit.

What this relies on: CPython delivers signals to the main thread between
bytecodes; ``signal.setitimer`` (POSIX); Trio leaves a SIGINT handler that is not
Python's default alone (it installs its own KeyboardInterrupt machinery only
over the default one).  Outside the main thread no handler can be installed:
the switch then only carries the wall-clock deadline for the caller to check.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable

__all__ = ["RunStopped", "StopSwitch", "GRACE_S", "STUCK_S", "stop_signals_interrupt"]

#: seconds a clean stop of a Trio run may take before the switch raises where the run is
GRACE_S = 0.5
#: seconds after a stop request before ``on_stuck`` is called (the main thread is stuck in C)
STUCK_S = 1.5


class RunStopped(BaseException):
    """The run was stopped from outside (``reason``: ``interrupted`` or ``wall-timeout``).

    A ``BaseException`` like ``KeyboardInterrupt``: model code's ``except Exception``
    must not swallow it.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class StopSwitch:
    """SIGINT/SIGTERM and a wall-clock deadline -> one stop reason for the run in this thread."""

    def __init__(self, wall_timeout_s: float | None = None, *, on_stuck: Callable[[str], None] | None = None,
                 stuck_after_s: float = STUCK_S):
        self.wall_timeout_s = wall_timeout_s
        self.on_stuck = on_stuck
        self.stuck_after_s = stuck_after_s
        self._watchdog: threading.Timer | None = None
        self._lock = threading.Lock()
        self.reason: str | None = None
        self._soft: Callable[[str], None] | None = None
        self._saved: dict = {}
        self._active = False

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> "StopSwitch":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
            self._saved[sig] = signal.signal(sig, self._on_signal)
        self._active = True
        if self.wall_timeout_s:
            signal.setitimer(signal.ITIMER_REAL, self.wall_timeout_s)
            if self.on_stuck is not None:
                self._start_watchdog(self.wall_timeout_s + self.stuck_after_s)
        return self

    def _start_watchdog(self, after_s: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = threading.Timer(after_s, self._stuck)
        self._watchdog.daemon = True
        self._watchdog.start()

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        with self._lock:            # the watchdog must not fire once the main thread is out
            self._active = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    @property
    def active(self) -> bool:
        """True when the signal handlers are installed (entered in the main thread)."""
        return self._active

    @contextmanager
    def soft(self, request_stop: Callable[[str], None]):
        """While inside, a stop first calls ``request_stop(reason)`` (signal-safe) instead of raising."""
        self._soft = request_stop
        try:
            if self.reason is not None:     # stopped between two phases
                request_stop(self.reason)
            yield self
        finally:
            self._soft = None
            if self._active and self.reason is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)   # the clean stop took: no hard stop

    def check(self) -> None:
        """Raise :class:`RunStopped` if a stop was requested (between phases)."""
        if self.reason is not None:
            raise RunStopped(self.reason)

    # -- the handler ------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        first = self.reason is None
        if first:
            self.reason = "wall-timeout" if signum == signal.SIGALRM else "interrupted"
            if self.on_stuck is not None:
                self._start_watchdog(self.stuck_after_s)
        if self._soft is None or not first:
            # synchronous phase, a second signal, or the grace period ran out
            raise RunStopped(self.reason)
        self._soft(self.reason)
        signal.setitimer(signal.ITIMER_REAL, GRACE_S)

    def _stuck(self) -> None:
        with self._lock:
            if self._active:
                if self.reason is None:        # the deadline passed unseen: the main thread is in C
                    self.reason = "wall-timeout"
                self.on_stuck(self.reason)


@contextmanager
def stop_signals_interrupt():
    """Inside: SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread, whatever the process
    inherited (a command started in the background of a script inherits SIGINT *ignored*, and Python
    then never installs its handler; SIGTERM's default ends the process with no word).  For commands that
    run many runs (``emu sweep``, ``emu faults campaign``): they catch it, keep what finished and say so."""
    def on_signal(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
