"""The task library: exact counts, splits, dependency order, byte-identical regeneration."""

import collections
import gzip
import importlib.util

import pytest

from resilibench.envs.registry import default_registry
from resilibench.envs.tasks import (
    TASK_TYPES,
    EmbeddingMatcher,
    LexicalMatcher,
    default_library_path,
    generate_tasks,
    get_task,
    load_tasks,
    read_tasks,
    write_tasks,
)

EXPECTED_TYPES = {
    "basic_file_processing": 1200,
    "simple_data_transformation": 320,
    "complex_validation_pipeline": 1520,
    "complex_network_integration": 1360,
    "advanced_computation_pipeline": 640,
}


def test_shipped_library_counts():
    tasks = load_tasks(split=None)
    assert len(tasks) == 5040
    assert collections.Counter(t.task_type for t in tasks) == EXPECTED_TYPES
    assert collections.Counter(t.complexity for t in tasks) == {"easy": 1520, "medium": 2880, "hard": 640}
    assert len({t.instance_id for t in tasks}) == 5040


def test_splits_are_stratified():
    tasks = load_tasks(split=None)
    for task_type, count in EXPECTED_TYPES.items():
        splits = collections.Counter(t.split for t in tasks if t.task_type == task_type)
        assert splits["validation"] == round(count * 0.15) and splits["test"] == round(count * 0.15)
        assert sum(splits.values()) == count
    assert len(load_tasks(split="test")) + len(load_tasks(split="validation")) + len(load_tasks(split="train")) == 5040


def test_tools_per_type_and_dependency_order():
    registry = default_registry()
    ranges = {t.name: t.tools_per_task for t in TASK_TYPES}
    for task in load_tasks(split=None):
        lo, hi = ranges[task.task_type]
        assert lo <= len(task.required_tools) <= hi, task
        assert len(set(task.required_tools)) == len(task.required_tools)
        ids = task.required_ids(registry)
        for i, tool in enumerate(ids):  # nothing required later is a prerequisite of an earlier tool
            assert not (registry.ancestors(tool) & set(ids[i + 1 :]))


def test_lexical_generation_is_byte_identical(tmp_path):
    a = write_tasks(generate_tasks(seed=11, matcher=LexicalMatcher()), tmp_path / "a.jsonl")
    b = write_tasks(generate_tasks(seed=11, matcher=LexicalMatcher()), tmp_path / "b.jsonl")
    c = write_tasks(generate_tasks(seed=12, matcher=LexicalMatcher()), tmp_path / "c.jsonl")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    tasks = read_tasks(a)
    assert len(tasks) == 5040 and tasks[0].metadata["matcher"] == "lexical"


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs the embed extra")
def test_shipped_library_regenerates_byte_identically(tmp_path):
    path = write_tasks(generate_tasks(matcher=EmbeddingMatcher()), tmp_path / "tasks.jsonl.gz")
    with gzip.open(path) as new, gzip.open(default_library_path()) as shipped:
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


def test_filters_and_lookup():
    tasks = load_tasks(split="test", task_types="complex_network_integration")
    assert tasks and all(t.split == "test" and t.task_type == "complex_network_integration" for t in tasks)
    assert get_task(tasks[0].instance_id) == tasks[0]
    with pytest.raises(ValueError, match="split must be one of"):
        load_tasks(split="dev")
    with pytest.raises(ValueError, match="unknown task type"):
        load_tasks(task_types=["cooking"])
    with pytest.raises(KeyError, match="no task"):
        get_task("task_nope")


def test_library_loads_with_datasets():
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(default_library_path()), split="train")
    assert ds.num_rows == 5040
    assert ds[0]["required_tools"] == list(load_tasks(split=None)[0].required_tools)
