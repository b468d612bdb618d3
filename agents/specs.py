"""Text-env agents by spec: ``scripted:NAME``, a planner name, ``ppo:DIR`` or an LLM backend (``hf:``, ``vllm:``,
``openai:``), checked without loading anything or built."""

from __future__ import annotations

__all__ = ["SCRIPTED_AGENTS", "make_scripted_agent", "AGENT_SPECS", "check_agent_spec", "make_text_agent"]

from pathlib import Path
from typing import Any

from resilibench.llm import GenerationConfig

from .scripted import (
    Agent,
    LLMAgent,
    OptimalTextAgent,
    PlanFollowingTextAgent,
    PlannerTextAgent,
)
from .text_baselines import NameReadingTextAgent, SearchingOptimalTextAgent, SearchTextAgent

SCRIPTED_AGENTS = ("optimal", "plan", "names", "search", "search-optimal")


def make_scripted_agent(kind: str) -> Agent:
    """A scripted agent by name: ``optimal``, ``plan``, the text-only baselines ``names`` and ``search``, or
    ``search-optimal`` (``resilibench.agents.text_baselines``)."""
    makers = {"optimal": OptimalTextAgent, "plan": PlanFollowingTextAgent, "names": NameReadingTextAgent,
              "search": SearchTextAgent, "search-optimal": SearchingOptimalTextAgent}
    if kind not in makers:
        raise ValueError(f"scripted agent must be one of {sorted(SCRIPTED_AGENTS)}, got {kind!r}")
    return makers[kind]()


AGENT_SPECS = ("scripted:optimal, scripted:plan, scripted:names, scripted:search, scripted:search-optimal, a planner name (random_legal, in_order, dependency_aware, "
                "optimal), ppo:CHECKPOINT_DIR, hf:PATH, vllm:PATH or openai:URL?model=NAME")


def check_agent_spec(spec: str) -> None:
    """Check an agent spec's form (and an ``hf:`` or ``ppo:`` directory) without loading anything;
    ValueError naming the problem."""
    from ..policies.runner import PLANNER_NAMES
    from .backends import BACKEND_KINDS, check_spec

    kind, _, target = spec.partition(":")
    if kind == "scripted":
        if target not in SCRIPTED_AGENTS:
            raise ValueError(f"scripted agent must be one of {sorted(SCRIPTED_AGENTS)}, got {target!r}")
    elif kind in BACKEND_KINDS:
        check_spec(spec)
    elif kind == "ppo":
        if not target or not Path(target).is_dir():
            raise ValueError(f"ppo:{target}: not a checkpoint directory")
    elif spec not in PLANNER_NAMES:
        raise ValueError(f"agent spec {spec!r} not understood")


def make_text_agent(spec: str, generation: GenerationConfig | None = None, batch_size: int = 8,
                    requests: Any = None) -> Agent:
    """A text-env agent from a spec (``AGENT_SPECS``); ``requests``: the ``backends.RequestSettings`` of an
    HTTP backend. ValueError naming the accepted forms."""
    from ..policies.runner import PLANNER_NAMES, make_planner
    from .backends import BACKEND_KINDS, make_backend

    kind, _, target = spec.partition(":")
    if kind == "scripted" and target in SCRIPTED_AGENTS:
        return make_scripted_agent(target)
    if kind in BACKEND_KINDS:
        return LLMAgent(make_backend(spec, requests, batch_size=batch_size), generation)
    if kind == "ppo" and target:
        from ..policies.ppo.evaluation import PPOPlanner

        planner = PPOPlanner(target)  # deterministic and stateless: shared by every episode
        return PlannerTextAgent(lambda episode: planner, f"ppo:{target}")
    if spec in PLANNER_NAMES:
        return PlannerTextAgent(lambda episode: make_planner(spec, episode.config), f"planner:{spec}")
    raise ValueError(f"agent spec {spec!r} not understood; forms: {AGENT_SPECS}")
