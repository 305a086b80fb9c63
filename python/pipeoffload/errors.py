"""Exceptions of the pipeoffload package: one per status code of the C ABI (c_api.h), each
carrying the library's message, so callers can catch a kind of failure or just `Error`."""

# Status codes of c_api.h (the canonical absl / gRPC numbers).
OK = 0
UNKNOWN = 2
INVALID_ARGUMENT = 3
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13


class Error(Exception):
    """A call into libpipeoffload_c failed.

    Attributes:
        code: the po_status number (INVALID_ARGUMENT, ...).
        code_name: its name as the library spells it ("INVALID_ARGUMENT").
        message: the library's message, which names the call and what was wrong.
    """

    def __init__(self, code, code_name, message):
        super().__init__(message)
        self.code = code
        self.code_name = code_name
        self.message = message


class InvalidArgumentError(Error, ValueError):
    """Bad parameters: an unknown family or format, a spec the family rejects, a malformed
    file (the message names the place)."""


class NotFoundError(Error):
    """A file that does not exist."""


class PermissionDeniedError(Error):
    """A file that may not be read or written."""


class ResourceExhaustedError(Error):
    """Out of memory, or `auto` found no plan within the memory budget."""


class FailedPreconditionError(Error):
    """A schedule that breaks an invariant (the message names it), or one without
    predictions."""


class OutOfRangeError(Error, IndexError):
    """A stage or op index past the end."""


class InternalError(Error):
    """A bug in pipeoffload: please report the message."""


_BY_CODE = {
    INVALID_ARGUMENT: InvalidArgumentError,
    NOT_FOUND: NotFoundError,
    PERMISSION_DENIED: PermissionDeniedError,
    RESOURCE_EXHAUSTED: ResourceExhaustedError,
    FAILED_PRECONDITION: FailedPreconditionError,
    OUT_OF_RANGE: OutOfRangeError,
    INTERNAL: InternalError,
}


def error_for(code, code_name, message):
    """The exception for a failed call: the class of its code, else Error."""
    return _BY_CODE.get(code, Error)(code, code_name, message)
