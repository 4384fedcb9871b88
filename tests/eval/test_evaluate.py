"""`grpo eval`: pass@k / maj@k against hand-computed cases, and real runs of the command."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from grpo_cli.eval.metrics import k_values, majority_answer, normalize_answer, pass_at_k, summarize
from grpo_cli.eval.targets import resolve_target

from helpers import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (4, 1, 1, 0.25),  # c / n
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (4, 2, 2, 1 - 1 / 6),  # 1 - C(2,2)/C(4,2)
        (4, 3, 2, 1.0),  # n - c = 1 < k: every pair holds a correct one
        (4, 0, 4, 0.0),
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_combinatorial_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                ref = 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(ref, abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_majority_vote_and_normalisation():
    assert normalize_answer(" 1,000. ") == "1000" and normalize_answer("7.0") == "7" and normalize_answer("x+1") == "x+1"
    assert majority_answer(["7", "7.0", "8", None]) == "7"  # 7 and 7.0 are one vote
    assert majority_answer(["8", "7"]) == "8"  # tie: the first seen
    assert majority_answer([None, None]) is None
    assert k_values(1) == [1] and k_values(4) == [1, 2, 4] and k_values(6) == [1, 2, 4, 6]


def _rec(i, kind, correct, extracted, answer="5", length=3, truncated=False, sample=0):
    return {"index": i, "kind": kind, "sample": sample, "answer": answer, "extracted": extracted, "correct": correct,
            "rewards": {"accuracy": float(correct)} if kind == "greedy" else None, "length": length, "truncated": truncated}


def test_summarize_hand_computed():
    samples = [
        _rec(0, "greedy", True, "5", length=4), _rec(1, "greedy", False, None, length=8, truncated=True),
        # problem 0: samples 5, 5, 6, None -> c = 2 of n = 4; majority of all four "5" (correct)
        _rec(0, "sample", True, "5"), _rec(0, "sample", True, "5"), _rec(0, "sample", False, "6"), _rec(0, "sample", False, None),
        # problem 1: 6, 6, 5, 6 -> c = 1; majority "6" (wrong); first sample alone wrong
        _rec(1, "sample", False, "6"), _rec(1, "sample", False, "6"), _rec(1, "sample", True, "5"), _rec(1, "sample", False, "6"),
    ]
    m = summarize(samples, 4)
    assert m["accuracy"] == 0.5 and m["rewards/accuracy/mean"] == 0.5
    assert m["format_compliance"] == 0.5  # problem 1's greedy answer had nothing to extract
    assert m["completions/mean_length"] == 6.0 and m["completions/clipped_ratio"] == 0.5
    assert m["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert m["pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)  # 1 - C(2,2)/C(4,2), 1 - C(3,2)/C(4,2)
    assert m["pass@4"] == pytest.approx(1.0)
    assert m["maj@1"] == 0.5  # problem 0's first sample is right, problem 1's is not
    assert m["maj@2"] == 0.5 and m["maj@4"] == 0.5


def test_target_errors(tmp_path):
    with pytest.raises(ValueError, match="--recipe"):
        resolve_target("base", None)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_target(str(tmp_path), None)


@pytest.mark.slow
def test_eval_command_on_a_trained_run(tmp_path, monkeypatch):
    env = {**os.environ, "GRPO_CACHE_DIR": str(tmp_path / "cache")}
    run, out = tmp_path / "run", tmp_path / "eval"
    p = cli("train", str(TINY), "-o", str(run), "train.max_steps=2", env=env)
    assert p.returncode == 0, p.stderr
    p = cli("eval", "base", run, "--recipe", TINY, "--limit", "6", "-n", "3", "--max-new-tokens", "8", "-o", out, env=env)
    assert p.returncode == 0, p.stderr
    assert "1 CPU thread (train.threads: 1)" in p.stderr  # the recipe's train.threads (issue 22: it was ignored)
    # grpo eval's own process on a CPU keeps freed memory for reuse, as grpo train's does (train.keep_freed_memory)
    assert "\nfreed memory kept for reuse (train.keep_freed_memory)\n" in p.stderr
    # not a terminal: plain progress lines (issue 22: a log file stayed empty for 18 minutes), one per target here
    # each line names the model it measures (the two targets' lines read alike before)
    assert p.stderr.count("eval base: 6/6 problems, ") == 1, p.stderr
    assert p.stderr.count(f"eval {run}: 6/6 problems, ") == 1, p.stderr
    assert "greedy pass@1" in p.stdout and "pass@2" in p.stdout
    assert "(seed 1234) (seed 1234)" not in p.stdout and "generator arithmetic (seed 1234);" in p.stdout
    assert "not held out" in p.stdout  # ci-tiny has no eval set: its generator under eval.seed, said aloud
    report = json.loads((out / "eval.json").read_text())
    assert report["settings"]["eval_data"]["held_out"] is False
    assert [t["target"] for t in report["targets"]] == ["base", str(run)]
    assert report["settings"]["extraction"] == {"mode": "auto", "tag": "answer"}
    assert report["settings"]["problems"] == 6 and report["settings"]["max_new_tokens"] == 8
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 6 * (1 + 3)  # two targets, six problems, greedy + 3 samples
    for t in report["targets"]:
        mine = [s for s in samples if s["target"] == t["target"]]
        greedy = [s for s in mine if s["kind"] == "greedy"]
        assert t["metrics"]["accuracy"] == sum(s["correct"] for s in greedy) / 6
        assert t["metrics"]["completions/mean_length"] == sum(s["length"] for s in greedy) / 6
        assert all(s["length"] <= 8 for s in mine)
    # the two targets saw the same problems
    probs = {t["target"]: [s["answer"] for s in samples if s["target"] == t["target"] and s["kind"] == "greedy"]
             for t in report["targets"]}
    assert probs["base"] == probs[str(run)]
    # greedy decoding is deterministic: the base model's greedy completions equal a second eval's
    p = cli("eval", "base", "--recipe", TINY, "--limit", "6", "--max-new-tokens", "8", "-o", tmp_path / "again",
            "--threads", "auto", env=env)
    assert "CPU thread" in p.stderr and "(auto: " in p.stderr
    # without -o, a run's eval goes into the run folder, not the working directory (issue 22)
    p = cli("eval", str(run / "checkpoints/step-2"), "--limit", "2", "--max-new-tokens", "4", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    [written] = list((run / "eval").iterdir())
    assert (written / "eval.json").is_file() and f"wrote {written}/eval.json" in p.stdout
    assert not any(x.is_dir() for x in (tmp_path / "eval").iterdir())  # (tmp_path/eval is the -o of the first eval)
    again = [json.loads(line) for line in (tmp_path / "again/samples.jsonl").read_text().splitlines()]
    assert [s["completion"] for s in again] == [s["completion"] for s in samples if s["target"] == "base" and s["kind"] == "greedy"]


def test_format_compliance_is_told_apart_from_a_format_reward(tmp_path):
    # issue 35: `format_compliance 1` printed beside the user's format reward at 0, as if they measured one thing
    env = {**os.environ, "GRPO_CACHE_DIR": str(tmp_path / "cache")}
    recipe = tmp_path / "recipe.yaml"
    p = cli("print-recipe", str(TINY), "rewards=[{name: accuracy}, {name: format, weight: 0.2}]", env=env)
    assert p.returncode == 0, p.stderr
    recipe.write_text(p.stdout)
    p = cli("eval", "base", "--recipe", recipe, "--limit", "4", "--max-new-tokens", "6", "-o", tmp_path / "eval", env=env)
    assert p.returncode == 0, p.stderr
    assert "rewards/format/mean" in p.stdout and "format_compliance" in p.stdout
    assert ("format_compliance is the share of greedy completions with an answer the accuracy extraction (mode 'auto') "
            "finds; format is a reward with a format rule of its own: they measure different formats") in \
        " ".join(p.stdout.split())


def test_eval_set_is_held_out_or_says_it_is_not(tmp_path, monkeypatch):
    from grpo_cli.eval.evaluate import eval_data_config, eval_source
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.recipe.schema import EvalConfig

    monkeypatch.chdir(tmp_path)
    files = load_recipe(TINY, ["data.generator=null", "data.files=train.jsonl"])
    for recipe, cfg, source, held_out in [
        (files, EvalConfig(), str(tmp_path / "train.jsonl"), False),  # falls back to the training file
        (files, EvalConfig(files=[str(tmp_path / "test.jsonl")]), str(tmp_path / "test.jsonl"), True),
        (files, EvalConfig(dataset="org/ds", split="validation"), "org/ds::validation", True),
        (load_recipe(TINY), EvalConfig(seed=5), "generator arithmetic (seed 5)", False),
        (load_recipe(ROOT / "recipes/gsm8k.yaml"), EvalConfig(), "openai/gsm8k:main:test", True),
        (load_recipe(ROOT / "recipes/gsm8k.yaml"), EvalConfig(split="train"), "openai/gsm8k:main:train", False),
    ]:
        got = eval_source(recipe, cfg)
        assert (got["source"], got["held_out"]) == (source, held_out), (cfg, got)
        assert ("note" in got) == (not held_out)
    d = eval_data_config(files, EvalConfig(files=[str(tmp_path / "test.jsonl")], limit=7))
    assert (d.files, d.limit, d.shuffle, d.template) == ([str(tmp_path / "test.jsonl")], 7, False, files.data.template)
    assert eval_data_config(load_recipe(ROOT / "recipes/gsm8k.yaml"), EvalConfig(dataset="other/set")).config is None


def test_eval_leaves_the_training_rng_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    from grpo_cli.eval.evaluate import evaluate_model, load_problems
    from grpo_cli.models.loading import load_model, load_tokenizer
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.recipe.schema import EvalConfig

    r = load_recipe(TINY)
    tok, model = load_tokenizer(r.model), load_model(r.model)
    cfg = EvalConfig(limit=3, num_samples=2, max_new_tokens=4)
    torch.manual_seed(7)
    evaluate_model(model, tok, r, cfg, load_problems(r, cfg, tok))
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3))
