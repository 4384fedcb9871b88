"""The training loop on a real tiny model: CLI run, learning, accumulation equivalence, exact resume."""

import signal
import time
from pathlib import Path

import pytest
import torch

from grpo_cli.algo.advantages import normalize_then_sum
from grpo_cli.errors import SetupError
from grpo_cli.recipe.files import load_recipe
from grpo_cli.trainer.engine import Engine

from helpers import cli, popen, read_jsonl, stable

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"
pytestmark = pytest.mark.usefixtures("model_cache")


@pytest.mark.slow
def test_ci_tiny_through_the_cli(tmp_path):
    run = tmp_path / "run"
    p = cli("train", str(TINY), "-o", str(run), "eval={limit: 2, max_new_tokens: 4}")
    assert p.returncode == 0, p.stderr
    # a generator recipe without eval.files evaluates on its own generator, and says so once
    assert p.stderr.count("eval: not held out: generator arithmetic (seed 1234) is the training generator") == 1
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and "eval/accuracy" in metrics[-1]
    for key in ("reward", "reward_std", "frac_reward_zero_std", "rewards/accuracy/mean", "rewards/digit_fraction/mean",
                "completions/mean_length", "completions/clipped_ratio", "entropy", "clip_ratio/region_mean",
                "grad_norm", "learning_rate", "time/generate", "time/score", "time/train", "time/step"):
        assert key in metrics[0], key
    assert metrics[0]["learning_rate"] == pytest.approx(1e-3)
    rollouts = read_jsonl(run / "rollouts.jsonl")
    assert len(rollouts) == 4 * 8  # 4 steps of B*G = 2*4 completions
    r = rollouts[0]
    assert set(r) >= {"step", "group", "prompt", "completion", "answer", "rewards", "reward", "advantage", "length", "truncated"}
    # the logged advantages are the group-normalised logged rewards
    from grpo_cli.algo.advantages import compute_advantages

    step1 = [x for x in rollouts if x["step"] == 1]
    adv = compute_advantages(torch.tensor([x["reward"] for x in step1]), 4, "group")
    assert torch.allclose(adv, torch.tensor([x["advantage"] for x in step1]), atol=1e-5)
    # keep_last=2 with every_steps=2: step-2 and step-4; each a loadable HF model with its recipe
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step-2", "step-4"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints/step-4")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert load_recipe(run / "checkpoints/step-4/trainer/recipe.yaml").name == "ci-tiny"
    # a second start into the same folder must not clobber it
    p = cli("train", str(TINY), "-o", str(run))
    assert p.returncode == 2 and "--resume auto" in p.stderr and "--start-over" in p.stderr
    assert "Traceback" not in p.stderr


def test_tiny_model_learns_a_movable_reward(tmp_path):
    r = load_recipe(TINY, [
        "rewards=[{name: 'recipes/rewards/toy.py:digit_fraction'}]", "train.max_steps=30", "train.learning_rate=3e-3",
        "train.prompts_per_step=4", "train.micro_batch_size=16", "checkpoint.every_steps=0", "logging.rollouts=false",
    ])
    Engine(r, tmp_path / "run").fit()
    rewards = [m["reward"] for m in read_jsonl(tmp_path / "run/metrics.jsonl")]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, (first, last)


def capture_grads(engine: Engine) -> list[list[torch.Tensor]]:
    """A copy of the accumulated gradient at each optimizer step, before it is clipped: accelerate's clipping
    (every optimizer step goes through it) is wrapped on this engine's accelerator."""
    grads: list[list[torch.Tensor]] = []
    clip = engine.accelerator.clip_grad_norm_

    def capture(parameters, max_norm):
        grads.append([p.grad.detach().clone() for p in engine.policy.parameters()])
        return clip(parameters, max_norm)

    engine.accelerator.clip_grad_norm_ = capture
    return grads


