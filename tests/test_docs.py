"""The README's table of recipe keys is the schema's: every leaf field, its default and description.

The own-data example: the README's "Train on your own data" example, run as written: its files in a folder, the commands
from another directory (only the model and the sizes are overridden to fit CI)."""

import re
import json
import os
import subprocess
import sys

import pytest
import yaml

from grpo_cli.recipe.schema import key_table, schema_keys

from helpers import ROOT

REGENERATE = 'python -c "from grpo_cli.recipe.schema import key_table; print(key_table())"'


def readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("<!-- recipe-keys:start -->\n", 1)[1].split("\n<!-- recipe-keys:end -->", 1)[0].strip()


def test_readme_key_table_matches_the_schema():
    documented = re.findall(r"^\| `([^`]+)` \|", readme_table(), re.M)
    keys = [k for k, _ in schema_keys()]
    assert not set(keys) - set(documented), f"undocumented recipe keys {sorted(set(keys) - set(documented))}; {REGENERATE}"
    assert not set(documented) - set(keys), f"stale keys in README {sorted(set(documented) - set(keys))}; {REGENERATE}"
    assert readme_table() == key_table(), f"defaults or descriptions differ from the schema; {REGENERATE}"


def test_the_table_lists_the_keys_the_issue_found_missing():
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme_table(), re.M))
    assert {"model.lora.r", "model.lora.target_modules", "model.load_in_4bit", "rollout.vllm.mode",
            "rollout.vllm.server_url", "rollout.importance_sampling", "rollout.importance_sampling_cap",
            "eval.files", "rewards[].on_error"} <= documented
    assert len(documented) == len(schema_keys()) > 90


SECTION = (ROOT / "README.md").read_text().split("### Train on your own data", 1)[1].split("\n### ", 1)[0]
# a file of the example: "`my-project/NAME` ...:" followed by a fenced block
FILES = dict(re.findall(r"`my-project/([\w.]+)`[^\n]*:\n```\w*\n(.*?)```", SECTION, re.S))
SMALL = ["model.name_or_path=builtin:tiny-qwen2", "algorithm.num_generations=2", "train.prompts_per_step=2",
         "train.micro_batch_size=4", "train.max_steps=2", "rollout.max_completion_length=8", "eval.limit=2",
         "train.threads=1"]


def grpo(*args: str, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


@pytest.fixture
def project(tmp_path):
    assert set(FILES) == {"problems.jsonl", "held_out.jsonl", "my_rewards.py", "recipe.yaml"}, FILES.keys()
    folder = tmp_path / "my-project"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "GRPO_CACHE_DIR": str(tmp_path.parent / "grpo-cache"), "HF_HUB_OFFLINE": "1"}
    return folder, elsewhere, env


@pytest.mark.slow
def test_readme_example_validates_trains_and_evaluates_from_another_directory(project):
    folder, elsewhere, env = project
    recipe = str(folder / "recipe.yaml")
    p = grpo("validate", recipe, cwd=elsewhere, env=env)
    assert p.returncode == 0 and ": ok (my-first-run" in p.stdout, p.stderr
    p = grpo("train", recipe, *SMALL, "-o", "runs/my-first-run", cwd=elsewhere, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    run = elsewhere / "runs/my-first-run"  # output_dir is relative to the working directory
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved["data"]["files"] == [str(folder / "problems.jsonl")]  # absolute: the saved recipe works anywhere
    assert saved["eval"]["files"] == [str(folder / "held_out.jsonl")]
    assert saved["rewards"][1]["name"] == f"{folder / 'my_rewards.py'}:brevity"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward" in m] == [1, 2]
    assert all(m["rewards/brevity/mean"] < 0 for m in metrics if "reward" in m)  # the user's function ran
    assert any("eval/accuracy" in m for m in metrics) and "not held out" not in p.stderr  # held_out.jsonl, at the end
    # `grpo eval` of the run from a third directory, the held-out file named relative to it
    third = elsewhere / "third"
    third.mkdir()
    p = grpo("eval", str(run), "--file", "../../my-project/held_out.jsonl", "--max-new-tokens", "4", "-o", "ev",
             cwd=third, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((third / "ev/eval.json").read_text())
    assert report["settings"]["eval_data"] == {"source": str(folder / "held_out.jsonl"), "held_out": True}
    assert report["settings"]["problems"] == 2 and "not held out" not in p.stdout


def test_readme_example_typo_exits_2_before_loading_a_model(project):
    folder, elsewhere, env = project
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("answer_column: solution", "answer_column: solutoin"))
    for command in ("validate", "train"):
        p = grpo(command, str(recipe), *SMALL, cwd=elsewhere, env=env)
        assert p.returncode == 2, (command, p.stderr)
        assert "data.answer_column 'solutoin' (did you mean 'solution'?) is not a column of data.files" in p.stderr
        assert "columns: question, solution" in p.stderr and "Traceback" not in p.stderr
    assert not (elsewhere / "runs").exists()  # train stopped before making a run folder
