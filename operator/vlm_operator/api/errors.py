"""Error classes, classified once: permanent (the spec is wrong) or temporary (retry later).

Handlers map these to kopf: a PermanentError sets a condition and a Warning
Event and is not retried until the spec changes; a TemporaryError is retried
after `delay` seconds. Anything else is a bug and is allowed to surface.
"""

from __future__ import annotations


class VLMError(Exception):
    """Base for errors the operator knows how to report."""

    reason: str = "Error"

    def __init__(self, message: str, *, reason: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        if reason:
            self.reason = reason
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class PermanentError(VLMError):
    """Retrying will not help until the object changes."""


class InvalidSpec(PermanentError):
    """The spec passed the schema but the operator cannot honour it (e.g. ipcCache On on SGLang 0.5.9)."""

    reason = "InvalidSpec"


class TemporaryError(VLMError):
    """A conflict, a 5xx or a 429 from the API server, or a dependency not ready yet."""

    reason = "Temporary"

    def __init__(self, message: str, *, reason: str | None = None, delay: float = 10.0):
        super().__init__(message, reason=reason)
        self.delay = delay
