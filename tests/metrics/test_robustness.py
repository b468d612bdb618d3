"""Robustness risk (RobustFlow eq. 1) on hand-made clusters with exact values."""

from __future__ import annotations

import pytest

from resilibench.core.workflow import Workflow
from resilibench.metrics.robustness import Cluster, risk_from_similarities, robustness_risk

A, B, C = "file_operations_reader", "data_processing_parser", "file_operations_writer"
ABC = Workflow.chain([A, B, C])
AB = Workflow.chain([A, B])
BA = Workflow.chain([B, A])


def clusters() -> list[Cluster]:
    # Cluster 1: an identical variant (F = 1) and one missing its last step (chain F1 = 2*1*(2/3)/(1+2/3)
    # = 0.8; graph F1: the variant's 3 reachability pairs {AA, BB, AB} are among the reference's 6, F1 = 2/3).
    # Cluster 2: one variant with the order reversed (chain l = 1: F1 = 0.5; graph F1: AA and BB shared,
    # the one ordered pair reversed: 2 of 3 on each side, F1 = 2/3).
    return [Cluster(ABC, (ABC, AB), ("light", "heavy"), "c1"), Cluster(AB, (BA,), ("heavy",), "c2")]


def test_node_risk_exact():
    report = robustness_risk(clusters(), "node")
    assert report.per_cluster == pytest.approx({"c1": (0.0 + 0.2) / 2, "c2": 0.5})
    # Mean over clusters of the cluster means (E_q E_delta), not the mean over the three pairs (0.2333).
    assert report.risk == pytest.approx((0.1 + 0.5) / 2)
    assert report.by_intensity == pytest.approx({"light": 0.0, "heavy": (0.2 + 0.5) / 2})
    assert (report.clusters, report.pairs) == (2, 3)


def test_graph_risk_exact():
    report = robustness_risk(clusters(), "graph")
    assert report.per_cluster == pytest.approx({"c1": (0.0 + 1 / 3) / 2, "c2": 1 / 3})
    assert report.risk == pytest.approx(0.25)
    assert report.by_intensity == pytest.approx({"light": 0.0, "heavy": 1 / 3})
    assert report.to_dict()["by_intensity"] == pytest.approx({"light": 0.0, "heavy": 1 / 3})


def test_custom_similarity_and_unlabelled_clusters():
    same_tools = lambda ref, var: float(set(ref.tools) == set(var.tools))  # noqa: E731
    report = robustness_risk([Cluster(ABC, (ABC, AB, BA)), Cluster(AB, (BA,))], same_tools)
    assert report.per_cluster == pytest.approx({0: 2 / 3, 1: 0.0})
    assert report.risk == pytest.approx(1 / 3) and report.by_intensity == {}


def test_risk_from_similarities():
    assert risk_from_similarities({"q1": [1.0, 0.8], "q2": [0.5]}) == pytest.approx((0.1 + 0.5) / 2)
    assert risk_from_similarities({"q": [1.0]}) == 0.0


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        robustness_risk([Cluster(AB, (AB,))], lambda r, v: 1.5)
    with pytest.raises(ValueError, match="no variants"):
        Cluster(AB, ())
    with pytest.raises(ValueError, match="2 intensities for 1 variants"):
        Cluster(AB, (AB,), ("a", "b"))
    with pytest.raises(ValueError, match="duplicate cluster id"):
        robustness_risk([Cluster(AB, (AB,), cluster_id="x"), Cluster(AB, (AB,), cluster_id="x")])
    with pytest.raises(ValueError, match="similarity must be one of"):
        robustness_risk(clusters(), "bleu")
    with pytest.raises(ValueError, match="no clusters"):
        risk_from_similarities({})
