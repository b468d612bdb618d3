"""BLEU / GLEU on workflow texts and BERTScore with the local MiniLM."""

from __future__ import annotations

import pytest

from resilibench.core.workflow import Node, Workflow
from resilibench.metrics.lexical import bleu, corpus_bleu, corpus_gleu, gleu, lexical_scores, workflow_text
from resilibench.metrics.semantic import BertScore, BertScorer, bertscore

READ = "read and retrieve data from files"
PARSE = "parse raw input into a structured format"
WRITE = "write and export results to a file destination"
GOLDEN = Workflow.chain(["file_operations_reader", "data_processing_parser", "file_operations_writer"],
                        [READ, PARSE, WRITE])
UNRELATED = Workflow.chain(["computation_simulator"], ["simulate planetary orbits over centuries"])


def test_workflow_text_is_step_texts_in_topological_order():
    # Nodes listed out of execution order: the text follows the dependency order, tool names stand in
    # for missing texts, and no numbering or tool prefix is added.
    w = Workflow((Node("file_operations_writer", WRITE), Node("file_operations_reader", "")), ((1, 0),))
    assert workflow_text(w) == "file_operations_reader\n" + WRITE
    assert workflow_text(GOLDEN) == "\n".join([READ, PARSE, WRITE])
    assert workflow_text("already text") == "already text"


def test_bleu_gleu_identical_disjoint_and_partial():
    assert bleu(GOLDEN, GOLDEN) == 1.0 and gleu(GOLDEN, GOLDEN) == 1.0
    assert bleu(UNRELATED, GOLDEN) < 0.05 and gleu(UNRELATED, GOLDEN) < 0.05
    shorter = Workflow.chain(["file_operations_reader", "file_operations_writer"], [READ, WRITE])
    assert 0.2 < bleu(shorter, GOLDEN) < 1.0 and 0.2 < gleu(shorter, GOLDEN) < 1.0
    reworded = Workflow.chain(GOLDEN.tools, [READ, "interpret unprocessed inputs as structured data", WRITE])
    assert bleu(reworded, GOLDEN) < 1.0 and gleu(reworded, GOLDEN) < 1.0
    assert lexical_scores(shorter, GOLDEN) == {"bleu": bleu(shorter, GOLDEN), "gleu": gleu(shorter, GOLDEN)}


def test_corpus_scores():
    assert corpus_bleu([GOLDEN, UNRELATED], [GOLDEN, UNRELATED]) == 1.0
    assert corpus_gleu([GOLDEN, UNRELATED], [GOLDEN, UNRELATED]) == 1.0
    assert corpus_bleu([UNRELATED, GOLDEN], [GOLDEN, UNRELATED]) < 0.05
    with pytest.raises(ValueError, match="same length"):
        corpus_gleu([GOLDEN], [])


@pytest.fixture(scope="module")
def scorer() -> BertScorer:
    return BertScorer()


def test_bertscore_identical_is_one_and_paraphrase_beats_unrelated(scorer):
    same = bertscore(GOLDEN, GOLDEN, scorer)
    assert same.precision == pytest.approx(1.0, abs=1e-9) and same.f1 == pytest.approx(1.0, abs=1e-9)
    paraphrase = bertscore("load and obtain the data from documents", READ, scorer).f1
    unrelated = bertscore("simulate planetary orbits over centuries", READ, scorer).f1
    assert 0 < unrelated < paraphrase < 1


def test_bertscore_precision_and_recall_are_greedy_matches(scorer):
    """A candidate that is a prefix of the reference: its tokens all find exact matches (precision ~1)
    while the reference's extra tokens do not (recall < 1); swapping the roles swaps them."""
    part, whole = READ, READ + " and write the results"
    s = bertscore(part, whole, scorer)
    t = bertscore(whole, part, scorer)
    assert s.precision > s.recall and t.recall > t.precision
    assert s.precision == pytest.approx(t.recall) and s.recall == pytest.approx(t.precision)
    assert s.f1 == pytest.approx(2 * s.precision * s.recall / (s.precision + s.recall))


def test_bertscore_batches_cache_and_empty_text(scorer):
    before = len(scorer._cache)
    results = scorer.score([GOLDEN, UNRELATED, ""], [GOLDEN, GOLDEN, GOLDEN])
    assert len(scorer._cache) <= before + 3  # each distinct text encoded once
    assert results[0].f1 == pytest.approx(1.0) and results[2].f1 == 0.0
    again = scorer.score([UNRELATED], [GOLDEN])
    assert again[0] == results[1]  # cached embeddings: the same numbers
    with pytest.raises(ValueError, match="same length"):
        scorer.score([GOLDEN], [])


def test_bertscore_idf_weighting_and_layer_choice(scorer):
    corpus = [READ, PARSE, WRITE, READ + " again"]
    weighted = BertScorer(idf_corpus=corpus)
    assert weighted.settings["idf"] is True and weighted.settings["rescaled"] is False
    assert weighted.score([GOLDEN], [GOLDEN])[0].f1 == pytest.approx(1.0)
    # Words common to the corpus ("read", "data") weigh less, so the scores differ from uniform weights.
    cand, ref = "read the data", READ
    assert weighted.score([cand], [ref])[0].recall != pytest.approx(scorer.score([cand], [ref])[0].recall)
    with pytest.raises(ValueError, match="layer must be in 1..6"):
        BertScorer(layer=7)


def test_empty_workflows_follow_the_structural_convention(scorer):
    """Regression: two empty workflows scored 1 structurally but 0 under BLEU, GLEU and BERTScore."""
    from resilibench.metrics.structural import structural_scores

    empty = Workflow(())
    assert set(structural_scores(empty, empty).values()) == {1.0}
    assert bleu(empty, empty) == gleu(empty, empty) == 1.0
    assert bertscore(empty, empty, scorer) == bertscore("  ", "", scorer) == BertScore(1.0, 1.0, 1.0)
    assert bleu(empty, GOLDEN) == gleu(GOLDEN, empty) == 0.0
    assert bertscore(empty, GOLDEN, scorer).f1 == bertscore(GOLDEN, empty, scorer).f1 == 0.0


def test_bertscore_does_not_depend_on_chunks_or_batch_mates():
    """Regression (item 20 of the hardening issue): padded batches moved embeddings by ~3e-7, so a
    pair's score depended on --batch-size and on which texts were encoded with it, which a resumed
    calibration changes. Scoring all pairs at once, in chunks, or one by one in reverse order with
    fresh scorers now gives the same numbers bit for bit."""
    from resilibench.metrics.calibration import WorkflowScorer, iter_chunks

    texts = [READ, PARSE, WRITE, READ + " and " + WRITE, "x", "validate every record", PARSE + " twice",
             "\n".join([READ, PARSE, WRITE]), "read the rows", "parse rows"]
    refs = [WRITE, READ, PARSE, READ, READ, PARSE, WRITE, READ, PARSE, WRITE]
    pairs = [(Workflow((Node(text=t),)), Workflow((Node(text=r),))) for t, r in zip(texts, refs, strict=True)]
    runs = []
    for size in (1, 3, 64):
        scorer = WorkflowScorer(["bertscore"], bert=BertScorer())
        runs.append([row["scores"]["bertscore"] for chunk in iter_chunks(pairs, size) for row in scorer.score(chunk)])
    assert runs[0] == runs[1] == runs[2]
    alone = [BertScorer().score([t], [r])[0].f1 for t, r in reversed(list(zip(texts, refs, strict=True)))]
    assert alone[::-1] == runs[0]
