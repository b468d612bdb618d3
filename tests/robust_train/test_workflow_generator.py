"""The generator's contract: the answer format, parsing, canonical forms and the execution score."""

from __future__ import annotations

import json
import re

import pytest

from resilibench.core.bounds import optimal_success, reference_workflow
from resilibench.core.plan_follower import workflow_success
from resilibench.core.workflow import Node, Workflow
from resilibench.core.world import load_tasks
from resilibench.robust_train.generator import (
    GeneratorFormat,
    GeneratorOutputError,
    canonical_form,
    execution_score,
    parse_workflow,
    reduced,
    tools_workflow,
    workflow_text,
)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(split="train")[::150]


def test_reference_answers_round_trip_with_the_same_score(tasks):
    for task in tasks:
        reference = reference_workflow(task)
        text = workflow_text(reference)
        parsed = parse_workflow(text)
        assert json.loads(text)["nodes"] == list(reference.tools)
        assert canonical_form(parsed) == canonical_form(reference)
        # The reduced edges keep every order constraint, so the follower's success is unchanged.
        assert execution_score(task, parsed) == pytest.approx(workflow_success(task, reference))
        assert execution_score(task, parsed) <= optimal_success(task) + 1e-12


def test_reduction_keeps_reachability_and_drops_implied_edges():
    chain = Workflow((Node("a"), Node("b"), Node("c")), ((0, 1), (1, 2), (0, 2)))
    assert reduced(chain).edges == ((0, 1), (1, 2))
    assert canonical_form(chain) == canonical_form(Workflow.chain(["a", "b", "c"]))


def test_a_guessed_tool_order_against_the_dependencies_is_sorted_first():
    task = load_tasks(split="test")[0]
    workflow = tools_workflow(task, ["data_processing_validator", "data_processing_parser"])  # validator needs the parser
    tools = [n.tool for n in workflow.nodes]
    assert tools.index("data_processing_parser") < tools.index("data_processing_validator")
    assert workflow == tools_workflow(task, ["data_processing_parser", "data_processing_validator"])


def test_canonical_form_ignores_node_numbering_and_text():
    a = Workflow((Node("file_operations_reader", "read"), Node("data_processing_parser")), ((0, 1),))
    b = Workflow((Node("data_processing_parser"), Node("file_operations_reader")), ((1, 0),))
    assert canonical_form(a) == canonical_form(b)
    assert canonical_form(a) != canonical_form(Workflow(a.nodes, ()))


@pytest.mark.parametrize(("answer", "reason"), [
    ("", "no JSON object"),
    ("the plan is {nodes}", "not a workflow"),
    ('{"steps": []}', "not a workflow"),
    ('{"nodes": []}', "no nodes"),
    ('{"nodes": ["teleporter"]}', "unknown tool 'teleporter'"),
    ('{"nodes": ["file_operations_reader"], "edges": [[0, 3]]}', "outside"),
    ('{"nodes": ["file_operations_reader", "data_processing_parser"], "edges": [[0, 1], [1, 0]]}', "cycle"),
])
def test_malformed_answers_say_why(answer, reason):
    with pytest.raises(GeneratorOutputError, match=reason):
        parse_workflow(answer)


def test_answers_with_text_around_the_json_parse(tasks):
    task = tasks[0]
    text = workflow_text(reference_workflow(task))
    assert canonical_form(parse_workflow(f"Here you go: {text} -- done")) == canonical_form(reference_workflow(task))
    assert execution_score(task, None) == 0.0


def test_messages_carry_the_format_and_optionally_the_tools():
    plain = GeneratorFormat().messages("Load data/a.csv with file_operations_reader.")
    assert [m["role"] for m in plain] == ["system", "user"] and '"nodes"' in plain[0]["content"]
    with_tools = GeneratorFormat(tool_list=True).messages("x")
    assert "file_operations_reader" in with_tools[0]["content"] and "file_operations_reader" not in plain[0]["content"]


