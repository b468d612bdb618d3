"""The retriever tuned on train clauses: which clause asks for which tool, the fine-tuning as a stage
that is reused or refused, and its hits in the generator's prompts and the search baseline."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from tiny_lm import torch_one_thread  # noqa: F401 (fixture)

from helpers import toy_demo_settings
from resilibench.core.text.toolbox import search_tools_many
from resilibench.robust_train.evaluation import search_answers
from resilibench.robust_train.generator import GeneratorFormat, parse_workflow
from resilibench.robust_train.pipeline import DemoSettings, run_demo, run_retriever
from resilibench.robust_train.retriever import RetrieverSettings, align, clause_tools, retriever_encoder

pytest.importorskip("sentence_transformers")

# Clauses whose first hit under the shipped model is another tool than the one they ask for (the hits of
# the held-out wording's test clauses that the tuning is for).
MISSED = (("write a journal entry for each step for later review", "utility_logger"),
          ("open a session with the partner system that holds the stock quotes", "integration_connector"),
          ("discover which XML files exist next to data/support_tickets_0003.xml", "file_operations_scanner"))


def test_align_matches_tools_to_clauses_in_order_and_leaves_the_rest():
    similarities = np.array([[0.9, 0.1, 0.0],   # an input sentence that looks like the first tool
                             [0.8, 0.2, 0.1],
                             [0.1, 0.7, 0.2],
                             [0.0, 0.1, 0.6],
                             [0.3, 0.2, 0.5]])  # a closing remark that looks like the last
    assert align(similarities) == [0, 2, 3]
    assert align(similarities[:, :2]) == [0, 2]
    assert align(np.array([[0.1, 0.9], [0.9, 0.1]])) == [0, 1]  # the order holds even against the similarities
    assert align(similarities[:2]) is None  # fewer clauses than tools


def test_clause_tools_pairs_each_required_tool_with_its_step_clause(cluster_records):
    record = cluster_records[0]
    text = ("A small job. Everything starts from data/a.csv. Keep only the rows priced above 100. Then pack the "
            "output into a compact archive. Keep the steps in this order.")
    task = replace(record.task, required_tools=("data_processing_filter", "file_operations_compressor"))
    one = replace(record, task=task, variants=(replace(record.variants[0], text=text),))
    assert clause_tools([one]) == [("Keep only the rows priced above 100", "data_processing_filter"),
                                   ("pack the output into a compact archive", "file_operations_compressor")]
    pairs = clause_tools(cluster_records)
    assert len({clause for clause, _ in pairs}) == len(pairs)  # distinct clauses
    required = {t for r in cluster_records for t in r.task.required_tools}
    assert {tool for _, tool in pairs} <= required


@pytest.mark.slow
def test_the_tuned_retriever_finds_what_the_shipped_model_missed_and_is_reused_or_refused(tmp_path, cluster_records,
                                                                                       monkeypatch):
    """Tuned on clauses the shipped search gets wrong, the retriever ranks their tools first; the stage is
    reused for the same inputs and refused with the change for others; the generator's hits and the search
    baseline search with it."""
    first = [hits[0].name for hits in search_tools_many([c for c, _ in MISSED], 3, method="semantic")]
    assert all(hit != tool for hit, (_, tool) in zip(first, MISSED, strict=True))
    import resilibench.robust_train.retriever as retriever

    monkeypatch.setattr(retriever, "clause_tools", lambda records: list(MISSED))
    settings = RetrieverSettings(epochs=8, learning_rate=1e-4, batch_size=3)
    model = run_retriever(cluster_records[:2], tmp_path / "retriever", settings, progress=False)
    assert model == tmp_path / "retriever" / "model" and not (tmp_path / "retriever" / "model.partial").exists()
    encoder = retriever_encoder(str(model))
    tuned = search_tools_many([c for c, _ in MISSED], 3, encoder=encoder)
    assert [hits[0].name for hits in tuned] == [tool for _, tool in MISSED]
    assert np.allclose(np.linalg.norm(encoder(["a clause"]), axis=1), 1.0)
    # Reused as it is; refused with the change for other settings.
    stamp = (model / "config.json").stat().st_mtime_ns
    assert run_retriever(cluster_records[:2], tmp_path / "retriever", settings, progress=False) == model
    assert (model / "config.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match=r"different config \(settings.epochs: 8 -> 2\)"):
        run_retriever(cluster_records[:2], tmp_path / "retriever", replace(settings, epochs=2), progress=False)
    # The generator's hits come from it, and its records say which model it was.
    fmt = GeneratorFormat(answer="names", search_hits=3, search_hits_only=True, search_retriever=str(model))
    text = f"A job. First, {MISSED[0][0]}. Then {MISSED[1][0]}."
    assert fmt.user(text).startswith("Search hits: utility_logger ") and "| integration_connector " in fmt.user(text)
    assert GeneratorFormat(answer="names", search_hits=3, search_hits_only=True).user(text) != fmt.user(text)
    digest = fmt.to_dict()["search_retriever_sha256"]
    assert isinstance(digest, str) and len(digest) >= 12
    assert "search_retriever_sha256" not in GeneratorFormat(search_hits=3).to_dict()  # earlier records match
    # The search baseline with it names the tools it was tuned for.
    record = cluster_records[0]
    one = replace(record, variants=(replace(record.variants[0], text=text),))
    answer = search_answers([one], retriever=str(model))[record.cluster_id][record.variants[0].variant_id]
    assert {"utility_logger", "integration_connector"} <= {n.tool for n in parse_workflow(answer).nodes}


def test_a_retriever_needs_hits_and_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="search_retriever needs search_hits"):
        GeneratorFormat(search_retriever=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="holds no tuned retriever"):
        retriever_encoder(str(tmp_path))
    with pytest.raises(ValueError, match="tune_retriever needs search_hits"):
        run_demo(tmp_path / "demo", DemoSettings(tune_retriever=True), progress=False, log=lambda line: None)
    assert not (tmp_path / "demo").exists()
    assert "tune_retriever" not in DemoSettings().to_dict()  # earlier runs' records match
    assert DemoSettings(search_hits=5, tune_retriever=True).to_dict()["tune_retriever"] is True


def test_no_pairs_is_refused(tmp_path):
    from resilibench.robust_train.retriever import train_retriever

    with pytest.raises(ValueError, match="no \\(clause, tool\\) pair"):
        train_retriever([], tmp_path / "model", RetrieverSettings(), progress=False)


@pytest.mark.slow
def test_the_demo_tunes_a_retriever_that_searches_the_hits_and_a_fifth_baseline(tmp_path, torch_one_thread):  # noqa: F811
    """``tune_retriever``: a retriever stage tuned on the train clusters' clauses before the generator; every
    stage's format records its digest, and "search_tuned" searches with it beside "search"."""
    from resilibench.robust_train.clusters import clusters_digest, load_clusters
    from resilibench.robust_train.training import model_digest

    settings = toy_demo_settings(search_hits=2, search_hits_only=True, tune_retriever=True)
    tables = run_demo(tmp_path, settings, progress=False, log=lambda line: None)
    assert list(tables)[:5] == ["names", "lookup", "bow", "search", "search_tuned"]
    model = tmp_path / "retriever" / "model"
    stage = json.loads((tmp_path / "retriever" / "stage.json").read_text())["config"]
    assert stage["clusters_sha256"] == clusters_digest(load_clusters(tmp_path / "clusters" / "train"))
    for name in ("base", "sft"):
        fmt = json.loads((tmp_path / name / "stage.json").read_text())["config"]["format"]
        assert fmt["search_retriever_sha256"] == model_digest(model)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["tune_retriever"] is True and "search_tuned" in report["tables"]
