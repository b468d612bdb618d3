"""ScPO: ranking by execution score then vote, the extremal pair and its weight, the DPO rows, and one
full iteration (sampling, pairs, weighted DPO, merge, resume) on a tiny real model."""

from __future__ import annotations

import json

import pytest
from tiny_lm import torch_one_thread  # noqa: F401 (fixture)

from helpers import toy_demo_settings
from resilibench.core.workflow import Workflow
from resilibench.errors import ConfigChanged
from resilibench.robust_train.generator import GeneratorFormat, canonical_form, parse_workflow, workflow_text
from resilibench.robust_train.scpo import Candidate, ScPOSettings, pair_rows, preference_pair, rank_candidates

A = canonical_form(Workflow.chain(["file_operations_reader", "data_processing_parser"]))
B = canonical_form(Workflow.chain(["file_operations_reader", "data_processing_filter"]))
C = canonical_form(Workflow.chain(["file_operations_reader", "data_processing_parser", "data_processing_validator"]))


def cand(variant: str, key: str, score: float) -> Candidate:
    return Candidate(variant, key, key, score)  # the canonical JSON is itself a valid answer


def test_score_first_then_vote():
    candidates = [cand("v0", A, 0.5), cand("v1", B, 0.9), cand("v2", A, 0.5), cand("v0", C, 0.5),
                  Candidate("v2", "garbage", "invalid:garbage", 0.0, "no JSON object in the answer")]
    ranked = rank_candidates(candidates)
    assert [r.key for r in ranked] == [B, A, C, "invalid:garbage"]
    assert [r.vote for r in ranked] == [0.2, 0.4, 0.2, 0.2]
    assert ranked[1].variants == ("v0", "v2")
    best, worst, gap = preference_pair(ranked, vote_weight=0.1)
    assert (best.key, worst.key) == (B, "invalid:garbage")
    assert gap == pytest.approx(0.9 + 0.1 * 0.2 - (0.0 + 0.1 * 0.2))


def test_votes_break_ties_in_score_and_weigh_the_pair():
    ranked = rank_candidates([cand("v0", A, 0.5), cand("v1", A, 0.5), cand("v2", C, 0.5)])
    best, worst, gap = preference_pair(ranked, vote_weight=0.1)
    assert (best.key, worst.key) == (A, C) and gap == pytest.approx(0.1 * (2 / 3 - 1 / 3))
    # Without a vote weight, equally good answers make no pair.
    assert preference_pair(ranked, vote_weight=0.0) is None


def test_one_unique_answer_makes_no_pair():
    assert preference_pair(rank_candidates([cand("v0", A, 0.3), cand("v1", A, 0.3)]), 0.1) is None
    # Nor do answers none of which is a workflow, however their votes differ.
    junk = [Candidate(v, t, f"invalid:{t}", 0.0, "no JSON") for v, t in (("v0", "x"), ("v1", "x"), ("v2", "y"))]
    assert preference_pair(rank_candidates(junk), 0.1) is None
    assert rank_candidates([]) == []


def test_soft_vote_counts_near_misses():
    # C extends A and shares only its first step with B: under the soft vote A gains more from C.
    candidates = [cand("v0", A, 0.5), cand("v1", B, 0.5), cand("v2", C, 0.1)]
    exact = {r.key: r.vote for r in rank_candidates(candidates, "exact")}
    soft = {r.key: r.vote for r in rank_candidates(candidates, "soft")}
    assert exact[A] == exact[B] == pytest.approx(1 / 3)
    assert soft[A] > soft[B] > exact[B]
    assert [r.key for r in rank_candidates(candidates, "soft")][:2] == [A, B]


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="vote must be one of"):
        ScPOSettings(vote="majority")
    with pytest.raises(ValueError, match="candidates must be an integer >= 1"):
        ScPOSettings(candidates=0)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        ScPOSettings(temperature=0)


