"""Every shipped recipe validates; bad recipes name the field, exit 2, no traceback."""

import os
from pathlib import Path

import pytest

from grpo_cli.errors import RecipeError
from grpo_cli.preflight import resolve
from grpo_cli.recipe.files import load_recipe, recipe_to_yaml
from grpo_cli.recipe.schema import Recipe

from helpers import cli

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_recipes_exist():
    names = {p.name for p in RECIPES}
    assert {"quickstart.yaml", "gsm8k.yaml", "ci-tiny.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # reward files are named relative to the recipe: any working directory works
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
    (["algorithm.advantage_estimator=remax"], "algorithm.advantage_estimator"),
    (["algorithm.advantage_estimator=reinforce_plus_plus_baseline"],
     "algorithm.scale_rewards (group): advantage_estimator reinforce_plus_plus_baseline normalises over the batch"),
    (["algorithm.advantage_estimator=rloo", "algorithm.multi_objective_aggregation=normalize_then_sum"],
     "normalize_then_sum is GDPO's per-function normalisation"),
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
        resolve(load_recipe(ROOT / "recipes/ci-tiny.yaml", overrides))
    assert expected in str(e.value)


def test_unknown_reward_lists_builtins(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(RecipeError) as e:
        resolve(load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rewards.0.name=acuracy"]))
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
        p = cli(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert want in p.stderr and "Traceback" not in p.stderr, p.stderr


# ----- paths: relative to the recipe file, overrides relative to the working directory -----
def _project(tmp_path):
    """A recipe next to its data, reward file and a local model folder (as a user keeps them)."""
    folder = tmp_path / "proj"
    (folder / "rewards").mkdir(parents=True)
    (folder / "models/tiny").mkdir(parents=True)
    (folder / "problems.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    (folder / "rewards/mine.py").write_text("def one(completions, **kw):\n    return [1.0] * len(completions)\n")
    text = (ROOT / "recipes/ci-tiny.yaml").read_text()
    text = text.replace("generator: arithmetic", "files: problems.jsonl").replace("  generator_kwargs: {size: 256, min_value: 0, max_value: 20}\n", "")
    text = text.replace("rewards/toy.py:digit_fraction", "rewards/mine.py:one")
    (folder / "recipe.yaml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return folder, elsewhere


def test_data_files_takes_one_path_or_a_list(tmp_path, monkeypatch):
    folder, elsewhere = _project(tmp_path)
    monkeypatch.chdir(elsewhere)
    r = load_recipe(folder / "recipe.yaml")  # `files: problems.jsonl`, a string
    assert r.data.files == [str(folder / "problems.jsonl")]
    r = load_recipe(folder / "recipe.yaml", ["data.files=[problems.jsonl, ../proj/problems.jsonl]"])
    assert r.data.files == [str(elsewhere / "problems.jsonl"), str(folder / "problems.jsonl")]  # overrides: cwd


def test_relative_paths_start_at_the_recipe_folder_and_are_saved_absolute(tmp_path, monkeypatch):
    folder, elsewhere = _project(tmp_path)
    monkeypatch.chdir(elsewhere)
    r = load_recipe(folder / "recipe.yaml", ["eval={files: held.jsonl}", "logging.output_dir=out"])
    assert r.data.files == [str(folder / "problems.jsonl")]
    assert r.rewards[1].name == f"{folder}/rewards/mine.py:one" and r.rewards[0].name == "accuracy"
    assert r.eval.files == [str(elsewhere / "held.jsonl")]  # given as an override: the working directory
    assert r.logging.output_dir == "out" and r.model.name_or_path == "builtin:tiny-qwen2"
    # the resolved recipe (saved with runs and checkpoints) loads back the same from anywhere
    saved = tmp_path / "saved/recipe.yaml"
    saved.parent.mkdir()
    saved.write_text(recipe_to_yaml(r))
    monkeypatch.chdir(tmp_path)
    assert load_recipe(saved) == r
    # a recipe file naming a reward by `./` path and a model folder next to it; hub ids and module:function stay
    text = (folder / "recipe.yaml").read_text().replace("builtin:tiny-qwen2", "./models/tiny")
    (folder / "recipe.yaml").write_text(text.replace("rewards/mine.py:one", "./rewards/mine.py:one"))
    r = load_recipe(folder / "recipe.yaml", ["eval={dataset: models}"])
    assert r.model.name_or_path == str(folder / "models/tiny") and r.rewards[1].name == f"{folder}/rewards/mine.py:one"
    assert r.eval.dataset == "models"  # an override: proj/models does not count, and cwd has none (a hub name)
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "models/tiny"):  # models/tiny exists under proj/, not under cwd
        r = load_recipe(folder / "recipe.yaml", [f"model.name_or_path={name}", "rewards.1.name=json:dumps"])
        assert r.model.name_or_path == name and r.rewards[1].name == "json:dumps"


def test_cispo_refuses_an_epsilon_high_below_one(monkeypatch):
    monkeypatch.chdir(ROOT)
    # ci-tiny sets epsilon_high: 0.28 (DAPO clip-higher); for cispo that caps every weight at 0.28
    with pytest.raises(RecipeError, match=r"epsilon_high \(0.28\) is below 1: for loss_type cispo it is the cap on the "
                       r"importance weight itself.*usually 5.0"):
        load_recipe(ROOT / "recipes/ci-tiny.yaml", ["algorithm.loss_type=cispo"])
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["algorithm.loss_type=cispo", "algorithm.epsilon_high=null"])
    assert r.algorithm.epsilon_high_value == 5.0  # unset: TRL's suggested cap, not epsilon (0.2)
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["algorithm.loss_type=cispo", "algorithm.epsilon_high=1.0"])
    assert r.algorithm.epsilon_high_value == 1.0


@pytest.mark.parametrize("override,field,expected", [
    ("data.template={prompt} Answer with a number.", "template", "{prompt} Answer with a number."),
    ("data.template={prompt}", "template", "{prompt}"),  # a lone placeholder, not a mapping {prompt: null}
    ("data.template=Q: {prompt} A:", "template", "Q: {prompt} A:"),
    ("data.system_prompt=Be brief: answer [only] with a number", "system_prompt", "Be brief: answer [only] with a number"),
    ("data.limit=7", "limit", 7),  # valid YAML keeps its type
    ("data.system_prompt=null", "system_prompt", None),
])
def test_overrides_that_are_not_yaml_are_plain_text(override, field, expected, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", [override])
    assert getattr(r.data, field) == expected
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rewards.0.kwargs={mode: boxed}"])
    assert r.rewards[0].kwargs == {"mode": "boxed"}  # a flow mapping with a colon stays a mapping


def test_resolve_paths_rules(tmp_path, monkeypatch):
    from grpo_cli.recipe.files import resolve_paths

    recipe_dir, cwd = tmp_path / "recipe", tmp_path / "cwd"
    (recipe_dir / "rm").mkdir(parents=True)
    (recipe_dir / "ds").mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    raw = {
        "model": {"name_or_path": "org/model"},  # a hub id: nothing of that name next to the recipe
        "data": {"files": "a.jsonl", "dataset": "ds"},
        "eval": {"files": ["~/x.jsonl", "/abs/y.jsonl"], "dataset": "org/ds"},
        "rewards": [{"name": "model:rm"}, {"name": "model:org/rm"}, {"name": "model:./other"}, {"name": "pkg.mod:fn"},
                    {"name": "accuracy"}, {"name": "sub/f.py:g"}, {"name": "f.py:g"}],
        "logging": {"output_dir": "runs/x"},
    }
    out = resolve_paths(raw, recipe_dir, overridden=["rewards.6", "eval.dataset"])
    assert out["model"]["name_or_path"] == "org/model"
    assert out["data"] == {"files": [f"{recipe_dir}/a.jsonl"], "dataset": f"{recipe_dir}/ds"}
    assert out["eval"] == {"files": [os.path.expanduser("~/x.jsonl"), "/abs/y.jsonl"], "dataset": "org/ds"}
    assert [r["name"] for r in out["rewards"]] == [
        f"model:{recipe_dir}/rm", "model:org/rm", f"model:{recipe_dir}/other", "pkg.mod:fn", "accuracy",
        f"{recipe_dir}/sub/f.py:g", f"{cwd}/f.py:g"]  # rewards.6 came from an override: the working directory
    assert out["logging"]["output_dir"] == "runs/x"


def test_validation_imports_no_named_code_and_resolve_names_the_field(tmp_path, monkeypatch):
    """Issue 36: validating a recipe resolved user code (rewards, tools, environments, generators), so a saved recipe
    whose reward no other process has could not even be read (an export needs no reward). The schema checks names;
    grpo_cli.preflight.resolve imports them, once, and names the field."""
    import sys

    monkeypatch.chdir(ROOT)
    mine = tmp_path / "mine_rewards_xyz.py"
    mine.write_text("import sys\nsys.modules[__name__].IMPORTED = True\ndef good(completions, **_):\n"
                    "    return [1.0] * len(completions)\n")
    names = {"rewards=[{name: python:not_in_this_process}]": "rewards.0.name: reward 'python:not_in_this_process'",
             f"rewards=[{{name: {mine}:missing}}]": "rewards.0.name:",
             "rewards=[{name: no_such_module_xyz:fn}]": "rewards.0.name:",
             "rollout.tools=[no_such_module_xyz:add]": "rollout.tools.0:",
             "rollout.environment=no_such_module_xyz:Env": "rollout.environment:",
             "data.generator=nope": "data.generator 'nope' is unknown"}
    for override, field in names.items():
        extra = ["rollout.max_turns=2"] if "rollout." in override else []
        r = load_recipe(ROOT / "recipes/ci-tiny.yaml", [override, *extra])  # valid as a schema
        with pytest.raises(RecipeError) as e:
            resolve(r)
        assert str(e.value).startswith("invalid recipe:\n  " + field), str(e.value)
    before = set(sys.modules)
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", [f"rewards=[{{name: {mine}:good}}]"])
    assert not any("mine_rewards_xyz" in m for m in set(sys.modules) - before)  # nothing imported
    resolved = resolve(r)
    assert resolved.recipe is r and resolved.rewards[0](completions=["a", "b"]) == [1.0, 1.0]


def test_resolve_for_another_machine_lists_the_users_rewards_it_cannot_import(monkeypatch):
    """`grpo convert-trl` writes a recipe for the machine that has the user's reward module: resolve(elsewhere=True)
    lists such a reward instead of refusing it (it resolved each reward twice before, once to find these); anything
    else still fails: a built-in's bad kwargs, a tool that does not import."""
    monkeypatch.chdir(ROOT)
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rewards=[{name: accuracy}, {name: no_such_module_xyz:fn}]"])
    resolved = resolve(r, elsewhere=True)
    assert resolved.rewards[1] is None and callable(resolved.rewards[0])
    assert list(resolved.unresolved) == [1] and resolved.unresolved[1].startswith("rewards.1.name: ")
    assert "no_such_module_xyz" in resolved.unresolved[1]
    with pytest.raises(RecipeError, match="rewards.1.name"):
        resolve(r)
    bad = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rewards=[{name: accuracy, kwargs: {mode: boxd}}, "
                                                      "{name: no_such_module_xyz:fn}]"])
    with pytest.raises(RecipeError, match="rewards.0.kwargs.mode"):
        resolve(bad, elsewhere=True)
    tools = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.tools=[no_such_module_xyz:add]", "rollout.max_turns=2"])
    with pytest.raises(RecipeError, match="rollout.tools.0"):
        resolve(tools, elsewhere=True)


def test_a_backend_is_one_entry_whose_words_the_schema_and_eval_read(monkeypatch):
    """Issue 36: backends were named in two tables and three vocabularies. Each BACKENDS entry says the rollout.backend
    (and rollout.vllm.mode) that select it: the schema's choices, the entry a recipe gets and `grpo eval --backend`'s
    choices all come from the entries."""
    from grpo_cli.recipe.backends import BACKENDS, EVAL_BACKENDS, backend_name, for_eval
    from grpo_cli.recipe.rollout import RolloutConfig, VLLMConfig

    monkeypatch.chdir(ROOT)
    words = {name: (BACKENDS[name].backend, BACKENDS[name].mode) for name in BACKENDS}
    assert len(set(words.values())) == len(words) == 3
    assert set(RolloutConfig.model_fields["backend"].annotation.__args__) == {b for b, _ in words.values()}
    assert set(VLLMConfig.model_fields["mode"].annotation.__args__) == {m for _, m in words.values() if m}
    for name, (backend, mode) in words.items():
        r = load_recipe(ROOT / "recipes/ci-tiny.yaml", [f"rollout.backend={backend}"]
                        + ([f"rollout.vllm.mode={mode}"] if mode else []))
        assert backend_name(r.rollout) == name
    server = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.backend=vllm", "rollout.vllm.mode=server"])
    assert EVAL_BACKENDS == {"hf": "hf", "vllm": "vllm-colocate"}  # an eval samples in its own process
    assert backend_name(for_eval(server.rollout, "vllm")) == "vllm-colocate"
    assert backend_name(for_eval(server.rollout, "hf")) == "hf"
    with pytest.raises(ValueError, match=r"--backend 'sglang' is not available; valid: hf, vllm"):
        for_eval(server.rollout, "sglang")
