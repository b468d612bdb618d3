"""The MCP fault proxy: the world's failure processes in front of any MCP server (``resilibench proxy mcp``).
Names are imported on first use."""

__all__ = ["FaultProxy", "LiveUpstream", "ReplayUpstream", "UpstreamError", "serve_proxy"]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .proxy import FaultProxy, LiveUpstream, ReplayUpstream, UpstreamError, serve_proxy


__getattr__, __dir__ = lazy_exports(__name__, {".proxy": ("FaultProxy", "LiveUpstream", "ReplayUpstream",
                                                         "UpstreamError", "serve_proxy")})
