"""A tool retriever tuned on train instructions: the shipped MiniLM fine-tuned so that each clause of a
train instruction lies nearest to the text of the tool it asks for.

Why: on the held-out wording (``core.tasks.wording``) a generator sees the test clauses' words for the
first time, and what tells it which tool a clause asks for is the tool search it reads
(``GeneratorFormat.search_hits``), whose first hit is the right tool for about two clauses in three. What
the train clauses teach about the search's mistakes carries over to wordings never seen only through a
model that already reads English: tuning the search's own embedding model does (a reranker of the hits
over-fits the train wordings, SmolLM2-135M reads the tool names worse than the search;
docs/robust_train/generation.md, "A retriever tuned on the train clauses").

- ``align``: which clause of an instruction asks for each required tool;
- ``clause_tools``: the (clause, tool) pairs of instructions, from ``align`` under the shipped model;
- ``train_retriever``: the fine-tuning (``RetrieverSettings``); ``pipeline.run_retriever`` is the
  resumable stage around it;
- ``retriever_encoder``: a tuned model as the ``encoder`` of ``core.text.toolbox.search_tools_many``.
"""

from __future__ import annotations

__all__ = ["RetrieverSettings", "align", "clause_tools", "train_retriever", "retriever_encoder"]

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import numpy as np
import scipy.special

from resilibench.settings import AT_LEAST_ONE, Settings, setting

from ..core.registry import default_registry
from .clusters import ClusterRecord


@dataclass(frozen=True)
class RetrieverSettings(Settings):
    """The fine-tuning of the retriever: ``epochs`` over at most ``max_pairs`` distinct (clause, tool)
    pairs, each step a cross-entropy over the 30 tools of ``scale`` times each clause's cosine similarity
    to every tool's text."""

    section = "RetrieverSettings"

    epochs: int = setting(1, bounds=AT_LEAST_ONE, help="passes over the pairs")
    learning_rate: float = setting(2e-5, above=0.0, help="AdamW's learning rate")
    batch_size: int = setting(32, bounds=AT_LEAST_ONE, help="clauses a step")
    scale: float = setting(20.0, above=0.0, help="the similarities' scale in the cross-entropy (an inverse temperature)")
    max_pairs: int = setting(6000, bounds=AT_LEAST_ONE, help="distinct pairs kept, drawn with the seed when there are more")
    seed: int = setting(0, bounds=(0, None), help="the draw of the pairs and their order")


def align(similarities: np.ndarray) -> list[int] | None:
    """The clause of each tool (rows: clauses in the text's order, columns: the required tools in the
    task's order): increasing clause indices with the largest total similarity, a clause for one tool at
    most; None when there are fewer clauses than tools. Clauses left over are no step (the input sentence,
    a closing remark, an added requirement)."""
    clauses, tools = similarities.shape
    if clauses < tools:
        return None
    best = np.full((clauses + 1, tools + 1), -np.inf)
    best[:, 0] = 0.0
    for i in range(1, clauses + 1):
        for j in range(1, min(i, tools) + 1):
            best[i, j] = max(best[i - 1, j], best[i - 1, j - 1] + similarities[i - 1, j - 1])
    chosen, i = [], clauses
    for j in range(tools, 0, -1):
        while best[i, j] == best[i - 1, j]:
            i -= 1
        chosen.append(i - 1)
        i -= 1
    return chosen[::-1]


def clause_tools(records: Sequence[ClusterRecord]) -> list[tuple[str, str]]:
    """The distinct (clause, tool) pairs of every variant of ``records``: the clauses the search baseline
    searches (``SearchTextAgent.searches``) matched with the task's required tools by ``align`` under the
    shipped model (each clause's log-probability of each tool); variants with fewer such clauses than required tools give none."""
    from ..agents.text_baselines import SearchTextAgent  # the text env's agents: loaded when asked
    from ..core.matching import embed, tool_text

    registry = default_registry()
    tools = embed([tool_text(tool) for tool in registry.tools])
    column = {name: i for i, name in enumerate(registry.names)}
    jobs = [(SearchTextAgent.searches(v.text), r.task.required_tools) for r in records for v in r.variants]
    texts = list(dict.fromkeys(clause for searched, _ in jobs for clause in searched))
    row = {text: i for i, text in enumerate(texts)}
    similarities = embed(texts) @ tools.T if texts else np.zeros((0, len(column)))
    # How much more a clause is like a tool than like the others (log-probabilities over the 30 tools at
    # the tuning's scale): raw similarities put a vague clause above the step it is next to.
    log_probabilities = scipy.special.log_softmax(RetrieverSettings().scale * similarities, axis=1)
    pairs: dict[str, str] = {}
    for searched, required in jobs:
        matched = align(log_probabilities[np.ix_([row[c] for c in searched], [column[t] for t in required])])
        for tool, index in zip(required, matched or (), strict=False):
            pairs.setdefault(searched[index], tool)
    return list(pairs.items())


def train_retriever(pairs: Sequence[tuple[str, str]], output_dir: str | Path, settings: RetrieverSettings,
                    progress: bool = True) -> Path:
    """Fine-tune the shipped MiniLM on ``pairs`` and save it in ``output_dir`` (a sentence-transformers
    model directory, written whole or not at all); returns ``output_dir``."""
    import torch
    from tqdm.auto import tqdm

    from ..core.matching import new_embedding_model, tool_text

    if not pairs:
        raise ValueError("pairs: no (clause, tool) pair to train the retriever on")
    rng = random.Random(settings.seed)
    pairs = list(pairs)
    if len(pairs) > settings.max_pairs:
        pairs = rng.sample(pairs, settings.max_pairs)
    torch.manual_seed(settings.seed)
    model = new_embedding_model()
    registry = default_registry()
    tool_texts = [tool_text(tool) for tool in registry.tools]
    column = {name: i for i, name in enumerate(registry.names)}

    def encode(texts: list[str]) -> torch.Tensor:
        return torch.nn.functional.normalize(model(model.preprocess(texts))["sentence_embedding"], dim=-1)

    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    model.train()
    steps = settings.epochs * -(-len(pairs) // settings.batch_size)
    with tqdm(total=steps, desc="retriever", unit="step", disable=not progress) as bar:
        for _ in range(settings.epochs):
            rng.shuffle(pairs)
            for start in range(0, len(pairs), settings.batch_size):
                batch = pairs[start:start + settings.batch_size]
                logits = settings.scale * encode([clause for clause, _ in batch]) @ encode(tool_texts).T
                loss = torch.nn.functional.cross_entropy(logits, torch.tensor([column[t] for _, t in batch]))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    output_dir = Path(output_dir)
    partial_dir = output_dir.with_name(output_dir.name + ".partial")
    model.save(str(partial_dir))
    partial_dir.rename(output_dir)
    return output_dir


@cache
def retriever_encoder(model_dir: str) -> Callable[[Sequence[str]], np.ndarray]:
    """The tuned model in ``model_dir`` as a search encoder (texts to unit-norm rows; loaded once)."""
    from sentence_transformers import SentenceTransformer

    from ..core.matching import embed

    if not Path(model_dir, "config.json").is_file():
        raise FileNotFoundError(f"search_retriever: {model_dir} holds no tuned retriever (no config.json)")
    return partial(embed, model=SentenceTransformer(model_dir, device="cpu", local_files_only=True))
