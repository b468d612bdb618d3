"""Cluster datasets: records and their JSON round trip, reproducible and order-independent builds,
the incremental and resumable clusters.jsonl with its config check, clear errors on bad files, and the
`resilibench robust clusters` command."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helpers import ScriptedBackend
from resilibench.cli import main
from resilibench.core.tasks.library import interleave_task_types, write_tasks
from resilibench.core.world import load_tasks
from resilibench.errors import ConfigChanged, RunDirectoryError
from resilibench.robust_train.clusters import (
    CLUSTERS_FILE,
    META_FILE,
    ClusterRecord,
    build_clusters,
    load_clusters,
    parse_types,
    write_clusters,
)
from resilibench.robust_train.instructions import PERTURBATION_TYPES, InstructionPerturber, check_variant

# Quick tasks (short reference workflows), two types in turn.
TASKS = interleave_task_types(load_tasks(split="train", task_types=("basic_file_processing",
                                                                   "simple_data_transformation")))[:6]


@pytest.fixture(scope="module")
def records():
    return list(build_clusters(TASKS, variants_per_type=2, seed=0))


def test_records_hold_the_original_and_every_variant(records):
    assert [r.cluster_id for r in records] == [t.instance_id for t in TASKS]
    for record, task in zip(records, TASKS, strict=True):
        assert record.task == task
        assert record.variants[0].variant_id == "original-0" and record.variants[0].text == task.description
        assert [v.variant_id for v in record.variants[1:]] == [f"{k}-{i}" for k in PERTURBATION_TYPES for i in (0, 1)]
        assert record.variants_of("noise_heavy")[1].variant_id == "noise_heavy-1"
        assert record.variants_of("noise_light")[0].text != record.variants_of("noise_light")[1].text
        tools = [n.tool for n in record.reference.nodes]
        assert set(task.required_tools) <= set(tools)
        for v in record.variants[1:]:
            assert v.source == "rules"
            check_variant(task.description, v.text, v.perturbation, record.reference)


def test_json_round_trip(records):
    for record in records:
        data = json.loads(json.dumps(record.to_dict()))
        assert ClusterRecord.from_dict(data) == record
        assert data["task"] == record.task.to_dict()


def test_builds_are_reproducible_and_independent_of_selection_and_order(records):
    again = {r.cluster_id: r for r in build_clusters(list(reversed(TASKS))[:4], variants_per_type=2, seed=0)}
    assert all(again[r.cluster_id] == r for r in records if r.cluster_id in again)
    other = list(build_clusters(TASKS[:2], variants_per_type=2, seed=1))
    assert all(a.variants[1:] != b.variants[1:] for a, b in zip(records, other, strict=False))
    subset = list(build_clusters(TASKS[:2], types=("noise_heavy", "paraphrase"), seed=0))
    assert [v.perturbation for v in subset[0].variants] == ["original", "paraphrase", "noise_heavy"]
    assert subset[0].variants_of("noise_heavy") == records[0].variants_of("noise_heavy")[:1]
    assert list(build_clusters(TASKS[:1], types=()))[0].variants == records[0].variants[:1]


def test_llm_variants_are_batched_across_tasks():
    def answer(conversation):
        text = conversation[1]["content"].split("Instruction:\n", 1)[1].split("\n\nLiterals", 1)[0]
        if conversation[0]["content"].startswith("You tighten"):
            return f"<answer>{text}</answer>"  # nothing added: refused every time
        return f"<answer>In short: {text}</answer>"  # a valid paraphrase in either world

    backend = ScriptedBackend(answer)
    built = list(build_clusters(TASKS[:4], types=("paraphrase", "requirements", "noise_light"),
                                perturber=InstructionPerturber(backend), batch_size=3))
    # Per batch of tasks, one call per round for its pending variants: 3 tasks, then 1.
    assert backend.calls == [6, 3, 3, 2, 1, 1]
    sources = {v.perturbation: v.source for r in built for v in r.variants}
    assert sources == {"original": "original", "paraphrase": "llm", "requirements": "rules", "noise_light": "rules"}
    assert all("fallback_reason" in r.variants_of("requirements")[0].notes for r in built)


def test_parse_types():
    assert parse_types("noise_heavy,paraphrase,noise_heavy") == ("paraphrase", "noise_heavy")
    assert parse_types(()) == ()
    for bad in ("paraphrase,bogus", "", "Paraphrase"):
        with pytest.raises(ValueError, match="comma-separated subset of paraphrase,requirements"):
            parse_types(bad)


# --- files --------------------------------------------------------------------------------------------


def test_write_resume_and_complete_a_partial_file(tmp_path, records):
    directory = tmp_path / "ds"
    first = write_clusters(directory, TASKS[:4], variants_per_type=2)
    assert first.built == 4 and first.found == 0
    loaded = load_clusters(directory)
    assert loaded == records[:4] == load_clusters(directory / CLUSTERS_FILE)
    meta = json.loads((directory / META_FILE).read_text())
    assert meta["config"]["clusters"]["types"] == list(PERTURBATION_TYPES) and meta["seeds"] == [0]
    before = (directory / CLUSTERS_FILE).read_bytes()
    twin = write_clusters(tmp_path / "twin", TASKS[:4], variants_per_type=2).path.read_bytes()
    assert twin.split(b"\n")[1:] == before.split(b"\n")[1:]  # byte-identical rows (line 1: run metadata)

    again = write_clusters(directory, TASKS[:4], variants_per_type=2)
    assert again.built == 0 and again.found == 4 and (directory / CLUSTERS_FILE).read_bytes() == before

    # An interrupted build: two complete records and a half-written third.
    lines = before.decode().splitlines(keepends=True)
    (directory / CLUSTERS_FILE).write_text("".join(lines[:3]) + lines[3][:40])
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert len(load_clusters(directory)) == 2
    completed = write_clusters(directory, TASKS, variants_per_type=2)
    assert completed.built == 4 and completed.found == 2
    assert load_clusters(directory) == records
    assert [r.cluster_id for r in completed.records] == [t.instance_id for t in TASKS]


def test_other_settings_are_refused(tmp_path):
    directory = tmp_path / "ds"
    write_clusters(directory, TASKS[:1], types=("noise_light",))
    before = (directory / CLUSTERS_FILE).read_bytes()
    with pytest.raises(ConfigChanged, match=r"different config \(clusters\.seed: 0 -> 3\)"):
        write_clusters(directory, TASKS[:2], types=("noise_light",), seed=3)
    with pytest.raises(ConfigChanged, match="clusters.types"):
        write_clusters(directory, TASKS[:2], types=("noise_heavy",))
    changed = dataclasses.replace(TASKS[0], description=TASKS[0].description + " Quickly.")
    with pytest.raises(RunDirectoryError, match="different version of that task"):
        write_clusters(directory, [changed], types=("noise_light",))
    assert (directory / CLUSTERS_FILE).read_bytes() == before
    fresh = write_clusters(directory, TASKS[:1], types=("noise_light",), seed=3, resume=False)
    assert fresh.built == 1 and len(load_clusters(directory)) == 1


def test_bad_files_give_clear_errors(tmp_path, records):
    with pytest.raises(FileNotFoundError, match="no cluster dataset here"):
        load_clusters(tmp_path / "nothing")
    path = tmp_path / CLUSTERS_FILE
    good = json.dumps(records[0].to_dict())
    path.write_text(good + "\n{not json\n" + good + "\n")
    with pytest.raises(ValueError, match=r"clusters.jsonl:2: not a JSON object line"):
        load_clusters(path)
    broken = records[0].to_dict()
    broken["variants"][0]["perturbation"] = "typo"
    path.write_text(good + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(ValueError, match=r"record 2: cluster 'task_\w+': variant 'original-0': perturbation 'typo'"):
        load_clusters(path)
    del broken["reference"]
    path.write_text(json.dumps(broken) + "\n")
    with pytest.raises(ValueError, match=r"record 1: cluster is missing field\(s\) \['reference'\]"):
        load_clusters(path)
    path.write_text("")
    with pytest.raises(ValueError, match="holds no clusters"):
        load_clusters(path)


# --- command line -------------------------------------------------------------------------------------


def test_cli_builds_resumes_and_refuses_other_configs(tmp_path, capsys):
    out = str(tmp_path / "cli")
    base = ["robust", "clusters", "--output-dir", out, "--task-type", "basic_file_processing", "--task-type",
            "simple_data_transformation", "--types", "paraphrase,noise_heavy"]
    assert main([*base, "--per-type", "1"]) == 0
    printed = capsys.readouterr()
    assert "2 clusters (0 already" in printed.out and "noise_heavy" in printed.out
    assert "2 clusters built now" in printed.err
    first = load_clusters(out)
    assert [r.cluster_id for r in first] == [t.instance_id for t in TASKS[:2]]
    assert [v.perturbation for v in first[0].variants] == ["original", "paraphrase", "noise_heavy"]

    assert main([*base, "--per-type", "1"]) == 0
    assert "0 clusters built now, 2 already there" in capsys.readouterr().err
    assert main([*base, "--per-type", "2"]) == 0
    assert "2 clusters built now, 2 already there" in capsys.readouterr().err
    assert load_clusters(out)[:2] == first

    assert main([*base, "--per-type", "1", "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "clusters.jsonl was produced with a different config (clusters.seed: 0 -> 1)" in err
    assert len(err.strip().splitlines()) == 1

    assert main(["robust", "clusters", "--output-dir", out, "--types", "paraphrase,noisy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--types" in err and "noise_light" in err

    # The same directory with the test descriptions held out by wording: refused, the option recorded.
    assert main([*base, "--per-type", "1", "--wording", "held_out"]) == 2
    assert "(clusters.wording: 'shared' -> 'held_out')" in capsys.readouterr().err
    held = str(tmp_path / "held")
    assert main([*base, "--per-type", "1", "--wording", "held_out", "--output-dir", held]) == 0
    capsys.readouterr()
    meta = json.loads((tmp_path / "held" / "meta.json").read_text())["config"]
    assert meta["clusters"]["wording"] == meta["tasks"]["wording"] == "held_out"
    assert all(r.task.metadata["wording"]["option"] == "held_out" for r in load_clusters(held))


def test_cli_with_a_custom_task_library(tmp_path, capsys):
    library = write_tasks(TASKS[:2], tmp_path / "mine.jsonl")
    out = tmp_path / "custom"
    assert main(["robust", "clusters", "--tasks", str(library), "--split", "all", "--output-dir", str(out),
                 "--types", "requirements"]) == 0
    assert "2 clusters" in capsys.readouterr().out
    loaded = load_clusters(out)
    assert [r.task for r in loaded] == TASKS[:2]
    meta = json.loads((out / META_FILE).read_text())
    assert meta["config"]["tasks"]["path"] == str(library) and meta["counts"]["clusters_in_file"] == 2