def test_search_hits_follow_the_instruction_clause_by_clause():
    from resilibench.agents.text_baselines import SearchTextAgent
    from resilibench.core.text.toolbox import search_tools

    text = "A small job. Keep only the rows that match the condition. Then compress the archive data/a.zip."
    fmt = GeneratorFormat(answer="names", search_hits=2)
    instruction, hits = fmt.user(text).split("\n")
    assert instruction == text and fmt.messages(text)[1]["content"] == fmt.user(text)
    groups = [group.split() for group in hits.removeprefix("Search hits: ").split(" | ")]
    assert groups == [[h.name for h in search_tools(q, 2)] for q in SearchTextAgent.searches(text)]
    assert "data_processing_filter" in groups[0] and "file_operations_compressor" in groups[1]
    assert GeneratorFormat(answer="names").user(text) == text
    assert GeneratorFormat(search_hits=2, search_hits_only=True).user(text) == hits  # the hits instead of the text
    assert fmt.to_dict()["search_hits"] == 2 and "search_hits" not in GeneratorFormat().to_dict()
    assert fmt.to_dict()["search_method"] in ("semantic", "lexical")  # other hits, another record
    for bad in ({"search_hits": -1}, {"search_hits": 1.5}, {"search_hits_only": True}, {"search_scores": True}):
        with pytest.raises(ValueError, match="search_hits"):
            GeneratorFormat(**bad)


def test_search_scores_follow_each_hit_in_hundredths():
    from resilibench.agents.text_baselines import SearchTextAgent
    from resilibench.core.text.toolbox import search_tools

    text = "A small job. Keep only the rows that match the condition. Then compress the archive data/a.zip."
    fmt = GeneratorFormat(answer="names", search_hits=2, search_hits_only=True, search_scores=True)
    groups = [group.split() for group in fmt.user(text).removeprefix("Search hits: ").split(" | ")]
    expected = [[(h.name, f"{round(h.score * 100):02d}") for h in search_tools(q, 2)]
                for q in SearchTextAgent.searches(text)]
    assert groups == [[word for hit in group for word in hit] for group in expected]
    assert all(len(score) == 2 and score.isdigit() for group in expected for _, score in group)
    names_only = GeneratorFormat(answer="names", search_hits=2, search_hits_only=True).user(text)
    assert [g.split() for g in names_only.removeprefix("Search hits: ").split(" | ")] == [g[::2] for g in groups]
    assert fmt.to_dict()["search_scores"] is True
    assert "search_scores" not in GeneratorFormat(search_hits=2).to_dict()  # earlier runs' records still match


def test_hits_by_clause_follow_each_clause_and_training_prompts_drop_words():
    """One line a searched clause, its words then its hits (the hits line's groups); a training prompt
    shows ``_`` for about ``clause_dropout`` of the clauses, the same ones every time, and only there."""
    text = ("A small job. Keep only the rows that match the condition. Then compress the archive data/a.zip. "
            "Next, tell the team by e-mail. Finally, keep the steps in this order.")
    fmt = GeneratorFormat(answer="names", search_hits=2, search_hits_by_clause=True, clause_dropout=0.5)
    groups = GeneratorFormat(search_hits=2, search_hits_only=True).user(text).removeprefix("Search hits: ").split(" | ")
    head, *lines = fmt.user(text).split("\n")
    assert head == "A small job" and [line.split(" => ") for line in lines] == [
        ["Keep only the rows that match the condition", groups[0]], ["compress the archive data/a.zip", groups[1]],
        ["tell the team by e-mail", groups[2]], ["keep the steps in this order", groups[3]]]
    assert GeneratorFormat(answer="names", search_hits=2, search_hits_by_clause=True).user(text, training=True) \
        == fmt.user(text)  # no dropout: training prompts are the evaluation's
    training = fmt.user(text, training=True)
    assert training == fmt.user(text, training=True) and training.split("\n")[0] == head
    assert [line.split(" => ")[1] for line in training.split("\n")[1:]] == groups  # the hits stay
    texts = [f"Job {i}. Keep only the rows above {i}. Then compress data/{i}.zip." for i in range(200)]
    masked = [line.startswith("_ => ") for t in texts for line in fmt.user(t, training=True).split("\n")[1:]]
    assert len(masked) == 400 and 0.4 < sum(masked) / 400 < 0.6
    assert fmt.messages(texts[0], training=True)[1]["content"] == fmt.user(texts[0], training=True)
    assert fmt.to_dict()["search_hits_by_clause"] is True and fmt.to_dict()["clause_dropout"] == 0.5
    assert "search_hits_by_clause" not in GeneratorFormat(search_hits=2).to_dict()  # earlier runs' records match
    for bad in ({"search_hits_by_clause": True}, {"search_hits": 2, "search_hits_only": True, "search_hits_by_clause": True}):
        with pytest.raises(ValueError, match="search_hits_by_clause needs"):
            GeneratorFormat(**bad)
    for bad in ({"search_hits": 2, "clause_dropout": 0.5}, {"search_hits": 2, "search_hits_by_clause": True,
                                                              "clause_dropout": 1.0}):
        with pytest.raises(ValueError, match="clause_dropout must be in"):
            GeneratorFormat(**bad)


