"""The Python API (grpo_cli/api.py): the CLI's engine from Python, with functions as rewards and rows as data; a
run started in Python resumes from the command line and the other way round, step for step the same run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_cli
from grpo_cli.errors import DataError, RecipeError, UsageError, UserError

from helpers import ROOT, cli, read_jsonl, stable

ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(8) for b in range(4)]
TINY = ["train.max_steps=2", "eval=null", "data.template={prompt}", "checkpoint.every_steps=2",
        "checkpoint.keep_last=null"]


def brevity(completions, **_):  # the notebook's reward; tests/api_rewards.py holds the same as a file
    return [1.0 / (1 + len(c)) for c in completions]


@pytest.fixture(scope="module", autouse=True)
def cache_env(tmp_path_factory):
    """The session's builtin-model cache (conftest's model_cache) and the repo root as working directory, for this
    module's in-process runs, its CLI runs and the notebook's kernel; both restored after the module."""
    cache = str(tmp_path_factory.getbasetemp() / "grpo-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPO_CACHE_DIR", cache)
        mp.chdir(ROOT)
        yield {**os.environ, "GRPO_CACHE_DIR": cache}


@pytest.fixture(scope="module")
def python_run(tmp_path_factory, cache_env):
    """2 steps from Python: a function reward at weight 0.5 next to a built-in one, rows given as a list of dicts."""
    out = tmp_path_factory.mktemp("api") / "run"
    return grpo_cli.train("recipes/ci-tiny.yaml", rewards=["accuracy", (brevity, 0.5)], dataset=ROWS,
                          overrides=TINY, output_dir=out)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, python_run, cache_env) -> list[dict]:
    """The same run from the command line, 4 steps without a stop: the reward from a file, the rows from the
    Parquet file the Python run saved."""
    out = tmp_path_factory.mktemp("api") / "straight"
    data = python_run.run_dir / "data"
    parquet = next(data.glob("train-*.parquet"))
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(out), *TINY, "train.max_steps=4", f"data.files=[{parquet}]",
            "data.generator=null", "rewards.1.name=tests/api_rewards.py:brevity", "rewards.1.weight=0.5",
            env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    # grpo train's own process keeps freed memory for reuse (train.keep_freed_memory: auto on a CPU); the Python run
    # leaves its host's allocator alone, and both runs are step for step the same (the tests below)
    assert "; freed memory kept for reuse (train.keep_freed_memory);" in p.stderr
    return read_jsonl(out / "metrics.jsonl")


def test_python_rewards_are_logged_by_name_and_weighted(python_run):
    assert python_run.step == 2 and not python_run.stopped
    assert python_run.checkpoint == python_run.run_dir / "checkpoints" / "step-2"
    assert [m["step"] for m in python_run.metrics] == [1, 2]
    for m in python_run.metrics:
        assert m["rewards/brevity/mean"] > 0
        # the step's reward is the weighted sum: accuracy + 0.5 x brevity (both score every completion)
        assert m["reward"] == pytest.approx(m["rewards/accuracy/mean"] + 0.5 * m["rewards/brevity/mean"], abs=1e-6)
    completions = [r["completion"] for r in read_jsonl(python_run.run_dir / "rollouts.jsonl") if r["step"] == 1]
    assert python_run.metrics[0]["rewards/brevity/mean"] == pytest.approx(sum(brevity(completions)) / len(completions))
    assert "reward 0." in repr(python_run) and "step 2" in repr(python_run)


def test_the_run_records_the_function_by_name_and_the_rows_as_a_file(python_run):
    import yaml
    from datasets import load_dataset

    saved = yaml.safe_load((python_run.run_dir / "recipe.yaml").read_text())
    assert [(r["name"], r["weight"]) for r in saved["rewards"]] == [("accuracy", 1.0), ("python:brevity", 0.5)]
    assert saved["data"]["generator"] is None and len(saved["data"]["files"]) == 1
    parquet = Path(saved["data"]["files"][0])
    assert parquet.parent == (python_run.run_dir / "data").resolve() and parquet.name.startswith("train-")
    assert load_dataset("parquet", data_files=str(parquet), split="train").to_list() == ROWS
    prompts = {r["prompt"] for r in read_jsonl(python_run.run_dir / "rollouts.jsonl")}
    assert any("What is" in p for p in prompts)


def test_the_cli_names_the_function_it_lacks_then_resumes_exactly(python_run, straight, cache_env, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(python_run.run_dir, run)
    saved = python_run.run_dir / "recipe.yaml"
    # the saved recipe points at the original folder's rows; a copy of the run resumes with them
    p = cli("train", str(saved), "-o", str(run), "--resume", "auto", "train.max_steps=4", env=cache_env)
    assert p.returncode == 2
    assert "rewards.1.name: reward 'python:brevity' is a Python function" in p.stderr
    assert "grpo_cli.train(..., rewards=[brevity])" in p.stderr and "path/to/file.py:brevity" in p.stderr
    p = cli("train", str(saved), "-o", str(run), "--resume", "auto", "train.max_steps=4",
            "rewards.1.name=tests/api_rewards.py:brevity", "--allow-recipe-change", env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = read_jsonl(run / "metrics.jsonl")
    assert [stable(m) for m in resumed] == [stable(m) for m in straight]  # Python's steps 1-2 and the CLI's 3-4


def test_python_resumes_a_cli_run_exactly(straight, cache_env, tmp_path, python_run):
    parquet = next((python_run.run_dir / "data").glob("train-*.parquet"))
    run = tmp_path / "cli-run"
    common = [*TINY, f"data.files=[{parquet}]", "data.generator=null", "rewards.1.name=tests/api_rewards.py:brevity",
              "rewards.1.weight=0.5"]
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), *common, env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    result = grpo_cli.train("recipes/ci-tiny.yaml", overrides=[*common, "train.max_steps=4"], output_dir=run,
                            resume="auto")
    assert result.step == 4 and [m["step"] for m in result.metrics] == [1, 2, 3, 4]
    assert [stable(m) for m in result.metrics] == [stable(m) for m in straight]
    again = grpo_cli.train("recipes/ci-tiny.yaml", overrides=[*common, "train.max_steps=4"], output_dir=run,
                           resume="auto")  # finished: nothing trained, the same result
    assert again.step == 4 and again.metrics == result.metrics


def test_evaluate_returns_every_targets_metrics(python_run, tmp_path, capsys):
    result = grpo_cli.evaluate(["base", python_run.run_dir], recipe="recipes/ci-tiny.yaml", dataset=ROWS[:6],
                               output_dir=tmp_path / "eval", max_new_tokens=4)
    assert "freed memory kept" not in capsys.readouterr().err  # a Python program keeps its allocator (auto)
    assert set(result.metrics("base")) >= {"accuracy"} and set(result.metrics(python_run.run_dir)) >= {"accuracy"}
    on_disk = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert on_disk["targets"] == json.loads(json.dumps(result.report["targets"]))
    assert result.metrics("base")["num_problems"] == 6  # every row given, the recipe's data left aside
    samples = read_jsonl(tmp_path / "eval" / "samples.jsonl")
    assert len(samples) == 12 and {s["target"] for s in samples} == {"base", str(python_run.run_dir)}
    with pytest.raises(KeyError, match="was not evaluated"):
        result.metrics("other")


def test_evaluate_a_checkpoint_with_its_own_recipe_and_function(python_run, tmp_path):
    result = grpo_cli.evaluate(python_run.checkpoint, output_dir=tmp_path / "eval", limit=4, max_new_tokens=4)
    metrics = result.metrics(python_run.checkpoint)
    assert metrics["num_problems"] == 4 and 0 < metrics["rewards/brevity/mean"] <= 0.2  # 4 tokens: >= 4 characters


def test_load_recipe_takes_a_file_a_dict_or_a_recipe():
    r = grpo_cli.load_recipe("recipes/ci-tiny.yaml", ["algorithm.beta=0.04"])
    assert r.algorithm.beta == 0.04 and r.rewards[1].name == str(ROOT / "recipes/rewards/toy.py") + ":digit_fraction"
    again = grpo_cli.load_recipe(r, ["train.max_steps=7"])
    assert again.train.max_steps == 7 and again.algorithm.beta == 0.04
    d = r.model_dump(mode="json")
    assert grpo_cli.load_recipe(d) == r
    with pytest.raises(RecipeError, match=r"algorithm.beta") as e:
        grpo_cli.load_recipe(d, ["algorithm.beta=-1"])
    assert e.value.exit_code == 2


def test_errors_raise_the_clis_messages_never_exit(tmp_path):
    bad = [
        (dict(overrides=["algorithm.num_generations=3"]), RecipeError, "num_generations"),
        (dict(rewards=[lambda completions, **_: [0.0] * len(completions)]), UsageError, "define it with `def name"),
        (dict(rewards=[(brevity, "high")]), UsageError, "the weight of"),
        (dict(dataset="rows.jsonl"), DataError, "give a datasets.Dataset or a list of dicts"),
        (dict(dataset=[{"question": "2+2?", "answer": "4"}]), DataError, "prompt"),
        (dict(overrides=["rewards.0.timeout_s=5"], rewards=[brevity]), RecipeError, "timeout_s"),
    ]
    for kwargs, error, text in bad:
        with pytest.raises(error, match=text.replace("(", r"\(").replace("[", r"\[")) as e:
            grpo_cli.train("recipes/ci-tiny.yaml", output_dir=tmp_path / "bad", **kwargs)
        assert isinstance(e.value, UserError) and e.value.exit_code in (1, 2)


def test_two_functions_with_one_name_are_refused():
    def make():
        def score(completions, **_):
            return [0.0] * len(completions)
        return score

    with pytest.raises(UsageError, match="two different functions are named 'score'"):
        grpo_cli.train("recipes/ci-tiny.yaml", rewards=[make(), make()])


def test_a_stall_raises_and_the_process_lives_on(tmp_path):
    """A reward that never returns on its second call: from Python the run raises StallError (the CLI's process
    would exit), the stacks are written, the checkpoint of step 1 is intact and the run resumes from it."""
    import time

    from grpo_cli.errors import StallError

    calls = []

    def sleepy(completions, **_):
        calls.append(1)
        while len(calls) == 2:
            try:
                time.sleep(3600)
            except Exception:  # noqa: BLE001 - a reward that swallows errors cannot swallow the stall
                pass
        return [0.0] * len(completions)

    run = tmp_path / "run"
    start = time.monotonic()
    with pytest.raises(StallError, match=r"no progress for \d+ s in score > reward 'sleepy'") as e:
        grpo_cli.train("recipes/ci-tiny.yaml", rewards=[sleepy], output_dir=run,
                       overrides=["train.max_steps=3", "checkpoint.every_steps=1", "eval=null",
                                  "train.stall_timeout_s=3"])
    assert time.monotonic() - start < 60 and e.value.exit_code == 1
    assert "the last checkpoint (step-1) is intact" in str(e.value)
    stacks = (run / "stalls" / "process-0.txt").read_text()
    assert "in score > reward 'sleepy'" in stacks and "time.sleep(3600)" in stacks
    import signal

    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the watchdog's handler is gone with the run
    result = grpo_cli.train("recipes/ci-tiny.yaml", rewards=[sleepy], output_dir=run, resume="auto",
                            overrides=["train.max_steps=3", "checkpoint.every_steps=1", "eval=null"])
    assert result.step == 3 and [m["step"] for m in result.metrics] == [1, 2, 3]


PAGE, NOTEBOOK = ROOT / "docs/python.md", ROOT / "docs/notebooks/python.ipynb"


def test_every_example_of_the_python_page_is_a_cell_of_the_notebook():
    import re

    import nbformat

    blocks = re.findall(r"```python\n(.*?)\n```", PAGE.read_text(), re.S)
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    assert len(blocks) >= 5 and blocks == cells


@pytest.mark.slow
def test_the_docs_notebook_runs_headless(tmp_path, cache_env):
    """docs/notebooks/python.ipynb executed by a real Jupyter kernel (nbclient + ipykernel), as a user runs it from
    the repository's root: its outputs are what the page says."""
    import nbformat
    from nbclient import NotebookClient

    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # the notebook's working directory: runs/ goes here
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]

    def text(cell) -> str:
        # a stream's text comes in the chunks the kernel flushed (one print can be two outputs on a loaded machine:
        # "RecipeError" and " 2 invalid recipe: ..."): streams join as they are, a result is a line of its own
        parts = []
        for o in cell.outputs:
            parts.append(o["text"] if o.get("output_type") == "stream" else
                         "\n" + str(o.get("data", {}).get("text/plain", "")) + "\n")
        return "".join(parts).strip("\n")

    train, metrics, scores, exported, more, errors = code[1], code[2], code[3], code[4], code[5], code[6]
    assert "TrainResult(runs/notebook: step 4, reward" in text(train)
    assert "step 4/4 |" in text(train) and "brevity" in text(train)  # the per-step lines
    # the progress bar: rich draws it in an ipywidgets Output, a widget view among the cell's outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in train.outputs)
    assert not any("UserWarning" in text(c) or "Traceback" in text(c) for c in code)
    rows = eval(metrics.outputs[0]["data"]["text/plain"])  # noqa: S307 - the cell's own repr of a list of tuples
    assert [r[0] for r in rows] == [1, 2, 3, 4] and all(0 < r[2] < 0.2 for r in rows)
    assert "runs/notebook/eval/" in text(scores)
    assert "'lora_merged': False" in text(exported) and (tmp_path / "models/mine/config.json").is_file()
    assert more.outputs[-1]["data"]["text/plain"] == "(6, 6)"
    assert text(errors).startswith("RecipeError 2 invalid recipe:\n  train.micro_batch_size (4) must divide")
    saved = read_jsonl(tmp_path / "runs/notebook/metrics.jsonl")
    assert [m["step"] for m in saved] == [1, 2, 3, 4, 5, 6]


