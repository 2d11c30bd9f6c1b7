"""Errors that end a run, each with a message a user can act on."""
from __future__ import annotations

import trio


class EmulatorError(Exception):
    """Base class for errors the ``emu`` command reports without a traceback."""


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The real errors inside (possibly nested) exception groups, e.g. from an actor's own nursery."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaf_exceptions(sub)]
    return [exc]


def first_error(exc: BaseException) -> BaseException:
    """The error to report for ``exc``: itself, or inside (nested) groups the first leaf that is not
    a cancellation (a failing sub-task cancels its siblings), else the first leaf."""
    leaves = leaf_exceptions(exc)
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return leaves[0]


class ActorError(EmulatorError):
    """An actor (or link) raised: names it, the virtual time and the cause(s)."""

    def __init__(self, where: str, time_ps: int, cause: BaseException):
        self.where = where
        self.time_ps = time_ps
        self.cause = cause
        text = "; ".join(f"{type(e).__name__}: {e}" for e in leaf_exceptions(cause))
        super().__init__(f"{where} failed at t={time_ps} ps: {text}")


class DeadlockError(EmulatorError):
    """The system stopped making progress before the workload finished."""

    def __init__(self, report: "object"):
        self.report = report
        super().__init__(str(report))


class BuildError(EmulatorError):
    """The machine could not be built from its configuration (bad wiring, unknown names)."""