def test_names_answers_round_trip_in_call_order_with_the_same_score(tasks):
    from resilibench.robust_train.generator import names_text, parse_names

    fmt = GeneratorFormat(answer="names")
    for task in tasks[:4]:
        reference = reference_workflow(task)
        answer = fmt.answer_text(reference)
        assert answer == names_text(reference) == "\n".join(n.tool for n in reference.nodes)
        chain = fmt.parse(answer)
        assert [n.tool for n in chain.nodes] == [n.tool for n in reference.nodes]
        assert chain.edges == tuple((i, i + 1) for i in range(len(chain.nodes) - 1))
        # A plan follower calls the steps in node order, so the chain executes as the reference does.
        assert execution_score(task, chain) == pytest.approx(execution_score(task, reference))
    assert [n.tool for n in parse_names("network_fetcherfile_operations_writer").nodes] == [
        "network_fetcher", "file_operations_writer"]
    with pytest.raises(GeneratorOutputError, match="names no tool"):
        fmt.parse("nothing here")
    assert "one per line" in fmt.messages("x")[0]["content"] and fmt.to_dict()["answer"] == "names"
    with pytest.raises(ValueError, match="answer must be one of json, names"):
        GeneratorFormat(answer="yaml")


@pytest.mark.slow  # torch, transformers and TRL: a model built, sampled and trained one step
def test_a_names_generator_decodes_tool_names_only_and_trains(tmp_path):
    """Constrained decoding: even an untrained names generator answers with tool names and line breaks
    only; one SFT step on a tiny subset trains it and keeps the constraint."""
    pytest.importorskip("torch")
    from resilibench.agents.backends import TransformersBackend
    from resilibench.core.registry import default_registry
    from resilibench.llm import GenerationConfig
    from resilibench.robust_train.clusters import build_clusters
    from resilibench.robust_train.pipeline import build_generator, run_sft
    from resilibench.robust_train.training import SFTSettings, set_torch_threads

    set_torch_threads(1)
    fmt = GeneratorFormat(answer="names")
    records = list(build_clusters(load_tasks(split="train")[:4], types=("noise_light",)))
    model = build_generator(tmp_path / "scratch", records, fmt, hidden_size=16, num_layers=1, num_heads=2,
                            vocab_size=300)
    names = "|".join(default_registry().names)

    def only_names(answer: str) -> bool:
        return bool(re.fullmatch(rf"(?:{names}|\n)+", answer) and re.search(names, answer))

    prompts = [fmt.messages(v.text) for r in records for v in r.variants]
    config = GenerationConfig(max_new_tokens=12, temperature=1.0, seed=0)
    for answer in TransformersBackend(model, batch_size=8).generate(prompts, config):
        assert only_names(answer), answer
    trained = run_sft(model, records, tmp_path / "sft", SFTSettings(
        max_steps=1, batch_size=4, gradient_accumulation_steps=1, warmup_ratio=0, lora=None), fmt, progress=False)
    result = json.loads((tmp_path / "sft" / "train" / "final" / "train_result.json").read_text())
    assert result["steps"] == 1 and result["train_loss"] > 0
    answer = TransformersBackend(trained, batch_size=8).generate(prompts[:1], config)[0]
    assert only_names(answer), answer
