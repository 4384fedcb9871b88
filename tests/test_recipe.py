"""Every shipped recipe validates; bad recipes name the field, exit 2, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.recipe import Recipe, RecipeError, load_recipe, recipe_to_yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_recipes_exist():
    names = {p.name for p in RECIPES}
    assert {"quickstart.yaml", "gsm8k.yaml", "ci-tiny.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # reward files are named relative to the repo root
    r = load_recipe(path)
    assert isinstance(r, Recipe)
    # the resolved YAML loads back to the same recipe (what runs and checkpoints save)
    saved = path.parent / f".roundtrip-{path.name}"
    try:
        saved.write_text(recipe_to_yaml(r))
        assert load_recipe(saved) == r
    finally:
        saved.unlink()


def test_overrides_and_defaults():
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["algorithm.beta=0.04", "train.max_steps=7", "algorithm.epsilon_high=0.3"])
    assert (r.algorithm.beta, r.train.max_steps, r.algorithm.epsilon_high_value) == (0.04, 7, 0.3)
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["algorithm.epsilon_high=null"])
    assert r.algorithm.epsilon_high_value == r.algorithm.epsilon == 0.2  # defaults to epsilon
    assert r.generation_batch_size == r.train.prompts_per_step * r.algorithm.num_generations


BAD = [
    # (overrides, text that must appear in the message)
    (["algorithm.num_generation=4"], "algorithm.num_generation: unknown field"),
    (["algorithm.num_generations=1"], "algorithm.num_generations"),
    (["algorithm.beta=abc"], "algorithm.beta"),
    (["algorithm.epsilon=-0.1"], "algorithm.epsilon"),
    (["algorithm.epsilon=0.3", "algorithm.epsilon_high=0.2"], "epsilon_high (0.2) must be >= algorithm.epsilon (0.3)"),
    (["algorithm.delta=1.1"], "algorithm.delta (1.1) must be > 1 + epsilon_high"),
    (["algorithm.loss_type=ppo"], "algorithm.loss_type"),
    (["algorithm.scale_rewards=std"], "algorithm.scale_rewards"),
    (["train.micro_batch_size=3"], "train.micro_batch_size (3) must divide"),
    (["train.max_steps=0"], "train.max_steps"),
    (["rollout.backend=tgi"], "rollout.backend"),
    (["rollout.temperature=0"], "rollout.temperature"),
    (["rewards.0.name=acuracy"], "rewards.0.name"),
    (["rewards.0.name=no_such_module_xyz:fn"], "rewards.0.name"),
    (["rewards.0.on_error=ignore"], "rewards.0.on_error"),
    (["data.generator=nope"], "data.generator"),
    (["data.files=[a.jsonl]"], "set exactly one of data.dataset, data.files, data.generator"),
    (["model.trust_remote_code=maybe"], "model.trust_remote_code"),
    (["checkpoint.keep_last=0"], "checkpoint.keep_last"),
]


@pytest.mark.parametrize("overrides,expected", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_overrides_name_the_field(overrides, expected, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(RecipeError) as e:
        load_recipe(ROOT / "recipes/ci-tiny.yaml", overrides)
    assert expected in str(e.value)


def test_unknown_reward_lists_builtins(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(RecipeError) as e:
        load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rewards.0.name=acuracy"])
    assert "accuracy" in str(e.value) and "module:function" in str(e.value)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: x\nmodel: [unclosed\n", "not valid YAML"),
        ("!!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
        ("- just\n- a list\n", "a recipe is a YAML mapping"),
        ("name: x\n", "model: required field is missing"),
    ],
)
def test_bad_files(tmp_path, text, expected):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert expected in str(e.value)


def test_cli_bad_recipes_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "recipes/ci-tiny.yaml").read_text().replace("num_generations: 4", "num_generatoins: 4"))
    cases = [
        ["validate", str(bad)],
        ["train", str(ROOT / "recipes/ci-tiny.yaml"), "algorithm.loss_type=ppo"],
        ["print-recipe", str(ROOT / "recipes/ci-tiny.yaml"), "algorithm.beta=-1"],
        ["validate", str(tmp_path / "missing.yaml")],
    ]
    expected = ["algorithm.num_generatoins", "algorithm.loss_type", "algorithm.beta", "recipe file not found"]
    for args, want in zip(cases, expected):
        p = subprocess.run([sys.executable, "-m", "grpo_cli", *args], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2, (args, p.stderr)
        assert want in p.stderr and "Traceback" not in p.stderr, p.stderr
