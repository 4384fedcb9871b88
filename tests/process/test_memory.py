"""Peak memory (grpo_cli/process/memory.py): the process's own, and by phase: each phase's own peak, phases nested, the
process peak kept."""

import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
# the phases of test_each_phase_reports_its_own_peak_and_the_process_peak_stays, in a new interpreter
PHASES = """
import json, sys
sys.path.insert(0, "tests")
import torch
from grpo_cli.process.memory import PhasePeaks, peak_memory_gib
from helpers import resident_gib

CPU = torch.device("cpu")


def hold(mib):
    return torch.ones(mib * 2**20, dtype=torch.uint8)  # written: resident


peaks = PhasePeaks(CPU)
base = resident_gib()
with peaks("big"):
    x = hold(400)
    del x  # freed before the phase ends: its peak still counts
with peaks("small"):
    y = hold(40)
    del y
with peaks("outer"):
    with peaks("inner"):
        z = hold(200)
        del z
    w = hold(20)
    del w
m = peaks.metrics()
gib = {k.split("/")[1][:-4]: v - base for k, v in m.items()}  # above what was resident before
print(json.dumps({"names": sorted(m), "gib": gib, "process": peak_memory_gib(CPU) - base}))
"""


@linux_only
def test_each_phase_reports_its_own_peak_and_the_process_peak_stays():
    # in a new interpreter: what an earlier test of this worker left behind (garbage in reference cycles freed inside
    # a phase, seen once: "big" 0.0 GiB above the base; a freed 400 MiB block kept resident, seen once in CI: "small"
    # 0.39 GiB above it) is not this test's to measure
    p = subprocess.run([sys.executable, "-c", PHASES], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.splitlines()[-1])
    gib = out["gib"]
    assert set(out["names"]) == {"memory/big_gib", "memory/small_gib", "memory/outer_gib", "memory/inner_gib"}
    assert 0.37 < gib["big"] < 0.45
    assert gib["small"] < 0.1  # the 400 MiB freed before it are not its peak
    assert 0.18 < gib["inner"] < 0.25 and gib["outer"] >= gib["inner"]  # a nested phase counts in both
    assert out["process"] > 0.37  # the process peak survives the resets


@linux_only
def test_a_step_reports_the_peak_of_each_phase(tmp_path):
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.engine import Engine

    from helpers import ROOT, read_jsonl

    torch.set_num_threads(1)
    r = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["train.max_steps=2", "algorithm.beta=0.04", "logging.rollouts=false",
                                                    "checkpoint.every_steps=0"])
    Engine(r, tmp_path / "run").fit()

    for m in read_jsonl(tmp_path / "run/metrics.jsonl"):
        phases = {k: v for k, v in m.items() if k.startswith("memory/") and k != "memory/peak_gib"}
        assert set(phases) == {f"memory/{p}_gib" for p in
                               ("generate", "score", "train", "reference", "forward_backward", "optimizer", "sync")}
        assert 0.05 < min(phases.values()) and max(phases.values()) <= m["memory/peak_gib"] + 1e-9
        for inner in ("reference", "forward_backward", "optimizer"):  # phases of the update
            assert phases[f"memory/{inner}_gib"] <= phases["memory/train_gib"] + 1e-9


def test_peak_memory_is_this_process_not_the_one_that_launched_it():
    """Linux's ru_maxrss keeps the launcher's peak across fork and exec: a run started from a 1 GiB process (a
    pytest worker, a notebook) reported at least 1 GiB however small it was. memory/peak_gib is the process's own."""
    held = bytearray(1 << 30)
    held[::4096] = b"\1" * len(held[::4096])  # touched: resident
    code = ("import torch; from grpo_cli.process.memory import peak_memory_gib; "
            "x = torch.ones(64 * 2**20, dtype=torch.uint8); print(peak_memory_gib(torch.device('cpu')))")
    own = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    del held
    assert 0.06 < own < 0.9  # torch and a 64 MiB tensor, not the 1 GiB held here
