"""The README is a front door and the docs a site: the README's size and commands, the reference pages made from
the code (recipe keys, metrics, TRL fields, command line: none may drift), links between pages, the loop shown on
the home page, the flags the docs name, and the own-data example run as written."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_cli.recipe.schema import Recipe, key_table, schema_keys

from helpers import ROOT

DOCS = ROOT / "docs"
REGENERATE = "python docs/gen_reference.py"
PAGES = sorted(DOCS.rglob("*.md"))


def key_page_table() -> str:
    text = (DOCS / "reference/recipe-keys.md").read_text()
    return text[text.index("| key | default | what it is |"):].strip()


def test_the_reference_pages_are_the_codes():
    out = subprocess.run([sys.executable, "docs/gen_reference.py", "--check"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr


def test_key_table_matches_the_schema():
    documented = re.findall(r"^\| `([^`]+)` \|", key_page_table(), re.M)
    keys = [k for k, _ in schema_keys()]
    assert not set(keys) - set(documented), f"undocumented recipe keys {sorted(set(keys) - set(documented))}; {REGENERATE}"
    assert not set(documented) - set(keys), f"stale keys in the docs {sorted(set(documented) - set(keys))}; {REGENERATE}"
    assert key_page_table() == key_table(), f"defaults or descriptions differ from the schema; {REGENERATE}"


def test_the_table_lists_the_keys_the_issue_found_missing():
    documented = set(re.findall(r"^\| `([^`]+)` \|", key_page_table(), re.M))
    assert {"model.lora.r", "model.lora.target_modules", "model.load_in_4bit", "rollout.vllm.mode",
            "rollout.vllm.server_url", "rollout.importance_sampling", "rollout.importance_sampling_cap",
            "eval.files", "rewards[].on_error"} <= documented
    assert len(documented) == len(schema_keys()) > 90


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme
    for command in ("train", "validate", "print-recipe", "eval", "inspect-rollouts", "report", "export",
                    "convert-trl", "serve-vllm"):
        assert f"`grpo {command}" in readme, command
    # its example recipe is a valid one
    block = re.search(r"```yaml\n(.*?)```", readme, re.S).group(1)
    assert Recipe.model_validate(yaml.safe_load(block)).name == "my-run"
    # its Python example trains beside `make demo`'s run, not into it (issue 36's newcomer walk: it failed right after
    # the demo, the folder holding a run)
    python = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    recipe, out = re.search(r'grpo_cli\.train\("([^"]+)".*?output_dir="([^"]+)"', python, re.S).groups()
    demo = re.search(r"^demo:.*?grpo(?:_cli)? train (\S+)", (ROOT / "Makefile").read_text(), re.S | re.M)
    assert demo and demo.group(1) == recipe
    assert Path(out) != Path(yaml.safe_load((ROOT / recipe).read_text())["logging"]["output_dir"])


def test_every_page_is_in_the_nav_and_every_link_reaches_a_page_and_its_heading():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert str(page.relative_to(DOCS)) in nav, f"{page} is not in mkdocs.yml's nav"
    for page in [*PAGES, ROOT / "README.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.is_file(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
            if anchor:
                assert anchor in heading_anchors(dest), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def heading_anchors(page: Path) -> set[str]:
    """The anchors mkdocs gives a page's headings (lower case, punctuation dropped, spaces as dashes)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.strip().lower())) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_algorithms_page_has_a_row_for_every_loss_and_estimator_of_the_table():
    from grpo_cli.recipe.specs import ESTIMATORS, LOSSES

    page = (DOCS / "algorithms.md").read_text()
    for column, table in (("loss_type", LOSSES), ("advantage_estimator", ESTIMATORS)):
        rows = page[page.index(f"| `{column}` |"):].split("\n\n")[0].splitlines()[2:]
        assert [re.match(r"\| `(\w+)`", row).group(1) for row in rows] == list(table), column


def test_the_home_page_shows_the_engines_train_step_as_it_is():
    source = (ROOT / "grpo_cli/trainer/engine.py").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    step = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "train_step")
    code = "\n".join(line[4:] for line in source.splitlines()[step.lineno - 1: step.end_lineno])
    assert code in (DOCS / "index.md").read_text()


