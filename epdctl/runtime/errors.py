"""The runtime's own exceptions (the runtime never imports ``epdctl.errors``)."""

from __future__ import annotations


class RuntimeWorkerError(Exception):
    """A worker cannot do its job (bad model folder, inconsistent state); the message says what to do."""


class TransferError(RuntimeWorkerError):
    """A hand-off between workers failed: peer unreachable, timed out, truncated or corrupt payload.

    Raised instead of ever returning a tensor that might be wrong.
    """


class BadRequestError(RuntimeWorkerError):
    """The client sent something unusable; servers turn it into an HTTP ``status`` answer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message
