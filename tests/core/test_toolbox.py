"""The text protocol's toolbox: tool search, tool info, message parsing, calls with argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import PIPELINE, make_task, scripted_episode
from resilibench.core.config import WorldConfig
from resilibench.core.registry import DEPENDENCY_ERROR, INVALID_INPUT, default_registry
from resilibench.core.simulator import RETRY_LIMIT_ERROR, Episode
from resilibench.core.text.toolbox import (
    ToolCall,
    UnknownToolError,
    call_tool,
    describe_tool,
    feedback_text,
    parse_message,
    search_tools,
    search_tools_many,
)

STRICT = WorldConfig().replace(rules={"strict_dependencies": True})


# --- search -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["lexical", "semantic"])
@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("parse json", "data_processing_parser"),
        ("read a csv file", "file_operations_reader"),
        ("compress an archive", "file_operations_compressor"),
    ],
)
def test_search_ranks_the_matching_tool_first(method, query, best):
    hits = search_tools(query, k=5, method=method)
    assert len(hits) == 5
    assert hits[0].name == best
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert search_tools(query, k=5, method=method) == hits  # deterministic


def test_search_k_and_bad_input():
    assert len(search_tools("network", k=30, method="lexical")) == 30
    assert len(search_tools("network", k=100, method="lexical")) == 30
    assert [h.name for h in search_tools("send data to an http endpoint", k=1, method="lexical")] == ["network_poster"]
    for bad in ("", "   "):
        with pytest.raises(ValueError, match="query"):
            search_tools(bad)
    with pytest.raises(ValueError, match="k must be"):
        search_tools("parse", k=0)
    with pytest.raises(ValueError, match="method"):
        search_tools("parse", method="fuzzy")


@pytest.mark.parametrize("method", ["lexical", "semantic"])
def test_search_many_answers_each_query_as_one_search_does(method):
    queries = ["parse json", "read a csv file", "parse json", "keep only the rows that match the condition"]
    batch = search_tools_many(queries, k=4, method=method)
    assert len(batch) == len(queries) and batch[0] == batch[2]
    for query, hits in zip(queries, batch, strict=True):
        one = search_tools(query, k=4, method=method)
        assert [h.name for h in hits] == [h.name for h in one]
        assert [h.score for h in hits] == pytest.approx([h.score for h in one], abs=2e-4)  # batched float32 embeddings
    assert search_tools_many([], method=method) == []
    with pytest.raises(ValueError, match="every query"):
        search_tools_many(["parse", " "], method=method)
    with pytest.raises(ValueError, match="k must be"):
        search_tools_many(["parse"], k=0, method=method)


def test_search_many_searches_with_the_encoder_it_is_given():
    """An encoder replaces the shipped model: the shipped model's own ``embed`` as the encoder answers as
    semantic search does; one that sees every text alike ranks every tool level, ties by name."""
    pytest.importorskip("sentence_transformers")
    from resilibench.core.matching import embed

    queries = ["parse json", "keep only the rows that match the condition"]
    assert [[h.name for h in hits] for hits in search_tools_many(queries, 3, encoder=embed)] == \
        [[h.name for h in hits] for hits in search_tools_many(queries, 3, method="semantic")]
    level = search_tools_many(queries, 3, encoder=lambda texts: np.ones((len(texts), 4)) / 2)
    assert [h.name for h in level[0]] == sorted(default_registry().names)[:3] and level[0] == level[1]
    assert {h.score for h in level[0]} == {1.0}


# --- describe -----------------------------------------------------------------------------------------


def test_describe_tool_has_the_schema_and_resolves_aliases():
    info = describe_tool("data_processing_transformer")
    assert info["name"] == "data_processing_transformer"
    assert info["dependencies"] == ["data_processing_parser"]
    assert {p["name"] for p in info["parameters"]} == {"input_format", "output_format", "options"}
    assert info["input_schema"]["required"] == ["input_format", "output_format"]
    assert [r["name"] for r in info["returns"]] == ["success", "data", "metadata"]
    assert "TIMEOUT" in [e["code"] for e in info["errors"]]
    assert describe_tool("data_processing_merger")["name"] == "data_processing_aggregator"
    assert describe_tool("  Data Processing Parser ")["name"] == "data_processing_parser"


def test_unknown_tool_lists_close_matches():
    with pytest.raises(UnknownToolError) as caught:
        describe_tool("data_procesing_parsr")
    assert isinstance(caught.value, KeyError)
    assert "did you mean data_processing_parser" in str(caught.value)
    assert not str(caught.value).startswith('"')


# --- parsing ------------------------------------------------------------------------------------------


def test_parse_tags_arguments_and_completion():
    parsed = parse_message(
        "Reasoning: start with the file.\n<tool_search> file reader </tool_search>\n"
        "<TOOL_INFO>file_operations_reader</Tool_Info>\n"
        '<tool_call>file_operations_reader {"source": "data/a.csv", "options": {"n": 1}}</tool_call>\n'
        "Task completed."
    )
    assert parsed.searches == ("file reader",)
    assert parsed.infos == ("file_operations_reader",)
    assert parsed.calls == (ToolCall("file_operations_reader", {"source": "data/a.csv", "options": {"n": 1}}, None),)
    assert parsed.completes
    assert not parse_message("<tool_call>data_processing_parser</tool_call>").completes


def test_parse_code_fences_and_other_call_forms():
    fenced = parse_message('```\n<tool_call>\n```json\ndata_processing_parser {"source": "x"}\n```\n</tool_call>\n```')
    assert fenced.calls == (ToolCall("data_processing_parser", {"source": "x"}, None),)
    assert parse_message("`<tool_call>network_fetcher</tool_call>`").calls == (ToolCall("network_fetcher", None, None),)
    assert parse_message('<tool_call>network_fetcher({"source": "u"})</tool_call>').calls[0].arguments == {"source": "u"}
    function_style = parse_message('<tool_call>{"name": "network_fetcher", "arguments": {"source": "u"}}</tool_call>')
    assert function_style.calls == (ToolCall("network_fetcher", {"source": "u"}, None),)
    # generation stopped before the closing tag: the call runs to the end of the message
    assert parse_message("<tool_call>network_fetcher").calls == (ToolCall("network_fetcher", None, None),)
    two = parse_message("<tool_call>a_b</tool_call><tool_call>c_d</tool_call>")
    assert [c.name for c in two.calls] == ["a_b", "c_d"]
    assert not parse_message("no tags here").has_tags


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('data_processing_parser {"source": "x"', "malformed JSON"),
        ("data_processing_parser {source: x}", "malformed JSON"),
        ('data_processing_parser ["x"]', "JSON object"),
        ('{"name": "data_processing_parser", "arguments": [1]}', "JSON object"),
        ("", "no tool name"),
    ],
)
def test_parse_bad_arguments_carry_a_problem(body, problem):
    (call,) = parse_message(f"<tool_call>{body}</tool_call>").calls
    assert call.arguments is None
    assert problem in call.problem


# --- calling ------------------------------------------------------------------------------------------


def test_invalid_arguments_fail_without_a_draw_and_name_the_argument():
    episode = Episode.start(make_task(), 3)
    result = call_tool(episode, "file_operations_reader", {"path": "data/a.csv"})
    assert result.record.error_code == INVALID_INPUT and not result.record.success
    assert result.record.probability is None and episode.draws_used == 0
    assert "'path'" in result.message and "source" in result.message
    assert episode.n_failures == 1 and episode.turns_used == 1
    assert result.output["error"] == {"code": INVALID_INPUT, "description": result.message}
    missing = call_tool(episode, "file_operations_reader", {})
    assert "'source' is a required property" in missing.message
    wrong_type = call_tool(episode, "data_processing_transformer", {"input_format": "csv", "output_format": 3})
    assert "argument 'output_format'" in wrong_type.message
    assert episode.draws_used == 0
    text = feedback_text(wrong_type, episode)
    assert "INVALID_INPUT" in text and "output_format" in text


def test_valid_or_absent_arguments_play_the_call():
    task = make_task()
    with_args = Episode.start(task, 11)
    plain = Episode.start(task, 11)
    a = call_tool(with_args, "file_operations_reader", {"source": "data/a.csv"})
    b = call_tool(plain, "file_operations_reader", None)
    assert a.record == b.record and a.message is None
    assert with_args.draws_used == 1 and a.record.probability == pytest.approx(0.8)


def test_malformed_json_problem_is_invalid_input():
    episode = Episode.start(make_task(), 0)
    (call,) = parse_message('<tool_call>file_operations_reader {"source": </tool_call>').calls
    result = call_tool(episode, call.name, call.arguments, call.problem)
    assert result.record.error_code == INVALID_INPUT and "malformed JSON" in result.message


def test_unknown_tool_spends_nothing():
    episode = Episode.start(make_task(), 0)
    with pytest.raises(UnknownToolError, match="did you mean file_operations_reader"):
        call_tool(episode, "file_operation_reader", None)
    assert episode.turns_used == 0 and not episode.trace


def test_success_output_follows_returns_and_replay_repeats_it():
    episode = scripted_episode(make_task(), [True])
    first = call_tool(episode, "file_operations_reader", None)
    assert first.output["success"] is True
    assert set(first.output) >= {"data", "metadata", "progress", "turns_left", "unmet_dependencies"}
    assert first.output["progress"] == {"required_done": 1, "required_total": len(PIPELINE)}
    again = call_tool(episode, "file_operations_reader", None)
    assert again.record.replayed and again.record.probability is None and episode.draws_used == 1
    assert again.output["data"] == first.output["data"] and again.output["turns_left"] == first.output["turns_left"] - 1
    assert "already succeeded" in feedback_text(again, episode)
    # a different tool gets a differently shaped payload (its own return field)
    validator = call_tool(scripted_episode(make_task(), [True]), "data_processing_validator", None)
    assert validator.output["valid"] is True and "data" not in validator.output


def test_dependency_problems_and_retry_cap_in_feedback():
    episode = scripted_episode(make_task(max_retries=1), [False, False], STRICT)
    result = call_tool(episode, "data_processing_transformer", None)
    assert result.record.error_code == DEPENDENCY_ERROR
    assert result.output["unmet_dependencies"] == ["data_processing_parser"]
    text = feedback_text(result, episode)
    assert "data_processing_parser must succeed first (not executed yet)" in text
    assert "0/5 required tools done; 9 turns left" in text
    call_tool(episode, "file_operations_reader", None)  # draw 0 fails
    episode.call("data_processing_filter")  # breaks the same-tool streak
    second = call_tool(episode, "file_operations_reader", None)  # max_retries=1: a second call is allowed
    assert second.record.error_code != RETRY_LIMIT_ERROR and episode.draws_used == 3
    over = call_tool(episode, "file_operations_reader", None)
    assert over.record.error_code == RETRY_LIMIT_ERROR and over.record.probability is None
    assert "at most 2 times" in feedback_text(over, episode)


def test_feedback_reports_the_end_of_the_episode():
    episode = scripted_episode(make_task(), [False] * 5)
    for tool in ("file_operations_reader", "data_processing_parser", "file_operations_reader",
                 "data_processing_parser", "file_operations_reader"):
        result = call_tool(episode, tool, None)
    assert episode.end_reason == "consecutive_failures"
    assert "Episode ended (consecutive failures); result: failure." in feedback_text(result, episode)


def test_outputs_are_deterministic():
    registry = default_registry()
    for seed in range(5):
        a, b = Episode.start(make_task(), seed), Episode.start(make_task(), seed)
        for tool in registry.names[:8]:
            assert call_tool(a, tool, None) == call_tool(b, tool, None)
            if a.done:
                break


# --- hostile messages (issue 12, items 13-14) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('file_operations_reader {"source": ' + "1" * 5000 + "}", "malformed JSON"),  # int digit limit
        ("file_operations_reader " + "[" * 3000, "malformed JSON"),  # recursion limit
        ('{"name": "file_operations_reader", "arguments": {"n": ' + "9" * 5000 + "}}", "no tool name"),
        ('{"name": "file_operations_reader", "arguments": ' + "[" * 3000 + "}", "no tool name"),
    ],
)
def test_json_beyond_the_parsers_limits_is_a_problem_not_an_exception(body, problem):
    (call,) = parse_message(f"<tool_call>{body}</tool_call>").calls
    assert call.arguments is None
    assert problem in call.problem


@pytest.mark.parametrize("method", ["lexical", "semantic"])
def test_search_with_a_lone_surrogate_is_answered(method):
    hits = search_tools("read a file \ud800", k=3, method=method)
    assert len(hits) == 3
    assert hits == search_tools("read a file ?", k=3, method=method)


@pytest.mark.parametrize(
    ("message", "name", "arguments"),
    [
        ("<tool_call>```file_operations_reader```</tool_call>", "file_operations_reader", None),
        ('<tool_call>```file_operations_reader {"source": "x"}```</tool_call>', "file_operations_reader",
         {"source": "x"}),
        ("<tool_call>```json\nfile_operations_reader\n```</tool_call>", "file_operations_reader", None),
        ("<tool_call>```\nfile_operations_reader\n```</tool_call>", "file_operations_reader", None),
    ],
)
def test_a_fence_right_before_the_name_keeps_the_name(message, name, arguments):
    assert parse_message(message).calls == (ToolCall(name, arguments, None),)
    if arguments is None:
        assert parse_message(message.replace("tool_call", "tool_info")).infos == (name,)
