"""The text protocol: prompts and their plans (``prompts``), flaws injected into plans (``flaws``), and tool
search and calls (``toolbox``), shared by the text env and the MCP server. Names are imported on first use."""

__all__ = [
    "FLAW_METHODS", "FLAW_TYPES", "FlawInjection", "FlawNotApplicable", "ParsedMessage", "Prompt",
    "PromptSettings", "SearchSettings", "build_prompt", "call_tool", "describe_tool", "feedback_text",
    "function_schemas", "inject_flaw", "parse_message", "parse_plan", "render_plan", "search_tools",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .flaws import FLAW_METHODS, FLAW_TYPES, FlawInjection, FlawNotApplicable, inject_flaw
    from .prompts import Prompt, PromptSettings, build_prompt, parse_plan, render_plan
    from .toolbox import (
        ParsedMessage,
        SearchSettings,
        call_tool,
        describe_tool,
        feedback_text,
        function_schemas,
        parse_message,
        search_tools,
    )


__getattr__, __dir__ = lazy_exports(__name__, {
    ".flaws": ("FLAW_METHODS", "FLAW_TYPES", "FlawInjection", "FlawNotApplicable", "inject_flaw"),
    ".prompts": ("Prompt", "PromptSettings", "build_prompt", "parse_plan", "render_plan"),
    ".toolbox": ("ParsedMessage", "SearchSettings", "call_tool", "describe_tool", "feedback_text",
                 "function_schemas", "parse_message", "search_tools"),
})