def _grads_of_one_step(tmp_path, name, overrides):
    """The gradient of step 1's (last) optimizer step, and the step's logged loss."""
    r = load_recipe(TINY, ["train.max_steps=1", "checkpoint.every_steps=0", "logging.rollouts=false", *overrides])
    e = Engine(r, tmp_path / name)
    grads = capture_grads(e)
    e.fit()
    return grads[-1], read_jsonl(tmp_path / name / "metrics.jsonl")[0]["loss"]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_micro_batches_equal_one_big_batch(tmp_path, loss_type):
    # Same seed -> same rollouts; only the accumulation window is cut differently.
    extra = [f"algorithm.loss_type={loss_type}", *(["algorithm.epsilon_high=5.0"] if loss_type == "cispo" else [])]
    big, big_loss = _grads_of_one_step(tmp_path, "big", ["train.micro_batch_size=8", *extra])
    small, small_loss = _grads_of_one_step(tmp_path, "small", ["train.micro_batch_size=2", *extra])
    assert max(g.abs().max().item() for g in big) > 1e-3  # a real gradient, not zeros
    diff = max((a - b).abs().max().item() for a, b in zip(big, small))
    assert diff < 1e-6, diff
    # the logged loss is the step's objective however it is cut (issue 35: dapo and cispo logged 1 / micro-batches);
    # mu = 2 makes it more than float noise (on-policy, group-centred advantages give a loss of 0)
    extra += ["algorithm.num_iterations=2", "train.learning_rate=0.05"]
    big, big_loss = _grads_of_one_step(tmp_path, "big2", ["train.micro_batch_size=8", *extra])
    small, small_loss = _grads_of_one_step(tmp_path, "small2", ["train.micro_batch_size=2", *extra])
    assert abs(big_loss) > 1e-4 and small_loss == pytest.approx(big_loss, rel=1e-4)


def count_no_grad_forwards(monkeypatch) -> list[int]:
    """Micro-batches the updates run without autograd (old policy, reference), counted where the update calls them."""
    import grpo_cli.trainer.update as update_module

    counted, real = [], update_module.logps_no_grad
    monkeypatch.setattr(update_module, "logps_no_grad",
                        lambda model, rollout, slices, **kw: counted.append(len(slices)) or real(model, rollout, slices, **kw))
    return counted


