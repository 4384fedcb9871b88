"""`grpo replay`: a step's update again from its recorded batch, byte for byte on the CPU, through the CLI."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from grpo_cli.run.replays import recorded_steps

from helpers import cli, read_jsonl


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    """The environment of the CLI runs: the session's builtin-model cache (conftest's model_cache, for a module)."""
    return {**os.environ, "GRPO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "grpo-cache")}


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache_env) -> Path:
    folder = tmp_path_factory.mktemp("replay") / "run"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(folder), "train.max_steps=4", "checkpoint.every_steps=2",
            "checkpoint.keep_last=null", "eval=null", env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    return folder


def rows(stdout: str) -> dict[str, tuple[str, str, str]]:
    """The replay's table: metric -> (original, replayed, difference)."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^(\S+)\s+(\S+)\s+(\S+)\s*(.*)$", line)
        if m and m.group(1) in ("loss", "grad_norm", "entropy", "kl", "reward", "advantages/abs_mean"):
            out[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return out


def test_every_step_is_recorded_compactly(run):
    assert recorded_steps(run) == [1, 2, 3, 4]
    tensors = load_file(str(run / "replay/step-3/process-0.safetensors"))
    info = json.loads((run / "replay/step-3/process-0.json").read_text())
    assert info["dtypes"]["completion_ids"] == "int64" and tensors["completion_ids"].dtype == torch.int32
    assert tensors["completion_mask"].dtype == torch.uint8  # 0/1: one byte, cast back on load
    assert tensors["completion_ids"].shape[0] == 8 and info["rows"] == [0, 8]
    records = [r for r in read_jsonl(run / "rollouts.jsonl") if r["step"] == 3]
    assert info["rollout"]["completions"] == [r["completion"] for r in records]


def test_a_replayed_step_equals_the_original_byte_for_byte(run, tmp_path, cache_env):
    p = cli("replay", str(run), "--step", "4", "--out", str(tmp_path / "r4"), env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith(f"replayed steps 3-4 of {run} from step-2, nothing generated")
    table = rows(p.stdout)
    for metric in ("loss", "grad_norm", "entropy", "reward"):
        original, replayed, difference = table[metric]
        assert original == replayed and difference == "equal", (metric, table[metric])
    assert "weights: equal to step-4's, byte for byte (" in p.stdout
    replayed = {m["step"]: m for m in read_jsonl(tmp_path / "r4/metrics.jsonl")}
    original = {m["step"]: m for m in read_jsonl(run / "metrics.jsonl")}
    for step in (3, 4):
        assert replayed[step]["loss"] == original[step]["loss"]
        assert replayed[step]["grad_norm"] == original[step]["grad_norm"]

    # step 1 replays from the base model (no checkpoint precedes it)
    p = cli("replay", str(run), "--step", "1", "--out", str(tmp_path / "r1"), env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith(f"replayed step 1 of {run} from the base model")
    assert rows(p.stdout)["loss"][2] == "equal" and "no checkpoint at step 1 to compare" in p.stdout


def test_overrides_show_how_the_same_data_would_have_moved_the_model(run, tmp_path, cache_env):
    p = cli("replay", str(run), "--step", "3", "algorithm.loss_type=grpo", "algorithm.beta=0.04",
            "--out", str(tmp_path / "grpo"), env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    table = rows(p.stdout)
    assert table["loss"][2] != "equal" and table["grad_norm"][2] != "equal"
    assert table["kl"][0] == "-" and float(table["kl"][1]) > 0  # a KL term the original did not have
    assert table["reward"][2] == "equal" and table["advantages/abs_mean"][2] == "equal"  # the same data
    head = next(line for line in p.stdout.splitlines() if line.startswith("replayed "))
    assert head.endswith("nothing generated; overrides: algorithm.loss_type=grpo algorithm.beta=0.04")


def test_a_record_that_differs_from_what_was_trained_is_caught(run, tmp_path, cache_env):
    import shutil

    bad = tmp_path / "run"
    shutil.copytree(run, bad)
    path = bad / "replay/step-4/process-0.safetensors"
    tensors = load_file(str(path))
    tensors["completion_ids"][0, :4] = (tensors["completion_ids"][0, :4] + 1) % 200  # other tokens than were trained
    save_file(tensors, str(path))
    p = cli("replay", str(bad), "--step", "4", "--out", str(tmp_path / "r"), env=cache_env)
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    # the loss's value at ratio 1 is the advantages' mean whatever the tokens; its gradient is not
    assert rows(p.stdout)["grad_norm"][2] != "equal"
    assert re.search(r"weights: \d+ of \d+ tensors differ from step-4's", p.stdout)
    assert "error: the replay did not reproduce the original step" in p.stderr


def test_records_follow_the_checkpoints_and_a_missing_one_is_named(tmp_path, cache_env):
    run = tmp_path / "kept"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "train.max_steps=4", "checkpoint.every_steps=1",
            "checkpoint.keep_last=2", "eval=null", env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(c.name for c in (run / "checkpoints").iterdir()) == ["step-3", "step-4"]
    assert recorded_steps(run) == [4]  # steps 1-3 have no kept checkpoint before them
    p = cli("replay", str(run), "--step", "2", env=cache_env)
    assert p.returncode == 2 and f"error: {run} has no record of step 2 to replay (it holds steps 4-4)" in p.stderr
    p = cli("replay", str(run), "--step", "4", "--out", str(tmp_path / "r"), env=cache_env)
    assert p.returncode == 0 and "from step-3" in p.stdout and "byte for byte" in p.stdout, p.stderr[-3000:]
    off = tmp_path / "off"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(off), "train.max_steps=1", "logging.replay=false", "eval=null",
            env=cache_env)
    assert p.returncode == 0 and not (off / "replay").exists()


def test_a_lora_step_replays_to_the_same_adapter(tmp_path, cache_env):
    run = tmp_path / "lora"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "train.max_steps=2", "checkpoint.every_steps=1",
            "checkpoint.keep_last=null", "eval=null", "model.lora.r=4", env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    p = cli("replay", str(run), "--step", "2", "--out", str(tmp_path / "r"), env=cache_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert rows(p.stdout)["grad_norm"][2] == "equal"
    assert re.search(r"weights: equal to step-2's, byte for byte \(\d+ tensors\)", p.stdout)  # the adapter's


def test_a_replay_in_this_process_gives_its_folders_lock_back(run, tmp_path, cache_env, monkeypatch):
    # the replay took its output folder's lock and released, by a name its metric loop reused, a metric's name: the
    # lock stayed held for the life of the process (a notebook could not replay into that folder, or delete it)
    from grpo_cli.run import lock
    from grpo_cli.trainer.replay import replay

    monkeypatch.setenv("GRPO_CACHE_DIR", cache_env["GRPO_CACHE_DIR"])
    torch.set_num_threads(1)
    result = replay(run, 3, [], tmp_path / "r3", say=lambda _: None)
    assert result.equal is True and result.steps == [3]
    assert not lock.holds(tmp_path / "r3")
