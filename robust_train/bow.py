"""The bag-of-words workflow generator: the simplest learned generator, and the floor of a trained one.

A TF-IDF vectoriser (words and word pairs) and one logistic regression per tool, trained on instructions
labelled with their task's required tools, predict an instruction's required-tool set (every tool whose
probability passes one half; the likeliest one when none does). The tools are put in the description's
step order (each where the word or word pair that argues most for it stands), and the
workflow is the optimal one for that required-tool list (``core.bounds.reference_workflow``: the world's
own dependency completion), written as the JSON answer.

    from resilibench.robust_train.bow import BagOfWordsGenerator
    bow = BagOfWordsGenerator.fit(texts, tool_sets)
    bow.predict_tools(["Load data/a.csv and save the result to output/b.json."])
"""

from __future__ import annotations

__all__ = ["BagOfWordsGenerator", "bow_answers"]

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.registry import default_registry
from .clusters import ClusterRecord
from .generator import tools_workflow, workflow_text


@dataclass
class BagOfWordsGenerator:
    """TF-IDF features and a one-vs-rest logistic regression over the registry's tools."""

    vectorizer: Any
    classifier: Any
    tools: tuple[str, ...]

    @classmethod
    def fit(cls, texts: Sequence[str], tool_sets: Sequence[Sequence[str]], *, seed: int = 0) -> BagOfWordsGenerator:
        """Train on instructions and their required tools (scikit-learn; a few seconds for 5,000 texts)."""
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.multiclass import OneVsRestClassifier

        tools = tuple(default_registry().names)
        column = {t: i for i, t in enumerate(tools)}
        labels = np.zeros((len(texts), len(tools)), dtype=np.int8)
        for row, required in enumerate(tool_sets):
            labels[row, [column[t] for t in required]] = 1
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
        features = vectorizer.fit_transform(texts)
        present = [int(i) for i in np.flatnonzero(labels.any(axis=0))]  # a tool no train task requires: never
        classifier = OneVsRestClassifier(LogisticRegression(C=10.0, max_iter=2000, random_state=seed))
        classifier.fit(features, labels[:, present])
        return cls(vectorizer, classifier, tuple(tools[i] for i in present))

    def predict_tools(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's predicted required tools, in the text's step order."""
        features = self.vectorizer.transform(texts)
        probabilities = self.classifier.predict_proba(features)
        out = []
        for text, p in zip(texts, probabilities, strict=True):
            chosen = [int(i) for i in np.flatnonzero(p > 0.5)] or [int(np.argmax(p))]
            out.append(self._in_text_order(text, chosen))
        return out

    def _in_text_order(self, text: str, chosen: list[int]) -> list[str]:
        """The chosen tools ordered by where each one's strongest word (or word pair) stands in ``text``."""
        analyzer = self.vectorizer.build_tokenizer()
        words = analyzer(self.vectorizer.build_preprocessor()(text))
        vocabulary = self.vectorizer.vocabulary_
        grams = [[vocabulary.get(w), vocabulary.get(f"{w} {n}")] for w, n in zip(words, [*words[1:], ""][:len(words)],
                                                                                  strict=True)]
        position = {}
        for k in chosen:
            coef = getattr(self.classifier.estimators_[k], "coef_", None)  # None: required by every train task
            scores = [] if coef is None else [sum(coef[0][g] for g in pair if g is not None) for pair in grams]
            position[self.tools[k]] = int(np.argmax(scores)) if scores else 0
        return sorted(position, key=lambda t: position[t])


def bow_answers(train: Sequence[ClusterRecord], records: Sequence[ClusterRecord], *, seed: int = 0
                ) -> dict[str, dict[str, str]]:
    """The bag-of-words generator's answers (JSON workflows) to every variant of ``records``, trained on
    every variant of ``train`` labelled with its task's required tools."""
    bow = BagOfWordsGenerator.fit([v.text for r in train for v in r.variants],
                                  [r.task.required_tools for r in train for _ in r.variants], seed=seed)
    answers: dict[str, dict[str, str]] = {}
    for record in records:
        predicted = bow.predict_tools([v.text for v in record.variants])
        answers[record.cluster_id] = {v.variant_id: workflow_text(tools_workflow(record.task, tools))
                                      for v, tools in zip(record.variants, predicted, strict=True)}
    return answers
