"""The task libraries of both worlds: counts, splits, dependency order, byte-identical regeneration; and
world v1's diversity: distinct tool lists, every tool in use, descriptions that name no tool, test
splits held out by structure."""

import collections
import gzip
import importlib.util
import json

import pytest

from helpers import ScriptedBackend
from resilibench.agents.task_enhancer import TaskEnhancer, description_literals, description_problem
from resilibench.core.matching import EmbeddingMatcher, LexicalMatcher
from resilibench.core.registry import default_registry, named_tools
from resilibench.core.tasks.library import library_stats, read_tasks, write_tasks
from resilibench.core.world import WORLDS, get_task, get_world, load_tasks

EXPECTED_TYPES = {
    "basic_file_processing": 1200,
    "simple_data_transformation": 320,
    "complex_validation_pipeline": 1520,
    "complex_network_integration": 1360,
    "advanced_computation_pipeline": 640,
}
# Required tools per task in world v1 (v0: the operation sequence's length).
V1_LENGTHS = {
    "basic_file_processing": (2, 3),
    "simple_data_transformation": (1, 2),
    "complex_validation_pipeline": (5, 6),
    "complex_network_integration": (5, 6),
    "advanced_computation_pipeline": (6, 8),
}


@pytest.mark.parametrize("world", WORLDS)
def test_shipped_library_counts(world):
    tasks = load_tasks(split=None, world=world)
    assert len(tasks) == 5040
    assert collections.Counter(t.task_type for t in tasks) == EXPECTED_TYPES
    assert collections.Counter(t.complexity for t in tasks) == {"easy": 1520, "medium": 2880, "hard": 640}
    assert len({t.instance_id for t in tasks}) == 5040


@pytest.mark.parametrize("world", WORLDS)
def test_splits_are_stratified(world):
    tasks = load_tasks(split=None, world=world)
    for task_type, count in EXPECTED_TYPES.items():
        splits = collections.Counter(t.split for t in tasks if t.task_type == task_type)
        assert splits["validation"] == round(count * 0.15) and splits["test"] == round(count * 0.15)
        assert sum(splits.values()) == count
    by_split = [len(load_tasks(split=s, world=world)) for s in ("train", "validation", "test")]
    assert sum(by_split) == 5040


@pytest.mark.parametrize("world", WORLDS)
def test_dependency_order(world):
    registry = default_registry()
    for task in load_tasks(split=None, world=world):
        assert len(set(task.required_tools)) == len(task.required_tools)
        ids = task.required_ids(registry)
        for i, tool in enumerate(ids):  # nothing required later is a prerequisite of an earlier tool
            assert not (registry.ancestors(tool) & set(ids[i + 1 :]))


def test_v1_library_is_diverse_and_honest():
    """The acceptance counts of world v1: at least 1,500 distinct required-tool lists (here: all unique),
    every tool required by at least 20 tasks, no description naming a tool, no test list in train or
    validation, and each type's list lengths."""
    tasks = load_tasks(split=None)
    stats = library_stats(tasks)
    assert stats["distinct_tool_lists"] >= 1500
    assert stats["distinct_tool_lists"] == 5040
    assert min(stats["tasks_per_tool"].values()) >= 20 and len(stats["tasks_per_tool"]) == 30
    assert stats["descriptions_naming_a_tool"] == 0
    assert stats["test_lists_seen_in_train_or_validation"] == 0
    assert stats["distinct_descriptions"] == 5040
    test_sets = {frozenset(t.required_tools) for t in tasks if t.split == "test"}
    assert not test_sets & {frozenset(t.required_tools) for t in tasks if t.split != "test"}
    for task in tasks:
        lo, hi = V1_LENGTHS[task.task_type]
        assert lo <= len(task.required_tools) <= hi, task
        assert task.inputs["source"] in task.description  # the description says where the data is
    singles = {t.required_tools[0] for t in tasks if len(t.required_tools) == 1}
    assert singles == set(default_registry().names)  # one single-tool task per tool of every category


def test_v0_library_is_the_degenerate_one_it_was():
    """World v0 stays as shipped (41 distinct lists, tool names in descriptions), for reproducibility."""
    stats = library_stats(load_tasks(split=None, world="v0"))
    assert stats["distinct_tool_lists"] == 41
    assert stats["descriptions_naming_a_tool"] == 5040


def test_named_tools_finds_every_spelling():
    assert named_tools("use data_processing_parser then Network Fetcher, then file-operations-writer") == [
        "data_processing_parser", "Network Fetcher", "file-operations-writer"]
    assert named_tools("export via file operations exporter") == ["file operations exporter"]  # an alias
    assert named_tools("parse the records, then fetch the page") == []


@pytest.mark.parametrize("world", [pytest.param(w, marks=pytest.mark.slow) if w == "v1" else w for w in WORLDS])
def test_lexical_generation_is_byte_identical(tmp_path, world):
    """Three generations per world (v1, the larger, in the slow lane); v1's determinism is also checked in
    the fast lane by regenerating its shipped library."""
    generate = get_world(world).generate
    a = write_tasks(generate(seed=11, matcher=LexicalMatcher()), tmp_path / "a.jsonl")
    b = write_tasks(generate(seed=11, matcher=LexicalMatcher()), tmp_path / "b.jsonl")
    c = write_tasks(generate(seed=12, matcher=LexicalMatcher()), tmp_path / "c.jsonl")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    tasks = read_tasks(a)
    assert len(tasks) == 5040 and tasks[0].metadata["matcher"] == "lexical"


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs the embed extra")
@pytest.mark.parametrize("world", WORLDS)
def test_shipped_library_regenerates_byte_identically(tmp_path, world):
    path = write_tasks(get_world(world).generate(matcher=EmbeddingMatcher()), tmp_path / "tasks.jsonl.gz")
    with gzip.open(path) as new, gzip.open(get_world(world).library_path) as shipped:
        assert new.read() == shipped.read()


