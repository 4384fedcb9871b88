"""train.offload_optimizer: the optimizer's state and step in host memory (trainer/offload.py). The update must be the
plain optimizer's, and a checkpoint of either loads into the other."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_cli.trainer.offload import HostOptimizer

from helpers import batch, cli, read_jsonl, stable, tiny_model, warmup

torch.set_num_threads(1)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, fused=True)


def step(model, opt, sched, ids, drop: str | None = None) -> float:
    opt.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    if drop is not None:  # a weight with no gradient this step (frozen, or unused by the batch) is not stepped
        model.get_parameter(drop).grad = None
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    sched.step()
    return float(norm)


def pair():
    a, b = tiny_model(0), tiny_model(0)
    plain = adamw(a.parameters())
    host = HostOptimizer(b.parameters(), adamw)
    return (a, plain, torch.optim.lr_scheduler.LambdaLR(plain, warmup)), \
        (b, host, torch.optim.lr_scheduler.LambdaLR(host, warmup))


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_the_host_optimizer_steps_as_the_plain_one_and_their_states_are_one_format():
    (a, plain, sa), (b, host, sb) = pair()
    drops = [None, "model.norm.weight", None, "model.layers.0.mlp.up_proj.weight", None]
    for i, drop in enumerate(drops):
        assert step(a, plain, sa, batch(i), drop) == step(b, host, sb, batch(i), drop)
    assert same_weights(a, b) and not same_weights(a, tiny_model(0))  # it trained, the same way
    assert all(p.device.type == "cpu" and len(host.state) == 0 for p in b.parameters())  # nothing on the device side
    assert [g["lr"] for g in host.param_groups] == [g["lr"] for g in plain.param_groups] == [1e-2]  # the schedule
    ps, hs = (copy.deepcopy(o.state_dict()) for o in (plain, host))  # as a checkpoint holds them: not the live tensors
    assert ps["param_groups"] == hs["param_groups"]
    assert ps["state"].keys() == hs["state"].keys() and all(
        torch.equal(ps["state"][k][n], hs["state"][k][n]) for k in ps["state"] for n in ps["state"][k])
    # the norm's weight missed a step: its moments count one step fewer, in both
    norm = [n for n, _ in a.named_parameters()].index("model.norm.weight")
    assert float(hs["state"][norm]["step"]) == 4 and float(hs["state"][0]["step"]) == 5

    # the offloaded state into the plain optimizer and the plain state into the offloaded one, then two more steps
    c = tiny_model(0)
    c.load_state_dict(a.state_dict())
    plain_again = adamw(c.parameters())
    sc = torch.optim.lr_scheduler.LambdaLR(plain_again, warmup)  # as the trainer builds them, then a checkpoint
    plain_again.load_state_dict(hs)
    sc.load_state_dict(sb.state_dict())
    host.load_state_dict(ps)
    for i in (5, 6):
        assert step(c, plain_again, sc, batch(i)) == step(b, host, sb, batch(i)) == step(a, plain, sa, batch(i))
    assert same_weights(a, b) and same_weights(a, c)


def test_a_closure_is_refused():
    (_, _, _), (b, host, _) = pair()
    with pytest.raises(ValueError, match="without a closure"):
        host.step(lambda: 0.0)


@pytest.mark.slow
def test_a_run_with_the_offload_trains_as_without_and_its_checkpoint_resumes_without(tmp_path, model_cache):
    def train(out, *args):
        return cli("train", "recipes/ci-tiny.yaml", "train.max_steps=3", f"logging.output_dir={out}", *args,
                   timeout=300)

    assert train(tmp_path / "plain").returncode == 0
    off = train(tmp_path / "off", "train.offload_optimizer=true", "train.max_steps=2")
    assert off.returncode == 0, off.stderr[-3000:]
    assert "the optimizer's state is in host memory already" in off.stderr  # on a CPU it gains nothing
    back = train(tmp_path / "off", "--resume", "auto")  # train.offload_optimizer may change on resume
    assert back.returncode == 0, back.stderr[-3000:]
    plain, off = read_jsonl(tmp_path / "plain" / "metrics.jsonl"), read_jsonl(tmp_path / "off" / "metrics.jsonl")
    assert [stable(m) for m in off] == [stable(m) for m in plain] and plain[-1]["grad_norm"] > 0


def test_auto_offloads_one_cuda_process_s_full_adamw_and_the_plan_counts_it_off_the_gpu():
    from types import SimpleNamespace

    from grpo_cli.doctor.memory import model_sizes, plan
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.offload import offloads

    from helpers import ROOT

    auto = SimpleNamespace(offload_optimizer="auto", optimizer="adamw")
    gib = 2.0**30
    assert offloads(auto, False, "cuda", 1, False, gib)
    refused = [offloads(auto, True, "cuda", 1, False, gib), offloads(auto, False, "cpu", 1, False, gib),  # LoRA, CPU
               offloads(auto, False, "cuda", 2, False, gib), offloads(auto, False, "cuda", 1, True, gib),  # DDP, FSDP
               offloads(SimpleNamespace(offload_optimizer="auto", optimizer="adamw_8bit"), False, "cuda", 1, False,
                        gib),
               offloads(auto, False, "cuda", 1, False, 2.0**50)]  # more than the host has for its copies
    assert not any(refused)
    assert offloads(SimpleNamespace(offload_optimizer=True, optimizer="adamw"), True, "cpu", 2, False, 2.0**50)
    assert not offloads(SimpleNamespace(offload_optimizer=False, optimizer="adamw"), False, "cuda", 1, False, gib)

    from transformers import Qwen2Config

    shape = model_sizes(Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,  # Qwen2.5-0.5B's
                                    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                    tie_word_embeddings=True))
    parts = {}
    for setting in ("auto", "false"):
        overrides = ["model.dtype=bfloat16", f"train.offload_optimizer={setting}"]
        recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml", overrides)
        parts[setting] = {p.name: p.bytes for p in plan(recipe, shape, 1, 64, "cuda", 0.0, 80 * 2**30)}
    assert parts["false"]["optimizer state"] == 2 * 2 * shape.params  # two bfloat16 moments
    assert parts["auto"]["optimizer state"] == parts["auto"]["optimizer step (temporaries)"] == 0
    assert parts["auto"]["gradients"] == parts["false"]["gradients"] == 2 * shape.params  # the gradients stay
    cpu = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["train.offload_optimizer=true"])
    on_cpu = {p.name: p.bytes for p in plan(cpu, shape, 1, 64, "cpu", 0.0)}
    assert on_cpu["optimizer state"] == 4 * 4 * shape.params  # float32 moments and the offload's two copies


@pytest.mark.parametrize("kind, optimizer, message", [
    ("FSDP", "adamw", "use FSDP's cpu_offload or DeepSpeed's offload_optimizer"),
    ("DEEPSPEED", "adamw", "use FSDP's cpu_offload or DeepSpeed's offload_optimizer"),
    ("NO", "adamw_8bit", "adamw or adafactor, not adamw_8bit"),
])
def test_what_it_cannot_offload_is_refused_by_name(kind, optimizer, message):
    from types import SimpleNamespace

    from grpo_cli.errors import SetupError
    from grpo_cli.trainer.setup import offloaded_optimizer

    accelerator = SimpleNamespace(distributed_type=SimpleNamespace(name=kind), device=torch.device("cpu"))
    t = SimpleNamespace(optimizer=optimizer, offload_optimizer=True)
    with pytest.raises(SetupError, match=message):
        offloaded_optimizer(list(tiny_model(0).parameters()), t, accelerator, fused=True)
