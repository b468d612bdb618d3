"""The one table between the world's error codes and what an HTTP exchange shows.

The tool service reads it one way (a failed call's code -> the fault it puts on the wire: ``fault_of``),
the HTTP client the other (a response, or its absence -> an error class -> an error code: ``class_of_status``
and ``code_of``). Both directions come from ``FAULTS``, so they cannot drift apart:

=====================  ==========================================  ================
code                   on the wire                                 error class
=====================  ==========================================  ================
TIMEOUT                a slow response (past the client's timeout)  timeout
RATE_LIMIT_ERROR       429 with Retry-After                         rate_limited
SERVICE_UNAVAILABLE    503                                          unavailable
NETWORK_ERROR          connection dropped, no response              connection
SCHEMA_MISMATCH        200 with a malformed JSON body               malformed_body
AUTHENTICATION_FAILED  401                                          client_error
PERMISSION_DENIED      403                                          client_error
FILE_NOT_FOUND         404                                          client_error
INVALID_INPUT          422                                          client_error
any other code         500                                          server_error
=====================  ==========================================  ================

Error responses carry ``{"error": {"code": ..., "description": ...}}``; the client keeps the body's code
when it is one of the called tool's codes, and otherwise takes the code of the error class (``code_of``).
"""

from __future__ import annotations

__all__ = [
    "TIMEOUT", "RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "NETWORK_ERROR", "SCHEMA_MISMATCH",
    "OPERATION_FAILED", "TIMEOUT_CLASS", "RATE_LIMITED", "UNAVAILABLE", "CONNECTION", "MALFORMED_BODY",
    "CLIENT_ERROR", "SERVER_ERROR", "ERROR_CLASSES", "SLOW", "STATUS", "DROP", "MALFORMED", "Fault", "FAULTS",
    "OTHER_FAULT", "CLASS_CODES", "fault_of", "class_of_status", "code_of",
]

from collections.abc import Collection
from dataclasses import dataclass

from ...core.registry import INVALID_INPUT

TIMEOUT = "TIMEOUT"
RATE_LIMIT_ERROR = "RATE_LIMIT_ERROR"
SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
NETWORK_ERROR = "NETWORK_ERROR"
SCHEMA_MISMATCH = "SCHEMA_MISMATCH"
OPERATION_FAILED = "OPERATION_FAILED"

# Error classes: what the client saw, whatever the server meant.
TIMEOUT_CLASS = "timeout"
RATE_LIMITED = "rate_limited"
UNAVAILABLE = "unavailable"
CONNECTION = "connection"
MALFORMED_BODY = "malformed_body"
CLIENT_ERROR = "client_error"
SERVER_ERROR = "server_error"
ERROR_CLASSES = (TIMEOUT_CLASS, RATE_LIMITED, UNAVAILABLE, CONNECTION, MALFORMED_BODY, CLIENT_ERROR, SERVER_ERROR)

# How the service renders a fault.
SLOW, STATUS, DROP, MALFORMED = "slow", "status", "drop", "malformed"


@dataclass(frozen=True)
class Fault:
    """What the service does for a failed call: ``kind`` (SLOW: answer ``status`` after the slow delay;
    STATUS: answer ``status`` at once; DROP: close the connection without a response; MALFORMED: answer
    ``status`` with a body that is not JSON), and the error class the client will see."""

    kind: str
    status: int | None
    error_class: str


FAULTS: dict[str, Fault] = {
    TIMEOUT: Fault(SLOW, 504, TIMEOUT_CLASS),  # 504 reaches only a client that waits longer than the delay
    RATE_LIMIT_ERROR: Fault(STATUS, 429, RATE_LIMITED),
    SERVICE_UNAVAILABLE: Fault(STATUS, 503, UNAVAILABLE),
    NETWORK_ERROR: Fault(DROP, None, CONNECTION),
    SCHEMA_MISMATCH: Fault(MALFORMED, 200, MALFORMED_BODY),
    "AUTHENTICATION_FAILED": Fault(STATUS, 401, CLIENT_ERROR),
    "PERMISSION_DENIED": Fault(STATUS, 403, CLIENT_ERROR),
    "FILE_NOT_FOUND": Fault(STATUS, 404, CLIENT_ERROR),
    INVALID_INPUT: Fault(STATUS, 422, CLIENT_ERROR),
}
OTHER_FAULT = Fault(STATUS, 500, SERVER_ERROR)

# The reverse direction, read off FAULTS: a status the table sends -> (error class, code); and the code
# each class stands for when the body names none of the tool's codes.
_BY_STATUS: dict[int, tuple[str, str]] = {
    f.status: (f.error_class, code) for code, f in FAULTS.items() if f.kind in (SLOW, STATUS) and f.status
}
CLASS_CODES: dict[str, str] = {
    f.error_class: code for code, f in FAULTS.items() if f.error_class != CLIENT_ERROR
} | {CLIENT_ERROR: INVALID_INPUT, SERVER_ERROR: OPERATION_FAILED}


def fault_of(code: str) -> Fault:
    """The fault the service shows for a call that failed with ``code``."""
    return FAULTS.get(code, OTHER_FAULT)


def class_of_status(status: int) -> str | None:
    """The error class of an HTTP status (None for 2xx: no error): the table's statuses first (429, 503,
    504 timeout, 401/403/404/422), then 408 timeout, any other 5xx server_error, and anything else
    (other 4xx, a redirect the client did not follow) client_error."""
    if 200 <= status < 300:
        return None
    if status in _BY_STATUS:
        return _BY_STATUS[status][0]
    if status == 408:
        return TIMEOUT_CLASS
    return SERVER_ERROR if status >= 500 else CLIENT_ERROR


def code_of(error_class: str, status: int | None = None, body_code: str | None = None,
            tool_codes: Collection[str] = ()) -> str:
    """The error code a client records: the body's code when it is one of the tool's codes, else the
    code of the status in the table (a 404 is FILE_NOT_FOUND), else the error class's code."""
    if body_code is not None and body_code in tool_codes:
        return body_code
    by_status = _BY_STATUS.get(status) if status is not None else None
    if by_status is not None and by_status[0] == error_class:
        return by_status[1]
    return CLASS_CODES[error_class]