def test_every_grpo_flag_the_docs_name_exists():
    """`grpo COMMAND ... --flag` in a page, the README or a TRL field's note: the flag is one of COMMAND's options."""
    from grpo_cli.recipe.trl_homes import HOMES

    help_text = (DOCS / "reference/cli.md").read_text()
    options = {m.group(1): set(re.findall(r"(--[a-z][\w-]*)", m.group(2)))
               for m in re.finditer(r"## grpo (\S+)\n\n```text\n(.*?)```", help_text, re.S)}
    texts = [p.read_text() for p in [*PAGES, ROOT / "README.md"] if "reference" not in p.parts]
    texts += [note for _, note in HOMES.values()]
    found = 0
    for text in texts:
        for command, rest in re.findall(r"\bgrpo ([a-z-]+)\b([^\n`|]*)", text):
            if command not in options:
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                found += 1
                assert flag in options[command] | {"--help"}, f"`grpo {command} ... {flag}`: no such option"
    assert found > 20


SECTION = (ROOT / "docs/own-data.md").read_text()
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
    p = grpo("validate", recipe, SMALL[0], cwd=elsewhere, env=env)
    assert p.returncode == 0 and ": ok (my-first-run" in p.stdout, p.stderr
    # as written, offline (HF_HUB_OFFLINE=1 here), the README's hub model is named: it is not in the cache
    p = grpo("validate", recipe, cwd=elsewhere, env={**env, "HF_HOME": str(elsewhere / "empty-hf-cache")})
    assert p.returncode == 2 and "model.name_or_path: 'Qwen/Qwen2.5-0.5B-Instruct' is not in the local hub cache" \
        in p.stderr, p.stderr
    p = grpo("train", recipe, *SMALL, "-o", "runs/my-first-run", cwd=elsewhere, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Generating train split" not in p.stderr  # issue 22: datasets' bars leaked into the training log
    run = elsewhere / "runs/my-first-run"  # output_dir is relative to the working directory
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved["data"]["files"] == [str(folder / "problems.jsonl")]  # absolute: the saved recipe works anywhere
    assert saved["eval"]["files"] == [str(folder / "held_out.jsonl")]
    assert saved["rewards"][1]["name"] == f"{folder / 'my_rewards.py'}:brevity"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward" in m] == [1, 2]
    assert all(m["rewards/brevity/mean"] < 0 for m in metrics if "reward" in m)  # the user's function ran
    assert all(m["sync/bytes"] == 0 for m in metrics if "reward" in m)  # hf samples with the policy: nothing moves
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


STREAMING = re.search(r"## Data larger than memory.*?```yaml\n(.*?)```", SECTION, re.S).group(1)


@pytest.mark.slow
def test_the_streaming_example_validates_and_trains_on_its_shards(project):
    """The data section of "Data larger than memory" in the example's recipe, over the problems cut into two
    JSON Lines shards: validate passes, train streams them (step 1's prompts are the stream's first rows)."""
    folder, elsewhere, env = project
    rows = FILES["problems.jsonl"].strip().splitlines()
    (folder / "shards").mkdir()
    for i in range(2):
        (folder / f"shards/train-0000{i}.jsonl").write_text("\n".join(rows[2 * i:2 * i + 2]) + "\n")
    recipe = yaml.safe_load(FILES["recipe.yaml"])
    recipe["data"] = yaml.safe_load(STREAMING)["data"]
    (folder / "streaming.yaml").write_text(yaml.safe_dump(recipe))
    p = grpo("validate", str(folder / "streaming.yaml"), SMALL[0], cwd=elsewhere, env=env)
    assert p.returncode == 0 and ": ok (my-first-run" in p.stdout, p.stderr
    p = grpo("train", str(folder / "streaming.yaml"), *SMALL, "-o", "runs/streamed", cwd=elsewhere, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    run = elsewhere / "runs/streamed"
    saved = yaml.safe_load((run / "recipe.yaml").read_text())["data"]
    assert saved["files"] == [str(folder / "shards/train-*.jsonl")] and saved["streaming"] is True
    rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["data_index"] for r in rollouts}) == [0, 1, 2, 3]  # 2 steps x 2 prompts: the whole stream
    questions = {json.loads(r)["question"] for r in rows}
    assert {q for q in questions if any(q in r["prompt"] for r in rollouts)} == questions
