"""Errors the client raises, each with the engine's code where the engine gave one.

The engine answers errors as ``{"error": {"code", "message"}}`` with a stable code (``ERR_TRAIN_STEP``,
``ERR_BAD_BODY``, ...): a :class:`ControlApiError` carries that code and the HTTP status, so a trainer
branches on ``err.code``, never on the message's wording.
"""
from __future__ import annotations

from typing import Optional


class RolloutEngineError(Exception):
    """Base of every error this package raises; ``code`` is stable, the message is for people."""

    code: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControlApiError(RolloutEngineError):
    """The engine answered with an error status: a 4xx (never retried) or a 5xx the retries did not outlast."""

    def __init__(self, status: int, code: str, message: str, route: str) -> None:
        super().__init__(code, f"{route} answered {status}: {message}")
        self.status = status
        self.route = route


class EngineUnreachableError(RolloutEngineError):
    """No answer from the engine (refused, reset, timed out) for as long as the retry budget allowed."""

    def __init__(self, route: str, attempts: int, cause: BaseException) -> None:
        super().__init__("ERR_UNREACHABLE", f"{route}: no answer after {attempts} attempts (last: {type(cause).__name__}: {cause})")
        self.route = route
        self.attempts = attempts


class BatchFormatError(RolloutEngineError):
    """A batch that does not decode: a field missing or of the wrong kind, named with its path."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__("ERR_BATCH_FORMAT", f"{where}: {problem}")
        self.where = where


class LaunchError(RolloutEngineError):
    """``rollout serve`` did not start, or stopped: the message ends with the tail of its log."""

    def __init__(self, message: str, log_tail: str = "", exit_code: Optional[int] = None) -> None:
        super().__init__("ERR_LAUNCH", message + (f"\n--- rollout serve log (last lines) ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail
        self.exit_code = exit_code
