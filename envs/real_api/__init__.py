"""Real APIs (docs/envs/real_apis.md): the front ends' real-API mode (``RealApi``), the HTTP tool service and
its client, live APIs from OpenAPI documents or MCP servers, call logs, and the failure model fitted to
them. Names are imported on first use."""

__all__ = [
    "CallLogRow", "FailureFit", "HttpExecutor", "LiveApi", "McpToolClient", "RealApi", "ToolClient", "ToolService",
    "calibrate", "fit_failures", "load_live_api", "mcp_live_api", "openapi_document", "read_rows",
    "running_service", "write_rows",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .call_log import CallLogRow, read_rows, write_rows
    from .client import HttpExecutor, ToolClient
    from .failure_fit import FailureFit, calibrate, fit_failures
    from .live_apis import LiveApi, McpToolClient, RealApi, load_live_api, mcp_live_api
    from .service import ToolService, openapi_document, running_service


__getattr__, __dir__ = lazy_exports(__name__, {
    ".call_log": ("CallLogRow", "read_rows", "write_rows"),
    ".client": ("HttpExecutor", "ToolClient"),
    ".failure_fit": ("FailureFit", "calibrate", "fit_failures"),
    ".live_apis": ("LiveApi", "McpToolClient", "RealApi", "load_live_api", "mcp_live_api"),
    ".service": ("ToolService", "openapi_document", "running_service"),
})
