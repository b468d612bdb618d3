"""Lexical overlap of workflows: BLEU (sacrebleu) and Google's GLEU (nltk) on workflow texts.

The text of a workflow is its step descriptions, one a line, in the plan's topological order (ties by
node index): each step's ``text``, or its tool name when it has no text. Numbering, tool names and the
``(after i, j)`` dependency marks of ``Workflow.to_plan`` are left out, so the scores measure how the
steps are *described*, as WorkflowPerturb (app. B.3) compares step descriptions; structure is the
business of the structural metrics. The lines are scored as one segment (n-grams may span two steps).

Both metrics tokenise with sacrebleu's ``13a`` tokenizer (case kept), so BLEU and GLEU see the same
tokens. Scores are in [0, 1] (sacrebleu's 0-100 BLEU divided by 100). Two empty texts score 1, an empty
text against a non-empty one 0: the convention of every workflow metric.
"""

from __future__ import annotations

__all__ = [
    "TextLike", "workflow_text", "tokens", "bleu", "corpus_bleu", "gleu", "corpus_gleu", "lexical_scores",
]

from collections.abc import Sequence
from functools import cache

from ..core.workflow import Workflow

TextLike = Workflow | str


def _imports():
    try:
        import sacrebleu
        from nltk.translate import gleu_score
    except ImportError as exc:
        raise ImportError(f"BLEU and GLEU need sacrebleu and nltk: pip install 'resilibench[llm]' ({exc})") from None
    return sacrebleu, gleu_score


def workflow_text(workflow: TextLike) -> str:
    """The step descriptions of ``workflow`` in topological order, one a line (a string passes through)."""
    if isinstance(workflow, str):
        return workflow
    return "\n".join(workflow.nodes[i].label for i in workflow.topological_order())


@cache
def _bleu():
    sacrebleu, _ = _imports()
    # Effective order: a short text that matches exactly scores 1 rather than 0 for lack of 4-grams.
    return sacrebleu.metrics.BLEU(effective_order=True)


@cache
def _tokenizer():
    sacrebleu, _ = _imports()
    return sacrebleu.tokenizers.tokenizer_13a.Tokenizer13a()


def tokens(text: str) -> list[str]:
    """The 13a tokens of ``text`` (the tokens BLEU counts n-grams over)."""
    return _tokenizer()(text).split()


def _clip(value: float) -> float:
    return min(1.0, max(0.0, value))  # sacrebleu's 100 can come out as 100.00000000000004


def _empty_score(pred: str, ref: str) -> float | None:
    """1 for two empty texts, 0 for one, None when both have words."""
    if pred.strip() and ref.strip():
        return None
    return float(not pred.strip() and not ref.strip())


def bleu(pred: TextLike, ref: TextLike) -> float:
    """Sentence BLEU of the predicted workflow's text against the reference's (sacrebleu defaults:
    4-grams, exponential smoothing, effective order), in [0, 1]."""
    pred_text, ref_text = workflow_text(pred), workflow_text(ref)
    empty = _empty_score(pred_text, ref_text)
    if empty is not None:
        return empty
    return _clip(_bleu().sentence_score(pred_text, [ref_text]).score / 100)


def corpus_bleu(preds: Sequence[TextLike], refs: Sequence[TextLike]) -> float:
    """Corpus BLEU over aligned lists of predictions and references (n-gram counts pooled), in [0, 1]."""
    if len(preds) != len(refs):
        raise ValueError(f"preds and refs must have the same length, got {len(preds)} and {len(refs)}")
    sacrebleu, _ = _imports()
    score = sacrebleu.metrics.BLEU().corpus_score([workflow_text(p) for p in preds], [[workflow_text(r) for r in refs]])
    return _clip(score.score / 100)


def gleu(pred: TextLike, ref: TextLike) -> float:
    """Sentence GLEU (Wu et al. 2016, ``nltk.translate.gleu_score``, 1- to 4-grams): the minimum of
    n-gram precision and recall, in [0, 1]."""
    _, gleu_score = _imports()
    pred_text, ref_text = workflow_text(pred), workflow_text(ref)
    empty = _empty_score(pred_text, ref_text)
    if empty is not None:
        return empty
    return gleu_score.sentence_gleu([tokens(ref_text)], tokens(pred_text), min_len=1, max_len=4)


def corpus_gleu(preds: Sequence[TextLike], refs: Sequence[TextLike]) -> float:
    """Corpus GLEU over aligned lists (n-gram counts pooled before the minimum is taken), in [0, 1]."""
    if len(preds) != len(refs):
        raise ValueError(f"preds and refs must have the same length, got {len(preds)} and {len(refs)}")
    _, gleu_score = _imports()
    return gleu_score.corpus_gleu([[tokens(workflow_text(r))] for r in refs], [tokens(workflow_text(p)) for p in preds],
                                  min_len=1, max_len=4)


def lexical_scores(pred: TextLike, ref: TextLike) -> dict[str, float]:
    """``{"bleu": ..., "gleu": ...}`` for one pair."""
    return {"bleu": bleu(pred, ref), "gleu": gleu(pred, ref)}