def test_pair_rows_use_the_prompts_that_produced_the_worse_answer(cluster_records):
    record = cluster_records[0]
    ids = [v.variant_id for v in record.variants]
    ranked = rank_candidates([cand(ids[0], A, 0.9), cand(ids[1], B, 0.1), cand(ids[2], B, 0.1)])
    best, worst, gap = preference_pair(ranked, 0.1)
    rows = pair_rows(record, best, worst, gap, GeneratorFormat())
    texts = {v.variant_id: v.text for v in record.variants}
    assert [r["variant_id"] for r in rows] == [ids[1], ids[2]]
    assert [r["prompt"][1]["content"] for r in rows] == [texts[ids[1]], texts[ids[2]]]
    # The chosen answer is written out cleanly; the rejected one is kept as sampled.
    assert all(r["chosen"][0]["content"] == workflow_text(parse_workflow(A)) and r["rejected"][0]["content"] == B
               and r["weight"] == gap for r in rows)
    json.dumps(rows)  # rows are plain JSON
    assert workflow_text(record.reference).startswith('{"nodes": [')


@pytest.fixture(scope="module")
def sft_generator(cluster_records, tmp_path_factory, torch_one_thread):  # noqa: F811
    """A generator from scratch after SFT (full fine-tuning, enough steps for most samples at temperature
    0.7 to be workflows, and not all the same)."""
    from resilibench.robust_train.pipeline import build_generator, run_sft
    from resilibench.robust_train.training import SFTSettings

    tmp = tmp_path_factory.mktemp("generator")
    fmt = GeneratorFormat()
    base = build_generator(tmp / "scratch", cluster_records, fmt, hidden_size=64, num_layers=2, vocab_size=512)
    return run_sft(base, cluster_records, tmp / "sft", SFTSettings(
        max_steps=150, learning_rate=3e-3, batch_size=8, gradient_accumulation_steps=1, warmup_ratio=0,
        lora=None, save_steps=1000), fmt, progress=False)


