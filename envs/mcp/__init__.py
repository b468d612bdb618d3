"""The tool simulator over MCP (``resilibench serve mcp``). Names are imported on first use."""

__all__ = ["ResiliBenchMCP", "build_server", "serve_http", "serve_stdio"]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .server import ResiliBenchMCP, build_server, serve_http, serve_stdio


__getattr__, __dir__ = lazy_exports(__name__, {".server": ("ResiliBenchMCP", "build_server", "serve_http",
                                                          "serve_stdio")})
