"""LLM agents: backends (transformers, vLLM, OpenAI-compatible servers), real small models shipped as PyPI
packages, scripted and text-only agents, the batched evaluation harness and its reports, task enhancement
and the breaker loop. Names are imported on first use (backends load their libraries only then)."""

__all__ = [
    "MODELS", "Agent", "EvalJob", "FlawTaxonomy", "LLMAgent", "LLMTaxonomy", "NameReadingTextAgent",
    "OpenAIBackend", "OptimalTextAgent", "PlanFollowingTextAgent", "PlannerTextAgent", "SearchTextAgent",
    "TaskEnhancer", "TransformersBackend", "VLLMBackend", "eval_jobs", "format_tables", "get_model",
    "llama_server", "make_backend", "make_scripted_agent", "make_text_agent", "run_breaker", "run_eval",
    "summarize_eval",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .backends import OpenAIBackend, TransformersBackend, VLLMBackend, make_backend
    from .breaker import FlawTaxonomy, LLMTaxonomy, run_breaker
    from .harness import EvalJob, eval_jobs, run_eval
    from .models import MODELS, get_model, llama_server
    from .report import format_tables, summarize_eval
    from .scripted import Agent, LLMAgent, OptimalTextAgent, PlanFollowingTextAgent, PlannerTextAgent
    from .specs import make_scripted_agent, make_text_agent
    from .task_enhancer import TaskEnhancer
    from .text_baselines import NameReadingTextAgent, SearchTextAgent


__getattr__, __dir__ = lazy_exports(__name__, {
    ".backends": ("OpenAIBackend", "TransformersBackend", "VLLMBackend", "make_backend"),
    ".breaker": ("FlawTaxonomy", "LLMTaxonomy", "run_breaker"),
    ".harness": ("EvalJob", "eval_jobs", "run_eval"),
    ".models": ("MODELS", "get_model", "llama_server"),
    ".report": ("format_tables", "summarize_eval"),
    ".scripted": ("Agent", "LLMAgent", "OptimalTextAgent", "PlanFollowingTextAgent", "PlannerTextAgent"),
    ".specs": ("make_scripted_agent", "make_text_agent"),
    ".task_enhancer": ("TaskEnhancer",),
    ".text_baselines": ("NameReadingTextAgent", "SearchTextAgent"),
})
