"""Two nodes on one machine: `torchrun --nnodes 2 --node-rank 0|1 --rdzv-endpoint 127.0.0.1:PORT`, one process
each, gloo. Each "node" has its own model cache (filled by its own main process); the run folder is shared,
as on a cluster's shared filesystem."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_cli.algo.advantages import compute_advantages
from grpo_cli.trainer.launch import free_port

from helpers import read_jsonl, stable

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"


def two_nodes(tmp_path: Path, run_dir: Path, *overrides: str) -> list[subprocess.CompletedProcess]:
    """One `grpo train` per node, started together; -> both nodes' finished processes."""
    port = free_port()
    procs = []
    for node in (0, 1):
        env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
               "GRPO_CACHE_DIR": str(tmp_path / f"node{node}-cache")}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "-m", "grpo_cli", "train", str(TINY), "-o", str(run_dir),
               "train.prompts_per_step=3", "train.micro_batch_size=3", *overrides]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.multiprocess
def test_two_nodes_train_normalise_groups_over_both_checkpoint_once_and_resume_exactly(tmp_path):
    run = tmp_path / "run"
    nodes = two_nodes(tmp_path, run, "train.max_steps=2")
    for p in nodes:
        assert p.returncode == 0, p.stderr[-3000:]
    out = "".join(p.stdout for p in nodes)
    assert out.count("done: 2 steps") == 1  # only the global main reports, logs and saves
    for node in (0, 1):  # every node's main process filled its own model cache
        assert list((tmp_path / f"node{node}-cache/models").glob("*/config.json"))
    # B=3 prompts x G=4 = 12 rows, 6 per node: group 1 (rows 4-7) spans both nodes
    rollouts, metrics = read_jsonl(run / "rollouts.jsonl"), read_jsonl(run / "metrics.jsonl")
    assert len(rollouts) == 2 * 12 and [m["step"] for m in metrics] == [1, 2]
    for step in (1, 2):
        rows = [r for r in rollouts if r["step"] == step]
        assert [(r["group"], r["sample"]) for r in rows] == [(g, s) for g in range(3) for s in range(4)]
        rewards = torch.tensor([r["reward"] for r in rows])
        adv = compute_advantages(rewards, 4, "group")  # group 1 normalised over its 4 rows on both nodes
        assert adv.abs().max() > 0.1
        assert torch.allclose(adv, torch.tensor([r["advantage"] for r in rows]), atol=1e-5)
        assert metrics[step - 1]["reward"] == pytest.approx(rewards.mean().item(), abs=1e-6)
    assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step-2"]

    nodes = two_nodes(tmp_path, run, "train.max_steps=4", "--resume", "auto")
    for p in nodes:
        assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from" in "".join(p.stdout + p.stderr for p in nodes)
    full = tmp_path / "full"
    for p in two_nodes(tmp_path, full, "train.max_steps=4"):
        assert p.returncode == 0, p.stderr[-3000:]
    assert [stable(m) for m in read_jsonl(full / "metrics.jsonl")] == [stable(m) for m in read_jsonl(run / "metrics.jsonl")]
    assert [r["completion"] for r in read_jsonl(full / "rollouts.jsonl")] == [r["completion"] for r in read_jsonl(run / "rollouts.jsonl")]
    assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step-2", "step-4"]
