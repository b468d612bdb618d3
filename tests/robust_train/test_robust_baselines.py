"""The robustness table's baselines that learn nothing: copying tool names out of the instruction
(rebuilds every world-v0 workflow, finds nothing in world v1), looking up the task type's most frequent
workflow, and searching the tools with the instruction's clauses as the text env's scripted:search does."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache

import pytest

from resilibench.core.tasks.library import interleave_task_types
from resilibench.core.world import load_tasks
from resilibench.robust_train.clusters import build_clusters
from resilibench.robust_train.evaluation import (
    lookup_answers,
    name_copy_answers,
    named_chain,
    robustness_table,
    search_answers,
)
from resilibench.robust_train.generator import canonical_form, parse_workflow, tools_workflow, workflow_text

TYPES = ("paraphrase", "requirements", "noise_heavy")


@cache
def clusters(world: str, split: str, count: int):
    tasks = interleave_task_types(load_tasks(split=split, world=world))[:count]
    return list(build_clusters(tasks, types=TYPES, seed=0))


def test_named_chain_reads_every_spelling():
    chain = named_chain("First File Operations Reader, then data-processing-parser and DATA_PROCESSING_FILTER.")
    assert [n.tool for n in chain.nodes] == ["file_operations_reader", "data_processing_parser",
                                             "data_processing_filter"]
    assert chain.edges == ((0, 1), (1, 2))
    assert named_chain("Read the sales records and keep the rows with a non-zero amount.") is None


def test_name_copy_rebuilds_v0_and_finds_nothing_in_v1():
    v0 = load_tasks(world="v0")
    assert all([n.tool for n in named_chain(t.description).nodes] == list(t.required_tools) for t in v0)
    assert all(named_chain(t.description) is None for t in load_tasks())
    records = clusters("v1", "test", 10)
    answers = name_copy_answers(records)
    assert {a for by_variant in answers.values() for a in by_variant.values()} == {""}
    table = robustness_table(records, answers)
    assert all(row["valid"] == row["exec"] == 0.0 for row in table.rows.values())
    records_v0 = clusters("v0", "test", 10)
    table_v0 = robustness_table(records_v0, name_copy_answers(records_v0))
    assert table_v0.rows["original"]["valid"] == 1.0
    assert table_v0.rows["paraphrase"]["node"] == 1.0  # paraphrases keep the names: a copy is "robust"


def test_lookup_answers_the_type_s_most_frequent_workflow_whatever_the_text():
    train, records = clusters("v1", "train", 40), clusters("v1", "test", 10)
    answers = lookup_answers(train + train[:1], records)  # the first train workflow now occurs twice
    for record in records:
        texts = set(answers[record.cluster_id].values())
        assert len(texts) == 1  # the same answer for every variant
        same_type = [r for r in train if r.task.task_type == record.task.task_type]
        keys = [canonical_form(r.reference) for r in same_type]
        assert canonical_form(parse_workflow(texts.pop())) == max(keys, key=keys.count)
    table = robustness_table(records, lookup_answers(train, records))
    assert all(table.rows[kind]["node"] == table.rows[kind]["graph"] == 1.0 for kind in TYPES)
    # v1 holds the test split out by structure: a looked-up train workflow is never the reference
    assert table.rows["original"]["optimal"] == 0.0
    json.dumps(table.to_dict())
    with pytest.raises(ValueError, match="no task of type"):
        lookup_answers([r for r in train if r.task.task_type != records[0].task.task_type], records)


def test_search_answers_choose_what_scripted_search_chooses_from_the_env_s_results():
    from resilibench.agents.text_baselines import SearchTextAgent
    from resilibench.core.text.toolbox import SearchSettings, search_text, search_tools

    records = clusters("v1", "test", 6)
    answers = search_answers(records, SearchSettings(k=3, method="lexical"))
    agent = SearchTextAgent()
    found = 0
    for record in records:
        for variant in record.variants:
            # the agent's plan from the text env's rendering of the same searches
            feedback = "\n".join(search_text(q, search_tools(q, 3, method="lexical")) for q in agent.searches(variant.text))
            tools = agent.plan(feedback)
            expected = workflow_text(tools_workflow(record.task, tools)) if tools else ""
            assert answers[record.cluster_id][variant.variant_id] == expected
            found += set(record.task.required_tools) <= set(tools)
    assert found > 0  # it finds some tool sets whole: the answers are not all empty


def test_search_reads_a_clause_it_was_never_trained_on():
    record = clusters("v1", "test", 1)[0]
    text = "A small job. Keep only the rows that match the condition. Then compress the archive data/a.zip."
    variant = replace(record.variants[0], text=text)
    one = replace(record, variants=(variant,))
    answer = search_answers([one])[record.cluster_id][variant.variant_id]
    tools = [n.tool for n in parse_workflow(answer).nodes]
    assert {"data_processing_filter", "file_operations_compressor"} <= set(tools)
    assert tools.index("data_processing_filter") < tools.index("file_operations_compressor")  # the text's order