def test_dir_lists_the_api_before_it_is_loaded():
    # issue 36's newcomer walk: dir(grpo_cli) in a notebook named none of train, evaluate, load_recipe
    p = subprocess.run([sys.executable, "-c", "import grpo_cli, sys; print(sorted(set(dir(grpo_cli)) & "
                        "set(grpo_cli.__all__))); print('torch' in sys.modules)"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    names, torch_loaded = p.stdout.splitlines()
    assert names == str(sorted(["train", "evaluate", "export", "load_recipe", "TrainResult", "EvalResult",
                                "UserError"]))
    assert torch_loaded == "False"  # listing them loads nothing


def test_what_needs_no_reward_works_on_a_run_with_function_rewards(python_run, cache_env, tmp_path):
    """Issue 36's newcomer walk: export, eval with another recipe, inspect-rollouts, report, audit and replay of a run
    trained from Python with a function reward refused it ("reward 'python:brevity' is a Python function ..."),
    from the command line and from Python; the recipe is a pure schema now, and only what scores resolves rewards."""
    run = str(python_run.run_dir)
    p = cli("export", run, "--merge", str(tmp_path / "merged"), env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    record = json.loads((tmp_path / "merged/export.json").read_text())
    assert record["lora_merged"] is False and record["checkpoint"].endswith("step-2")
    assert grpo_cli.export(run, tmp_path / "merged-py") == record
    with pytest.raises(UsageError, match=r"^dtype='fp8' is not one of float32, bfloat16, float16"):
        grpo_cli.export(run, tmp_path / "other", dtype="fp8")
    for args in (["inspect-rollouts", run, "--limit", "2"], ["report", run, "--out", str(tmp_path / "report")],
                 ["audit", run], ["replay", run, "--step", "2", "-o", str(tmp_path / "replay")]):
        p = cli(*args, env=cache_env)
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, (args, p.stderr[-3000:])
        assert "Python function" not in p.stdout + p.stderr, args
    assert (tmp_path / "report/report.html").is_file() and (tmp_path / "replay/metrics.jsonl").is_file()
    # eval scores: with another recipe's rewards it runs; with the run's own it names what to pass, and how
    p = cli("eval", run, "--recipe", "recipes/ci-tiny.yaml", "--limit", "4", "--max-new-tokens", "4",
            "-o", str(tmp_path / "eval"), env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((tmp_path / "eval/eval.json").read_text())["targets"][0]["metrics"]["num_problems"] == 4
    p = cli("eval", run, "--limit", "4", "-o", str(tmp_path / "own"), env=cache_env)
    assert p.returncode == 2 and "rewards.1.name: reward 'python:brevity' is a Python function" in p.stderr
    assert "grpo eval --recipe" in p.stderr and "grpo_cli.evaluate(..., rewards=[brevity])" in p.stderr
    # from Python in a process that never had the function (this one registered it when it trained)
    code = (f"import grpo_cli\nrun = {run!r}\n"
            f"r = grpo_cli.evaluate(run, recipe='recipes/ci-tiny.yaml', rewards=['accuracy'], limit=4, "
            f"max_new_tokens=4, output_dir={str(tmp_path / 'py')!r})\nprint(r.metrics(run)['num_problems'])\n"
            "try:\n    grpo_cli.evaluate(run, limit=4)\nexcept grpo_cli.UserError as e:\n    print(repr(e))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cache_env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    evaluated, refused = p.stdout.splitlines()[-2:]
    assert float(evaluated) == 4 and refused.startswith("RecipeError(")
    assert "rewards.1.name: reward 'python:brevity'" in refused
    assert "grpo_cli.evaluate(..., rewards=[brevity])" in refused


def test_errors_raised_to_python_name_its_arguments(python_run, tmp_path):
    """Issue 36's newcomer walk: errors raised to Python gave the command line's flags (--resume auto, --start-over),
    and a wrong column of rows given as dataset= was "not a column of data.files"."""
    with pytest.raises(UserError) as e:  # a folder holding a run: continue it or start over
        grpo_cli.train("recipes/ci-tiny.yaml", rewards=["accuracy", (brevity, 0.5)], dataset=ROWS,
                       overrides=[*TINY, "train.max_steps=4"], output_dir=python_run.run_dir)
    assert 'resume="auto"' in str(e.value) and "start_over=True" in str(e.value) and "--" not in str(e.value)
    rows = [{"question": r["prompt"], "answer": r["answer"]} for r in ROWS]
    with pytest.raises(DataError) as e:
        grpo_cli.train("recipes/ci-tiny.yaml", dataset=rows, overrides=TINY, output_dir=tmp_path / "run")
    assert "the rows given as dataset=" in str(e.value) and "data.files" not in str(e.value), str(e.value)
    assert "columns: question, answer" in str(e.value)