def test_mu_2_takes_the_old_policy_from_iteration_0_without_a_forward_of_its_own(tmp_path, monkeypatch):
    import grpo_cli.trainer.update as update_module

    r = load_recipe(TINY, ["train.max_steps=2", "checkpoint.every_steps=0", "logging.rollouts=false",
                           "algorithm.num_iterations=3", "train.micro_batch_size=4", "train.learning_rate=3e-3"])
    counted = count_no_grad_forwards(monkeypatch)
    reused = Engine(r, tmp_path / "reused")
    reused.fit()
    reused_forwards, counted[:] = sum(counted), []
    # a model with dropout gets a separate old-policy forward; this one has none, so both give the same numbers
    monkeypatch.setattr(update_module, "has_dropout", lambda model: True)
    separate = Engine(r, tmp_path / "separate")
    separate.fit()
    assert (reused_forwards, sum(counted)) == (0, 2 * 2)  # 2 steps x 2 micro-batches
    assert reused.optimizer.param_groups[0]["fused"] is True  # one AdamW kernel for all tensors (not sharded)
    a, b = read_jsonl(tmp_path / "reused/metrics.jsonl"), read_jsonl(tmp_path / "separate/metrics.jsonl")
    assert [m["reward"] for m in a] == [m["reward"] for m in b]  # same rollouts at step 2: same updates at step 1
    assert max(m["clip_ratio/region_mean"] for m in a) > 0  # iterations 1-2 moved the ratios off 1: old logps used
    for pa, pb in zip(reused.policy.parameters(), separate.policy.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_sigterm_saves_then_resume_matches_uninterrupted_run(tmp_path):
    common = ["train.max_steps=24", "checkpoint.every_steps=100", "algorithm.num_iterations=2", "algorithm.beta=0.05",
              "train.scheduler=linear", "train.warmup_steps=3", "rollout.max_completion_length=24",
              "eval={every_steps: 5, limit: 4, num_samples: 2}"]  # eval samples under its own RNG
    full = cli("train", str(TINY), "-o", str(tmp_path / "full"), *common)
    assert full.returncode == 0, full.stderr

    run = tmp_path / "cut"
    stderr = tmp_path / "cut.err"
    proc = popen("train", TINY, "-o", run, *common, cwd=ROOT, stdout=open(tmp_path / "cut.out", "w"),
                 stderr=open(stderr, "w"))
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == 143, stderr.read_text()
    (ckpt,) = (run / "checkpoints").iterdir()
    k = int(ckpt.name.split("-")[1])
    assert 3 <= k < 24, k
    assert len(read_jsonl(metrics)) == k

    resumed = cli("train", str(TINY), "-o", str(run), "--resume", "auto", *common)
    assert resumed.returncode == 0, resumed.stderr
    a, b = read_jsonl(tmp_path / "full/metrics.jsonl"), read_jsonl(metrics)
    assert [m["step"] for m in b] == list(range(1, 25))
    assert [stable(m) for m in a] == [stable(m) for m in b]
    ra, rb = read_jsonl(tmp_path / "full/rollouts.jsonl"), read_jsonl(run / "rollouts.jsonl")
    assert [x["completion"] for x in ra] == [x["completion"] for x in rb]
    assert any(m["kl"] > 0 for m in b[k:])  # the reference model was restored and used after resume
    assert [m["step"] for m in b if "eval/accuracy" in m] == [5, 10, 15, 20, 24]


def test_uneven_process_split_is_a_setup_error(tmp_path):
    r = load_recipe(TINY, ["train.micro_batch_size=8"])
    r = r.model_copy(update={"train": r.train.model_copy(update={"micro_batch_size": 3})})  # bypass validation
    with pytest.raises(SetupError, match="micro-batches"):
        Engine(r, tmp_path / "x")


@pytest.mark.slow
@pytest.mark.parametrize("estimator,scale", [("rloo", "none"), ("reinforce_plus_plus_baseline", "batch")])
def test_an_advantage_estimator_trains_and_logs_its_advantages(estimator, scale, tmp_path):
    # issue 36: algorithm.advantage_estimator, one entry per estimator (recipe/specs.py, algo/advantages.ESTIMATORS)
    from grpo_cli.algo.advantages import compute_advantages

    r = load_recipe(TINY, ["train.max_steps=2", "checkpoint.every_steps=0", "eval=null",
                           f"algorithm.advantage_estimator={estimator}", f"algorithm.scale_rewards={scale}"])
    Engine(r, tmp_path / "run").fit()
    rollouts = read_jsonl(tmp_path / "run/rollouts.jsonl")
    for step in (1, 2):
        rows = [x for x in rollouts if x["step"] == step]
        rewards = torch.tensor([x["reward"] for x in rows])
        expected = compute_advantages(rewards, r.algorithm.num_generations, scale, estimator)
        assert torch.allclose(torch.tensor([x["advantage"] for x in rows]), expected, atol=1e-5)
        assert not torch.allclose(expected, compute_advantages(rewards, r.algorithm.num_generations, scale, "grpo"))
    assert [m["step"] for m in read_jsonl(tmp_path / "run/metrics.jsonl")] == [1, 2]


@pytest.mark.usefixtures("model_cache")
def test_the_options_train_and_log(tmp_path):
    r = load_recipe("recipes/ci-tiny.yaml", [
        "train.max_steps=2", "checkpoint.every_steps=0", "algorithm.beta=0.04", "algorithm.num_iterations=2",
        "algorithm.use_bias_correction_kl=true", "algorithm.off_policy_mask_threshold=0.0",
        "algorithm.multi_objective_aggregation=normalize_then_sum",
    ])
    Engine(r, tmp_path / "run").fit()
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(0 <= m["off_policy_mask/masked_token_fraction"] <= 1 and m["kl"] >= 0 for m in metrics)
    rollouts = [x for x in read_jsonl(tmp_path / "run/rollouts.jsonl") if x["step"] == 1]
    per_function = torch.tensor([[x["rewards"][k] for k in sorted(x["rewards"])] for x in rollouts])
    weights = [w.weight for w in sorted(r.rewards, key=lambda s: s.name)]
    # the logged advantages are GDPO's of the logged per-function rewards
    expected = normalize_then_sum(per_function, weights, r.algorithm.num_generations)
    assert torch.allclose(torch.tensor([x["advantage"] for x in rollouts]), expected, atol=1e-5)
