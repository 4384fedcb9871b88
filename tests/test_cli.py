"""The CLI is thin and lazy: help and validation never import torch."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NO_TORCH = """
import sys
from typer.testing import CliRunner
from grpo_cli.cli import app
runner = CliRunner()
for args in (["--help"], ["--version"], ["train", "--help"], ["validate", "recipes/ci-tiny.yaml"],
             ["print-recipe", "recipes/gsm8k.yaml"]):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, (args, r.output)
heavy = sorted(m for m in ("torch", "transformers", "datasets", "accelerate") if m in sys.modules)
assert not heavy, heavy
# a recipe on the hub (offline here, with an empty cache): its model is named without loading a library that would
r = runner.invoke(app, ["validate", "recipes/gsm8k.yaml"])
assert r.exit_code == 2 and "'Qwen/Qwen2.5-0.5B-Instruct' is not in the local hub cache" in r.output, r.output
heavy = sorted(m for m in ("torch", "transformers", "accelerate") if m in sys.modules)
assert not heavy, heavy
print("ok")
"""


def test_help_and_validate_do_not_import_torch(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    p = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_help_lists_commands_with_examples():
    p = subprocess.run([sys.executable, "-m", "grpo_cli", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0
    for word in ("train", "validate", "print-recipe", "grpo train recipes/quickstart.yaml"):
        assert word in p.stdout


def test_print_recipe_spells_out_defaults_and_overrides():
    p = subprocess.run([sys.executable, "-m", "grpo_cli", "print-recipe", "recipes/ci-tiny.yaml", "algorithm.beta=0.04"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    import yaml

    d = yaml.safe_load(p.stdout)
    assert d["algorithm"]["beta"] == 0.04
    assert d["algorithm"]["importance_sampling_level"] == "token"  # a default not written in the file
    assert d["train"]["mixed_precision"] == "no"


def test_version():
    from grpo_cli import __version__

    p = subprocess.run([sys.executable, "-m", "grpo_cli", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout == f"grpo {__version__}\n", p.stderr
    assert __version__.count(".") == 2


def test_help_says_how_overrides_are_read():
    p = subprocess.run([sys.executable, "-m", "grpo_cli", "validate", "--help"], capture_output=True, text=True, cwd=ROOT)
    text = " ".join(p.stdout.split())  # help is wrapped to the terminal
    assert "taken as plain text" in text and "data.template={question} Answer with a number." in text
    assert "start at the working directory" in text and "the data files (they exist and parse" in text


def test_help_examples_are_whole_lines_at_any_width():
    # issue 22: the --help examples were wrapped mid-token ("--allow-recipe-" / "change") even at 200 columns
    import os

    from grpo_cli.cli import COMMANDS

    docs = {"": "  grpo train recipes/quickstart.yaml\n  grpo print-recipe recipes/ci-tiny.yaml algorithm.beta=0.04",
            **{name: module.command.__doc__ or "" for name, module in COMMANDS.items()}}
    examples = {name: [line.strip() for line in doc.splitlines() if line.strip().startswith("grpo ")]
                for name, doc in docs.items()}
    assert len(examples["train"]) == 5 and len(examples["eval"]) == 3
    for width in (60, 200):
        for name, wanted in examples.items():
            p = subprocess.run([sys.executable, "-m", "grpo_cli", *([name] if name else []), "--help"],
                               capture_output=True, text=True, env={**os.environ, "COLUMNS": str(width)})
            assert p.returncode == 0, p.stderr
            shown = [line.strip() for line in p.stdout.splitlines()]
            for example in wanted:
                assert example in shown, (name, width, example)


def test_train_log_lines_are_whole_lines_in_a_log_file():
    # issue 22's walk: `make demo > log` got "[11/24/26 10:07:42] INFO     converting SmolLM2-135M-Instruct.Q4_1.gguf to a"
    # and the rest of the sentence on the next line (rich wraps at 80 columns when it does not write to a terminal)
    code = ("import logging; from grpo_cli.commands.train import setup_logging; setup_logging(); "
            "logging.getLogger('grpo_cli.models.loading').info('converting ' + 'x' * 150 + ' (once, ~30 s)'); "
            "logging.getLogger('some_library').info('not shown'); logging.getLogger('some_library').warning('shown')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("converting " + "x" * 150 + " (once, ~30 s)") and "INFO" in lines[0], lines
    assert lines[1].endswith("shown") and "WARNING" in lines[1], lines