@pytest.mark.slow
def test_one_full_iteration(cluster_records, sft_generator, tmp_path):
    """One ScPO iteration: sampling, ranking, weighted DPO on a LoRA adapter, merge; a rerun resumes
    without new work; the merged model is evaluated."""
    from resilibench.robust_train.evaluation import robustness_table
    from resilibench.robust_train.pipeline import evaluate_generator
    from resilibench.robust_train.scpo import run_scpo
    from resilibench.robust_train.training import LoraSettings, PreferenceSettings

    fmt = GeneratorFormat()
    settings = ScPOSettings(iterations=1, candidates=3, temperature=0.7, max_new_tokens=48,
                            preference=PreferenceSettings(batch_size=2, gradient_accumulation_steps=1,
                                                          warmup_ratio=0, lora=LoraSettings(r=4, alpha=8)))
    logs: list[str] = []
    model = run_scpo(sft_generator, cluster_records, tmp_path / "scpo", settings, fmt, progress=False,
                     log=logs.append)
    state = json.loads((tmp_path / "scpo" / "state.json").read_text())
    (iteration,) = state["iterations"]
    assert iteration["pairs"] > 0 and 0 < iteration["valid"] < 1, iteration
    assert model == tmp_path / "scpo" / "iter_01" / "model" and (model / "config.json").exists()
    assert (tmp_path / "scpo" / "iter_01" / "train" / "final" / "adapter_config.json").exists()
    rows = [json.loads(line) for line in (tmp_path / "scpo" / "iter_01" / "candidates.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "cluster_id" in r]
    assert [r["cluster_id"] for r in rows] == [r.cluster_id for r in cluster_records]
    assert all(len(r["candidates"]) == 3 * len(cluster_records[0].variants) for r in rows)
    for row in rows:
        if row["pair"] is not None:
            assert row["pair"]["chosen"]["score"] >= row["pair"]["rejected"]["score"] and row["pair"]["weight"] > 0
    # A rerun finds the iteration done and returns the same model without sampling.
    assert run_scpo(sft_generator, cluster_records, tmp_path / "scpo", settings, fmt, progress=False,
                    log=logs.append) == model
    assert len(logs) == 1
    with pytest.raises(ConfigChanged, match=r"meta.json was produced with a different config \(settings\.candidates"):
        run_scpo(sft_generator, cluster_records, tmp_path / "scpo", ScPOSettings(candidates=2), fmt, progress=False)
    table = evaluate_generator(model, cluster_records, tmp_path / "eval", fmt, max_new_tokens=48, progress=False)
    assert set(table.rows) == {"original", "paraphrase", "noise_heavy"}
    answers = {json.loads(line)["cluster_id"]: json.loads(line)["answers"]
               for line in (tmp_path / "eval" / "answers.jsonl").read_text().splitlines() if "answers" in line}
    assert robustness_table(cluster_records, answers) == table


@pytest.mark.slow
def test_cli_sft_scpo_evaluate(cluster_records, sft_generator, tmp_path, capsys):
    """`robust sft` (one LoRA step), `robust scpo` (one iteration, soft votes, one DPO step) and `robust evaluate`
    through the command line, and their input errors."""
    from resilibench.cli import main
    from resilibench.robust_train.clusters import write_clusters

    clusters = tmp_path / "clusters"
    write_clusters(clusters, [r.task for r in cluster_records], types=("paraphrase", "noise_heavy"))
    assert main(["robust", "sft", str(sft_generator), "--clusters", str(clusters), "--output-dir",
                 str(tmp_path / "sft"), "--max-steps", "1", "--lora-r", "4", "--batch-size", "4"]) == 0
    adapter = json.loads((tmp_path / "sft" / "train" / "final" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and (tmp_path / "sft" / "model" / "config.json").exists()
    # The finished directory again, with another base model, other clusters and --epochs 5: refused, not reused.
    other = tmp_path / "other-clusters"
    write_clusters(other, [r.task for r in cluster_records[:2]], types=("paraphrase",))
    model_bytes = (tmp_path / "sft" / "model" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["robust", "sft", str(tmp_path / "sft" / "model"), "--clusters", str(other), "--output-dir",
                 str(tmp_path / "sft"), "--epochs", "5", "--lora-r", "4", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the "SFT on ..." line
    assert err.startswith("resilibench: error: robust sft: ") and f"{tmp_path / 'sft'}: stage.json was produced with a different config" in err
    assert all(change in err for change in ("model_sha256: ", "clusters_sha256: ", "settings.epochs: 3.0 -> 5.0"))
    assert (tmp_path / "sft" / "model" / "model.safetensors").read_bytes() == model_bytes
    assert main(["robust", "scpo", str(sft_generator), "--clusters", str(clusters), "--output-dir",
                 str(tmp_path / "scpo"), "--candidates", "3", "--vote", "soft", "--temperature", "0.7", "--max-new-tokens", "48",
                 "--max-steps", "1", "--batch-size", "2", "--gradient-accumulation-steps", "1"]) == 0
    state = json.loads((tmp_path / "scpo" / "state.json").read_text())
    assert state["iterations"][0]["model"].endswith("iter_01/model")
    capsys.readouterr()
    assert main(["robust", "evaluate", str(sft_generator), str(tmp_path / "scpo" / "iter_01" / "model"),
                 "--name", "sft", "--name", "scpo", "--clusters", str(clusters), "--output-dir",
                 str(tmp_path / "eval"), "--max-new-tokens", "48", "--baselines", str(clusters)]) == 0
    out = capsys.readouterr().out
    assert "sft node" in out and "scpo exec" in out and "noise_heavy" in out
    assert "bow exec" in out and "search exec_ratio" in out and "scpo exec_ratio" in out  # the baselines beside
    baselines = json.loads((tmp_path / "eval" / "baselines.json").read_text())
    assert list(baselines["tables"]) == ["names", "lookup", "bow", "search"] and baselines["train_clusters"] == str(clusters)
    assert main(["robust", "sft", str(tmp_path / "nowhere"), "--clusters", str(clusters), "--output-dir",
                 str(tmp_path / "x")]) == 2
    assert "not a directory holding a transformers model" in capsys.readouterr().err
    assert main(["robust", "evaluate", str(sft_generator), "--clusters", str(tmp_path / "none"),
                 "--output-dir", str(tmp_path / "x")]) == 2
    assert "--clusters" in capsys.readouterr().err
    assert main(["robust", "evaluate", str(sft_generator), "--clusters", str(clusters), "--baselines",
                 str(tmp_path / "none"), "--output-dir", str(tmp_path / "x")]) == 2
    assert "--baselines" in capsys.readouterr().err and not (tmp_path / "x").exists()  # refused before any work
    assert main(["robust", "evaluate", str(sft_generator), "--clusters", str(clusters), "--search-hits", "2",
                 "--search-retriever", str(tmp_path / "none"), "--output-dir", str(tmp_path / "x")]) == 2
    assert "--search-retriever" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_demo_runs_every_stage_small_and_resumes(tmp_path, torch_one_thread):  # noqa: F811
    """The demo's orchestration at toy sizes: datasets, scratch model, base, SFT, one ScPO iteration, a
    table per stage; a rerun finds everything done."""
    from resilibench.robust_train.pipeline import run_demo

    settings = toy_demo_settings().with_max_length(192)
    logs: list[str] = []
    tables = run_demo(tmp_path, settings, progress=False, log=logs.append)
    assert any(line.startswith("warning: ") and "longer than max_length (192 tokens)" in line for line in logs)
    assert list(tables) == ["names", "lookup", "bow", "search", "base", "sft", "scpo1"]
    assert all(row["valid"] == 0.0 for row in tables["names"].rows.values())  # v1 text names no tool
    assert all(set(t.rows) == {"original", "paraphrase", "requirements", "noise_light", "noise_moderate",
                               "noise_heavy"} and t.counts["original"] == 2 for t in tables.values())
    table_text = (tmp_path / "table.txt").read_text()
    assert "scpo1 node" in table_text and "noise_heavy" in table_text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tables"]["sft"] == tables["sft"].to_dict() and report["settings"]["answer"] == "names"
    assert report["summary"]["final"] == "scpo1" and set(report["summary"]["noise_exec"]) == set(tables)
    assert report["search_method"] in ("semantic", "lexical")
    assert "mean exec under noise (95% interval over clusters)" in table_text
    # SFT rehearses the base's tasks beside the train clusters: each task's original and one perturbed
    # variant, the type cycling through the five.
    from resilibench.robust_train.clusters import clusters_digest
    from resilibench.robust_train.instructions import PERTURBATION_TYPES
    from resilibench.robust_train.pipeline import demo_clusters

    train, _, pretrain, rehearsal, fresh = demo_clusters(tmp_path, settings)
    assert [r.cluster_id for r in rehearsal] == [r.cluster_id for r in pretrain]
    assert [[v.perturbation for v in r.variants] for r in rehearsal] == [["original", kind] for kind in PERTURBATION_TYPES]
    sft_inputs = json.loads((tmp_path / "sft" / "stage.json").read_text())["config"]
    assert sft_inputs["clusters_sha256"] == clusters_digest(train + rehearsal) != clusters_digest(train)
    # ScPO learns from the clusters of train tasks that neither the base nor SFT saw, every variant each.
    seen = {r.cluster_id for r in train + pretrain}
    assert len(fresh) == 3 and not seen & {r.cluster_id for r in fresh}
    assert all(len(r.variants) == 1 + len(PERTURBATION_TYPES) for r in fresh)
    scpo_meta = json.loads((tmp_path / "scpo" / "meta.json").read_text())["config"]
    assert scpo_meta["clusters"] == [r.cluster_id for r in fresh]
    logs.clear()
    assert run_demo(tmp_path, settings, progress=False, log=logs.append) == tables
    assert not any(line.startswith("iteration") for line in logs)  # nothing was sampled again
    # Rerun with another number of pretraining tasks: refused with the change before anything runs; the
    # models and meta.json stay as they were.
    from dataclasses import replace

    base = (tmp_path / "base" / "model" / "model.safetensors").read_bytes()
    meta = (tmp_path / "meta.json").read_text()
    with pytest.raises(ValueError, match=r"stage.json was produced with a different config \(demo.pretrain_tasks: 5 -> 4\)"):
        run_demo(tmp_path, replace(settings, pretrain_tasks=4), progress=False, log=logs.append)
    assert (tmp_path / "base" / "model" / "model.safetensors").read_bytes() == base
    assert (tmp_path / "meta.json").read_text() == meta
    # A stage on its own refuses too: the base stage with the first 4 pretraining clusters only.
    from resilibench.robust_train.clusters import load_clusters
    from resilibench.robust_train.pipeline import run_sft

    fewer = load_clusters(tmp_path / "clusters" / "pretrain")[:4]
    with pytest.raises(ValueError, match="stage.json was produced with a different config .*clusters_sha256"):
        run_sft(tmp_path / "scratch", fewer, tmp_path / "base", settings.pretrain, GeneratorFormat(answer="names"),
                originals_only=True, progress=False)


def test_search_hits_reach_every_stage_s_prompts_and_the_records(cluster_records):
    """With search hits the tokenizer's corpus and the SFT rows hold the hits line (alone with
    search_hits_only); the demo's settings record them only when set, so earlier runs' records still match."""
    from resilibench.robust_train.pipeline import DemoSettings, generator_corpus, sft_rows

    records = cluster_records[:2]
    texts = [v.text for r in records for v in r.variants]
    for fmt in (GeneratorFormat(answer="names", search_hits=2),
                GeneratorFormat(answer="names", search_hits=2, search_hits_only=True)):
        users = [row["prompt"][1]["content"] for row in sft_rows(records, fmt)]
        assert users == [fmt.user(t) for t in texts] and all("Search hits: " in u for u in users)
        assert (users[0].startswith(texts[0])) != fmt.search_hits_only
        assert set(users) <= set(generator_corpus(records, fmt))
    assert "search_hits" not in DemoSettings().to_dict()
    assert DemoSettings(search_hits=3, search_hits_only=True).to_dict()["search_hits_only"] is True
    assert "search_scores" not in DemoSettings(search_hits=3).to_dict()
    assert DemoSettings(search_hits=3, search_scores=True).to_dict()["search_scores"] is True
    by_clause = GeneratorFormat(answer="names", search_hits=2, search_hits_by_clause=True, clause_dropout=0.5)
    users = [row["prompt"][1]["content"] for row in sft_rows(records, by_clause)]
    assert users == [by_clause.user(t, training=True) for t in texts] != [by_clause.user(t) for t in texts]
    assert "search_hits_by_clause" not in DemoSettings(search_hits=3).to_dict()
    assert DemoSettings(search_hits=3, search_hits_by_clause=True, clause_dropout=0.5).to_dict()["clause_dropout"] == 0.5


def test_rows_too_long_counts_the_rows_the_trainer_cuts_and_every_stage_takes_the_max_length(cluster_records,
                                                                                            sft_generator):
    from transformers import AutoTokenizer

    from resilibench.robust_train.pipeline import DemoSettings, rows_too_long, sft_rows

    rows = sft_rows(cluster_records, GeneratorFormat())
    tokenizer = AutoTokenizer.from_pretrained(sft_generator)
    lengths = sorted(len(tokenizer(tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False))
                         ["input_ids"]) for r in rows)
    assert rows_too_long(sft_generator, rows, lengths[-1]) == 0 and rows_too_long(sft_generator, rows, 1) == len(rows)
    middle = lengths[len(lengths) // 2]
    assert rows_too_long(sft_generator, rows, middle) == sum(n > middle for n in lengths) > 0
    settings = DemoSettings().with_max_length(384)
    assert settings.pretrain.max_length == settings.sft.max_length == settings.scpo.preference.max_length == 384
    assert settings.sft.epochs == DemoSettings().sft.epochs and settings.to_dict() != DemoSettings().to_dict()


def test_robust_commands_set_torch_threads_before_work(cluster_records, tmp_path):
    """One torch thread by default (as PPO), --torch-threads N otherwise, applied by every training command."""
    torch = pytest.importorskip("torch")
    from resilibench.cli import main
    from resilibench.robust_train.clusters import write_clusters

    clusters = tmp_path / "clusters"
    write_clusters(clusters, [r.task for r in cluster_records], types=("paraphrase",))
    args = ["robust", "scratch", "--clusters", str(clusters), "--hidden-size", "16", "--num-layers", "1",
            "--num-heads", "2", "--vocab-size", "300"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main([*args, "--output-dir", str(tmp_path / "a")]) == 0
        assert torch.get_num_threads() == 1
        assert main([*args, "--output-dir", str(tmp_path / "b"), "--torch-threads", "2"]) == 0
        assert torch.get_num_threads() == 2
        assert main([*args, "--output-dir", str(tmp_path / "c"), "--torch-threads", "0"]) == 2
    finally:
        torch.set_num_threads(before)


def test_demo_refuses_more_train_tasks_than_the_split_has(tmp_path):
    """The base's tasks and ScPO's fresh ones come from the train split, one after the other: asking for
    more than it holds is refused with the field named, before any cluster is written."""
    from resilibench.errors import ConfigError
    from resilibench.robust_train.pipeline import DemoSettings, demo_clusters, run_demo

    message = r"pretrain_tasks \+ scpo_clusters must be at most the 3528 train tasks, got 3000 \+ 800"
    with pytest.raises(ConfigError, match=message):
        demo_clusters(tmp_path, DemoSettings(pretrain_tasks=3000))
    with pytest.raises(ConfigError, match=message):
        run_demo(tmp_path, DemoSettings(pretrain_tasks=3000), progress=False, log=lambda line: None)
    assert list(tmp_path.iterdir()) == []  # nothing recorded: the corrected command is not refused
