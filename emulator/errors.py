"""Errors that end a run, each with a message a user can act on."""
from __future__ import annotations


class EmulatorError(Exception):
    """Base class for errors the ``emu`` command reports without a traceback."""


class ActorError(EmulatorError):
    """An actor (or link) raised: names it, the virtual time and the cause."""

    def __init__(self, where: str, time_ps: int, cause: BaseException):
        self.where = where
        self.time_ps = time_ps
        self.cause = cause
        super().__init__(f"{where} failed at t={time_ps} ps: {type(cause).__name__}: {cause}")


class DeadlockError(EmulatorError):
    """The system stopped making progress before the workload finished."""

    def __init__(self, report: "object"):
        self.report = report
        super().__init__(str(report))


class BuildError(EmulatorError):
    """The machine could not be built from its configuration (bad wiring, unknown names)."""