def test_bad_files_give_clear_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x", "task_type": "basic_file_processing", "required_tools": ["nope"]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: .*unknown required tool 'nope'"):
        read_tasks(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_tasks(bad)
    with pytest.raises(FileNotFoundError, match="tasks generate"):
        read_tasks(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="world must be one of"):
        load_tasks(world="v9")


TASK = {"instance_id": "x", "task_type": "basic_file_processing", "required_tools": ["file_operations_reader"]}


@pytest.mark.parametrize(("line", "message"), [
    ("[1]", "a task must be a JSON object, got list"),
    (json.dumps({**TASK, "required_tools": 5}), "required_tools must be a list, got int"),
    (json.dumps({**TASK, "required_tools": [["file_operations_reader"]]}), "unknown required tool"),
    (json.dumps({**TASK, "constraints": []}), "constraints must be a JSON object"),
    (json.dumps({**TASK, "constraints": {"max_retries": "3"}}), "max_retries must be an integer"),
    (json.dumps({**TASK, "instance_id": {"a": 1}}), "instance_id must be a string"),
])
def test_hostile_task_lines_are_one_line_errors(tmp_path, capsys, line, message):
    from resilibench.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(line + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl:1: .*{message}"):
        read_tasks(bad)
    assert main(["run", "--tasks", str(bad), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_filters_and_lookup():
    tasks = load_tasks(split="test", task_types="complex_network_integration")
    assert tasks and all(t.split == "test" and t.task_type == "complex_network_integration" for t in tasks)
    assert get_task(tasks[0].instance_id) == tasks[0]
    v0 = load_tasks(split="test", world="v0")[0]
    assert get_task(v0.instance_id, world="v0") == v0
    with pytest.raises(ValueError, match="split must be one of"):
        load_tasks(split="dev")
    with pytest.raises(ValueError, match="unknown task type"):
        load_tasks(task_types=["cooking"])
    with pytest.raises(KeyError, match="no task .* in world v1"):
        get_task("task_nope")


def test_library_loads_with_datasets():
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(get_world().library_path), split="train")
    assert ds.num_rows == 5040
    assert ds[0]["required_tools"] == list(load_tasks(split=None)[0].required_tools)


# --- the LLM enhancement pass ----------------------------------------------------------------------------


def test_enhancement_accepts_valid_rewrites_and_keeps_the_template_otherwise():
    tasks = load_tasks(split="test")[:3]
    literals = [description_literals(t.description) for t in tasks]
    replies = {
        # first task: a rewrite naming a tool is refused, the second answer is kept
        0: ["<answer>Use network_fetcher on it.</answer>",
            "<answer>Please handle this: " + " and ".join(literals[0]) + " as described, step by step, in order."
            "</answer>"],
        # second task: drops its literals every time -> template kept with the reason
        1: ["<answer>Do the job well.</answer>"] * 3,
        # third task: no answer block at all
        2: ["Sure! Here it is."] * 3,
    }

    def answer(conversation):
        index = next(i for i, t in enumerate(tasks) if t.description in conversation[1]["content"])
        turns = sum(m["role"] == "assistant" for m in conversation)
        return replies[index][turns]

    backend = ScriptedBackend(answer)
    out = TaskEnhancer(backend, attempts=3).enhance(tasks, batch_size=8)
    assert backend.calls == [3, 3, 2]  # all pending conversations go in one call per round
    first, second, third = out
    assert first.metadata["llm_generated"] and first.description.startswith("Please handle this")
    assert first.original_description == tasks[0].description
    assert first.metadata["enhancement"]["attempts"] == 2 and "names tools" in first.metadata["enhancement"]["errors"][0]
    assert not second.metadata["llm_generated"] and second.description == tasks[1].description
    assert "must appear exactly" in second.metadata["enhancement"]["reason"]
    assert "malformed" in third.metadata["enhancement"]["reason"]
    assert first.required_tools == tasks[0].required_tools and first.split == tasks[0].split


def test_description_problem_rules():
    original = "Load data/x_0001.csv, convert it to JSON and post it to https://h.example.org/x/0001."
    assert description_problem(original, "Read data/x_0001.csv as JSON, then send to https://h.example.org/x/0001.") \
        is None
    assert "names tools" in description_problem(original, "file operations reader on data/x_0001.csv JSON "
                                                          "https://h.example.org/x/0001")
    assert "JSON" in description_problem(original, "Load data/x_0001.csv and send it to https://h.example.org/x/0001.")
    assert "empty" in description_problem(original, "  ")


def test_every_world_is_registered():
    import gymnasium as gym

    import resilibench  # noqa: F401  (registers the env ids)

    for world in WORLDS:
        assert {f"ResiliBench-{world}", f"ResiliBenchText-{world}", f"WorkflowGen-{world}"} <= set(gym.registry)
