"""The trained weights' gradients and AdamW's moments in one block each (grpo_cli/trainer/blocks.py): the same
gradients, steps and checkpoints as without, in the blocks' memory, step after step and after a resume."""

import copy
from pathlib import Path

import pytest
import torch

from grpo_cli.algo.head_gradient import GRADIENT_HOMES
from grpo_cli.algo.logprobs import KEEP_LOGITS, token_logprobs
from grpo_cli.models.linear import use_accumulating_linears
from grpo_cli.models.swiglu import use_lean_mlp
from grpo_cli.run.statefiles import load_state, save_state
from grpo_cli.trainer.blocks import after_load, gradient_block, moment_blocks, moments_in_blocks

ROOT = Path(__file__).resolve().parents[2]


def model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)
    m = AutoModelForCausalLM.from_config(cfg).float()
    use_lean_mlp(m)
    use_accumulating_linears(m)
    return m


def data(step: int):
    g = torch.Generator().manual_seed(step)
    p = torch.randint(3, 97, (2, 6), generator=g).repeat_interleave(2, 0)
    c = torch.randint(3, 97, (4, 5), generator=g)
    return p, torch.ones_like(p), c, torch.ones_like(c)


def train(m, opt, steps: range) -> None:
    """Steps of two micro-batches each, clipped as the trainer clips, then AdamW."""
    for step in steps:
        batch = data(step)
        for rows in (slice(0, 2), slice(2, 4)):
            lp, _ = token_logprobs(m, *(t[rows] for t in batch), chunked_head=KEEP_LOGITS)
            (lp.sum() * (step + 1)).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def adamw(m, fused: bool = True):
    return torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, fused=fused)


def in_block(t: torch.Tensor, block_ptr: int, block_bytes: int) -> bool:
    return block_ptr <= t.data_ptr() < block_ptr + block_bytes


def test_gradients_are_made_in_the_block_and_are_the_same():
    torch.set_num_threads(1)
    plain = model()
    blocked = copy.deepcopy(plain)
    params = [p for p in blocked.parameters() if p.requires_grad]
    assert gradient_block(params) == sum(p.numel() * 4 for p in params)
    homes = [GRADIENT_HOMES[p] for p in params]
    block = homes[0].untyped_storage()
    assert all(h.untyped_storage().data_ptr() == block.data_ptr() for h in homes)
    for step in range(2):  # the second step's gradients are made in the same memory again
        grads = []
        for m in (plain, blocked):
            m.zero_grad(set_to_none=True)
            lp, _ = token_logprobs(m, *data(step), chunked_head=KEEP_LOGITS)
            lp.sum().backward()
            grads.append({n: p.grad for n, p in m.named_parameters()})
        for name, grad in grads[0].items():
            assert torch.equal(grad, grads[1][name]), name
        q = blocked.model.layers[0].self_attn.q_proj.weight
        assert q.grad.data_ptr() == GRADIENT_HOMES[q].data_ptr()  # the linear layers' and the head's: in the block
        embed = blocked.model.embed_tokens.weight  # tied to the head, added into by both in place
        assert embed.grad.data_ptr() == GRADIENT_HOMES[embed].data_ptr()


def test_a_weight_no_backward_reaches_keeps_no_gradient():
    torch.set_num_threads(1)
    m = model()
    gradient_block([p for p in m.parameters() if p.requires_grad])
    lp, _ = token_logprobs(m, *data(0), chunked_head=KEEP_LOGITS)
    lp.sum().backward()
    assert m.model.layers[1].mlp.down_proj.weight.grad is not None
    m.zero_grad(set_to_none=True)
    m.model.layers[1].requires_grad_(False)  # out of this backward: AdamW must skip it, as it skips a None
    lp, _ = token_logprobs(m, *data(1), chunked_head=KEEP_LOGITS)
    lp.sum().backward()
    assert m.model.layers[1].mlp.down_proj.weight.grad is None


def test_adamw_takes_the_same_steps_with_its_moments_in_blocks_and_resumes_from_a_checkpoint(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    plain, blocked = model(), model()
    plain_opt, opt = adamw(plain), adamw(blocked)
    gradient_block([p for p in blocked.parameters() if p.requires_grad])
    params = list(blocked.parameters())
    n = sum(p.numel() for p in params)
    assert moment_blocks(opt) == 2 * 4 * n
    exp_avg = opt.state[params[0]]["exp_avg"].untyped_storage()
    assert exp_avg.nbytes() == 4 * n  # one block for every weight's first moment
    train(plain, plain_opt, range(3))
    train(blocked, opt, range(3))
    for a, b in zip(plain.parameters(), blocked.parameters()):
        assert torch.equal(a, b)
    for p in params:
        assert in_block(opt.state[p]["exp_avg"], exp_avg.data_ptr(), exp_avg.nbytes())
        assert float(opt.state[p]["step"]) == 3.0

    clones = []
    real = torch.Tensor.clone
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "clone", lambda t, *a, **k: clones.append(t.shape) or real(t, *a, **k))
        save_state(tmp_path, "optimizer", opt.state_dict(), tensor_file=True)
    assert clones == []  # the moments' views of one block are saved as they are, not copied first
    resumed = copy.deepcopy(blocked)
    resumed_opt = adamw(resumed)
    assert moments_in_blocks(resumed_opt)  # as the trainer sets it up: the loaded state goes into blocks
    resumed_opt.load_state_dict(load_state(tmp_path, "optimizer"))
    after_load(resumed_opt)
    block = resumed_opt.state[list(resumed.parameters())[0]]["exp_avg"].untyped_storage()
    assert block.nbytes() == 4 * n  # copied into blocks again
    train(plain, plain_opt, range(3, 5))
    train(resumed, resumed_opt, range(3, 5))
    for a, b in zip(plain.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_tensors_that_share_memory_are_still_saved_once_each(tmp_path):
    maps = torch.arange(6.0)  # bitsandbytes' 8-bit state: every weight's entry points at the same quantization map
    block = torch.arange(10.0)
    state = {"a": maps, "b": maps, "c": block[:4], "d": block[4:], "e": block[2:6]}
    save_state(tmp_path, "s", state, tensor_file=True)
    loaded = load_state(tmp_path, "s")
    for k, t in state.items():
        assert torch.equal(loaded[k], t), k


def test_another_optimizer_keeps_its_own_state():
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    assert moment_blocks(sgd) == 0 and len(sgd.state) == 0


@pytest.mark.parametrize("micro_batch_size, blocked", [(4, True), (8, False)], ids=["two micro-batches", "one"])
def test_the_trainer_keeps_a_gradient_block_where_the_gradients_outlive_a_micro_batch(micro_batch_size, blocked):
    # with one micro-batch a step the gradients are dead between steps, and the heap gives their memory to the next
    # forward's activations (the quickstart's peak: 3.13 GiB without the block, 3.20 with it); AdamW's moments live
    # all run long either way
    from accelerate import Accelerator

    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.setup import build_policy

    recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml", [f"train.micro_batch_size={micro_batch_size}"])
    policy = build_policy(recipe, Accelerator(cpu=True), None)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    assert params and all((p in GRADIENT_HOMES) == blocked for p in params)
    state = policy.optimizer.optimizer.state
    assert len(state) == 0  # until the first step, as AdamW's own: a run that never stepped saves no state
    for p in params:
        p.grad = torch.zeros_like(p)
    policy.optimizer.step()
    first = state[params[0]]["exp_avg"].untyped_storage()
    assert all(state[p]["exp_avg"].untyped_storage().data_ptr() == first.data_ptr() for p in params)
