"""Errors of the MCP server's calls to the service.

    ServiceCallError   the service refused or failed a tool's call (an HTTP status and the
                       service's error code and message), or could not be reached (no status)

`tools.py` turns it into the SDK's `ToolError`, which the client receives as a tool result with
`isError` and the message: a refused call never closes the MCP connection.
"""

from __future__ import annotations


class ServiceCallError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"{self.status} {self.code or 'error'}: {self.message}"
