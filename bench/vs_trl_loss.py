"""grpo's loss and gradients against TRL 1.16's GRPOTrainer._compute_loss, on identical rollouts, for every loss
type and the options that change them (KL, bias-corrected KL, the sampler correction, the off-policy mask, the
entropy bonus static and adaptive, the top-entropy mask), and the outcome advantages against TRL's formula.

    python bench/vs_trl.py --setup        # once: TRL 1.16 in bench/.venv-trl
    python bench/vs_trl_loss.py           # ~1 minute on 2 cores

Both sides load the same tiny random Qwen2 (grpo's builtin:tiny-qwen2 folder) and see the same prompt and
completion ids, masks, advantages, old / reference / sampler log-probs. grpo's side runs its real update step
(PolicyUpdate.window and _micro_step: one micro-batch, or two accumulated into one optimizer step, the entropy
controller stepped as after an optimizer step); TRL's side runs GRPOTrainer._compute_loss and backward per
micro-batch with gradient_accumulation_steps set (bench/vs_trl_loss_trl.py, in TRL's venv); mini-batch cases (issue
38): TRL's steps_per_generation over gradient_accumulation_steps against train.mini_batches, each optimizer step's
gradient and the weights after it (a plain SGD step on both sides). Per case: the loss,
the largest gradient difference relative to the largest gradient, the entropy coefficient after each call, and
the metrics both log. Ends with one line: the worst difference over every case.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRL_PYTHON = ROOT / "bench" / ".venv-trl" / "bin" / "python"
G, B, T, TEMPERATURE = 4, 2, 6, 0.9
OLD, REF, SAMPLING = "old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"
IS_RATIO = "importance_sampling_ratio"
CAP = 2.0
FLOOR = 0.95  # the sampler correction's lower bound in its table (TRL's vllm_importance_sampling_clip_min)
SGD_LR = 1.0  # the step between two mini-batches (both sides): large enough that the second's ratios are not 1


def case(name, trl, ours, inputs=(OLD,), calls=1, trl_vllm_correction=False, micro_batches=1, mini_batches=1):
    """TRL's GRPOConfig fields, grpo's overrides of recipes/ci-tiny.yaml (epsilon 0.2, epsilon_high 0.28; TRL's
    use_bias_correction_kl default true is set false unless a case turns it on). `micro_batches` > 1: each call is
    one optimizer step's gradient accumulation over that many micro-batches (TRL's gradient_accumulation_steps).
    `mini_batches` > 1: the rows are that many optimizer steps' (TRL's steps_per_generation = micro_batches x
    mini_batches; grpo's train.mini_batches), one call each, an SGD step of SGD_LR between them on both sides."""
    return {"name": name, "trl": {"use_bias_correction_kl": False, "epsilon": 0.2, "epsilon_high": 0.28, **trl},
            "ours": ours, "inputs": list(inputs), "calls": calls, "trl_vllm_correction": trl_vllm_correction,
            "micro_batches": micro_batches, "mini_batches": mini_batches}


def accumulated(c: dict) -> dict:
    """The case as 2 micro-batches of 4 rows (unequal token counts: 21 and 16) accumulated into each step."""
    return {**c, "name": f"{c['name']} [2 micro-batches]", "micro_batches": 2}


def mini(c: dict) -> dict:
    """The case as 2 optimizer steps of 2 micro-batches of 2 rows each on one generation batch (issue 38), the old
    policy's log-probs the batch's (given: TRL computes them at generation when steps_per_generation > accumulation)."""
    return {**c, "name": f"{c['name']} [2 mini-batches x 2 micro-batches]", "micro_batches": 2, "mini_batches": 2,
            "calls": 2, "ours": [*c["ours"], "train.mini_batches=2"], "inputs": sorted({*c["inputs"], OLD})}


def cases() -> list[dict]:
    out = []
    for loss in ("grpo", "bnpo", "dr_grpo", "dapo", "sapo"):
        out.append(case(f"{loss}", {"loss_type": loss}, [f"algorithm.loss_type={loss}"]))
    out += [
        case("grpo on-policy (no old log-probs)", {"loss_type": "grpo"}, ["algorithm.loss_type=grpo"], inputs=()),
        case("cispo", {"loss_type": "cispo", "epsilon_high": 5.0}, ["algorithm.loss_type=cispo", "algorithm.epsilon_high=5.0"]),
        case("grpo beta 0.04", {"loss_type": "grpo", "beta": 0.04}, ["algorithm.loss_type=grpo", "algorithm.beta=0.04"],
             inputs=(OLD, REF)),
        case("dapo beta 0.04 bias-corrected KL", {"loss_type": "dapo", "beta": 0.04, "use_bias_correction_kl": True},
             ["algorithm.beta=0.04", "algorithm.use_bias_correction_kl=true"], inputs=(OLD, REF)),
        case("grpo GSPO (sequence ratio)", {"loss_type": "grpo", "importance_sampling_level": "sequence"},
             ["algorithm.loss_type=grpo", "algorithm.importance_sampling_level=sequence"]),
        case("luspo", {"loss_type": "luspo", "importance_sampling_level": "sequence"},
             ["algorithm.loss_type=luspo", "algorithm.importance_sampling_level=sequence"]),
        case("vespo", {"loss_type": "vespo"}, ["algorithm.loss_type=vespo"]),
        case("vespo k/lambda set", {"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_pos": 1.5,
                                    "vespo_k_neg": 4.0, "vespo_lambda_neg": 0.5},
             ["algorithm.loss_type=vespo", "algorithm.vespo_k_pos=1.0", "algorithm.vespo_lambda_pos=1.5",
              "algorithm.vespo_k_neg=4.0", "algorithm.vespo_lambda_neg=0.5"]),
        case("vespo + sampler ratio (token_truncate)", {"loss_type": "vespo", "vllm_importance_sampling_cap": CAP},
             ["algorithm.loss_type=vespo", f"rollout.importance_sampling_cap={CAP}"], inputs=(OLD, SAMPLING, IS_RATIO)),
        case("dapo + sampler ratio (token_truncate)", {"loss_type": "dapo", "vllm_importance_sampling_cap": CAP},
             [f"rollout.importance_sampling_cap={CAP}"], inputs=(OLD, SAMPLING, IS_RATIO), trl_vllm_correction=True),
        case("dapo + off-policy mask 0.02", {"loss_type": "dapo", "off_policy_mask_threshold": 0.02},
             ["algorithm.off_policy_mask_threshold=0.02", "rollout.importance_sampling=none"], inputs=(OLD, SAMPLING)),
        case("dapo + entropy_coef 0.05", {"loss_type": "dapo", "entropy_coef": 0.05}, ["algorithm.entropy_coef=0.05"]),
        case("grpo + top_entropy_quantile 0.5", {"loss_type": "grpo", "top_entropy_quantile": 0.5},
             ["algorithm.loss_type=grpo", "algorithm.top_entropy_quantile=0.5"]),
        case("grpo + entropy_coef 0.05 + top_entropy_quantile 0.5",
             {"loss_type": "grpo", "entropy_coef": 0.05, "top_entropy_quantile": 0.5},
             ["algorithm.loss_type=grpo", "algorithm.entropy_coef=0.05", "algorithm.top_entropy_quantile=0.5"]),
        case("vespo + entropy_coef 0.05", {"loss_type": "vespo", "entropy_coef": 0.05},
             ["algorithm.loss_type=vespo", "algorithm.entropy_coef=0.05"]),
        case("adaptive entropy, H below target (3 steps)",
             {"loss_type": "dapo", "entropy_coef": 0.01, "use_adaptive_entropy": True, "entropy_target": 100.0,
              "entropy_coef_delta": 0.02},
             ["algorithm.entropy_coef=0.01", "algorithm.use_adaptive_entropy=true", "algorithm.entropy_target=100",
              "algorithm.entropy_coef_delta=0.02"], calls=3),
        case("adaptive entropy, H above target (3 steps)",
             {"loss_type": "grpo", "entropy_coef": 0.05, "use_adaptive_entropy": True, "entropy_target": 1.0},
             ["algorithm.loss_type=grpo", "algorithm.entropy_coef=0.05", "algorithm.use_adaptive_entropy=true",
              "algorithm.entropy_target=1.0"], calls=3),
    ]
    # issue 35: every statistic taken over micro-batches, under gradient accumulation (the loss types' normalisers,
    # the entropy bonus static and adaptive, the top-entropy threshold)
    accumulate = ("grpo", "bnpo", "dr_grpo", "dapo", "sapo", "cispo", "luspo", "vespo", "dapo + entropy_coef 0.05",
                  "grpo + top_entropy_quantile 0.5", "grpo + entropy_coef 0.05 + top_entropy_quantile 0.5",
                  "grpo beta 0.04", "adaptive entropy, H below target (3 steps)",
                  "adaptive entropy, H above target (3 steps)")
    minis = ("grpo", "bnpo", "dr_grpo", "dapo", "sapo", "cispo", "luspo", "vespo", "grpo beta 0.04",
             "dapo + sampler ratio (token_truncate)")
    return out + [accumulated(c) for c in out if c["name"] in accumulate] + [mini(c) for c in out if c["name"] in minis]


def make_inputs(model_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.algo.logprobs import token_logprobs

    g = torch.Generator().manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    enc = tok(["What is 12 + 7? Answer with a number.", "What is 3 + 4?"], return_tensors="pt", padding=True)
    prompt_ids = enc["input_ids"].repeat_interleave(G, 0)
    prompt_mask = enc["attention_mask"].repeat_interleave(G, 0)
    N = B * G
    completion_ids = torch.randint(3, tok.vocab_size, (N, T), generator=g)
    lengths = torch.tensor([6, 4, 5, 6, 3, 6, 2, 5])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        lp, _ = token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=TEMPERATURE)
    old = lp + 0.15 * torch.randn(N, T, generator=g)
    sampling = old + 0.1 * torch.randn(N, T, generator=g)
    ratio = torch.clamp(torch.exp((old - sampling) * completion_mask), max=CAP)  # TRL's token_truncate
    # rewards for the advantages: 64 groups of 8, a quarter of them flat (equal rewards), others rounded draws
    rewards = (torch.rand(64, 8, generator=g) * 10).round(decimals=1)
    rewards[::4] = rewards[::4, :1]
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.randn(N, generator=g), OLD: old,
            REF: lp + 0.2 * torch.randn(N, T, generator=g), SAMPLING: sampling, IS_RATIO: ratio,
            "rewards": rewards.view(-1), "reward_group": 8}


def ours(c: dict, x: dict, run_dir: Path) -> list[dict]:
    """grpo's update step on the case's rows: per call the loss, the gradients, the coefficient, the metrics."""
    import torch

    from grpo_cli.datatypes import Rollout
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.engine import Engine
    from grpo_cli.trainer.reporting import MetricSums

    N, K, M = B * G, c["micro_batches"], c["mini_batches"]
    recipe = load_recipe("recipes/ci-tiny.yaml", [
        f"algorithm.num_generations={G}", f"train.prompts_per_step={B}", f"train.micro_batch_size={N // (K * M)}",
        f"rollout.max_completion_length={T}", f"rollout.temperature={TEMPERATURE}", "checkpoint.every_steps=0",
        "train.threads=1", *c["ours"]])
    eng = Engine(recipe, run_dir)
    update, policy = eng.update, eng.policy
    rollout = Rollout(x["prompt_ids"], x["prompt_mask"], x["completion_ids"], x["completion_mask"],
                      truncated=torch.zeros(N, dtype=torch.bool), prompts=[""] * N, completions=[""] * N,
                      sampling_logps=x[SAMPLING] if SAMPLING in c["inputs"] else None)
    mask = x["completion_mask"]
    # the optimizer step's window as PolicyUpdate builds it (its normaliser), its micro-batches as it runs them
    w = update.window(rollout, x["advantages"], mask, K, old=x[OLD] if OLD in c["inputs"] else None,
                      ref=x[REF] if REF in c["inputs"] else None, mini_batches=M)
    policy.train()
    calls = []
    for call in range(c["calls"]):
        policy.zero_grad(set_to_none=True)
        sums = MetricSums()
        R, start = N // M, (call % M) * (N // M)  # the mini-batch's rows
        for k in range(K):
            update._micro_step(w, slice(start + k * R // K, start + (k + 1) * R // K), sums, first=True)
        grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
        if M > 1:  # the same plain step on both sides, so the next mini-batch's policy is the same
            with torch.no_grad():
                for n, p in policy.named_parameters():
                    if p.grad is not None:
                        p -= SGD_LR * p.grad
        weights = {n: p.detach().clone() for n, p in policy.named_parameters()} if M > 1 else {}
        if update.entropy is not None:  # what PolicyUpdate does after each optimizer step
            total, tokens = w.entropy_sums
            update.entropy.step(total / max(tokens, 1.0))
            w.entropy_sums = [0.0, 0.0]
        m = sums.means(eng.procs)
        calls.append({"loss": m["loss"], "grads": grads, "metrics": m, "weights": weights,
                      "entropy_coef": update.entropy.coef if update.entropy is not None else 0.0})
    eng.close()
    return calls


SHARED_METRICS = ("entropy", "kl", "clip_ratio/region_mean", "vespo/phi_seq_mean", "entropy_coef",
                  "policy_loss", "off_policy_mask/masked_token_fraction")


def compare(a: list[dict], b: list[dict], micro_batches: int) -> dict:
    """With micro-batches, TRL logs each one's means and averages those, where grpo takes the means over the
    window's tokens (or sequences) whatever the split: those metrics are shown, not counted in the verdict."""
    rel_grad, loss_diff, metric_diff, weight_diff, coefs = 0.0, 0.0, 0.0, 0.0, []
    for x, y in zip(a, b):
        scale = max(max(g.abs().max().item() for g in y["grads"].values()), 1e-12)
        diff = max((x["grads"][n] - y["grads"][n]).abs().max().item() for n in y["grads"])
        rel_grad = max(rel_grad, diff / scale)
        loss_diff = max(loss_diff, abs(x["loss"] - y["loss"]))
        for k in SHARED_METRICS:
            if k in x["metrics"] and k in y["metrics"] and k != "entropy_coef":
                metric_diff = max(metric_diff, abs(x["metrics"][k] - y["metrics"][k]))
        coefs.append((x["entropy_coef"], y["entropy_coef"]))
        weights = max([(x["weights"][n] - y["weights"][n]).abs().max().item() for n in x["weights"]], default=0.0)
        weight_diff = max(weight_diff, weights)
    return {"loss": a[-1]["loss"], "trl_loss": b[-1]["loss"], "loss_abs": loss_diff, "grad_rel": rel_grad,
            "weights_abs": weight_diff,
            "metric_abs": metric_diff, "metrics_counted": micro_batches == 1, "coefs": coefs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trl-python", default=str(TRL_PYTHON))
    args = ap.parse_args()
    if not Path(args.trl_python).exists():
        raise SystemExit("TRL's venv is missing: python bench/vs_trl.py --setup")
    import torch

    from grpo_cli.algo.advantages import compute_advantages, groups_with_signal
    from grpo_cli.models.builtin import builtin_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "model").symlink_to(builtin_model("tiny-qwen2"))
        x = make_inputs(folder / "model")
        spec = cases()
        (folder / "cases.json").write_text(json.dumps({"cases": spec, "G": G, "temperature": TEMPERATURE,
                                                       "sgd_lr": SGD_LR, "cap": CAP, "floor": FLOOR}))
        torch.save(x, folder / "inputs.pt")
        subprocess.run([args.trl_python, str(ROOT / "bench" / "vs_trl_loss_trl.py"), str(folder)], check=True)
        trl = torch.load(folder / "trl.pt")
        rows = [(c, compare(ours(c, x, folder / f"run{i}"), trl["cases"][c["name"]], c["micro_batches"]))
                for i, c in enumerate(spec)]

    print(f"grpo vs TRL {trl['trl']} GRPOTrainer._compute_loss, tiny Qwen2, {B * G} rows x {T} tokens, fp32; "
          "[2 micro-batches]: 4 rows each, accumulated into one optimizer step (gradient_accumulation_steps 2); "
          "[2 mini-batches x 2 micro-batches]: one generation batch, 2 optimizer steps of 2 micro-batches of 2 rows "
          f"(TRL's steps_per_generation 4, gradient_accumulation_steps 2; grpo's train.mini_batches 2), an SGD step "
          f"of {SGD_LR} after each on both sides, the old log-probs the batch's\n")
    print("| case | loss grpo | loss TRL | loss abs. diff | max grad diff / max grad | weights after each step: max abs. "
          "diff | metrics max abs. diff | entropy_coef after each call (grpo / TRL) |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for c, r in rows:
        name = c["name"]
        coefs = ", ".join(f"{a:.3f}/{b:.3f}" for a, b in r["coefs"]) if "entropy_coef" in c["trl"] else "-"
        worst = max(worst, r["loss_abs"], r["grad_rel"], r["weights_abs"], r["metric_abs"] if r["metrics_counted"] else 0.0)
        worst = max(worst, max((abs(a - b) for a, b in r["coefs"]), default=0.0))
        shown = f"{r['metric_abs']:.1e}" + ("" if r["metrics_counted"] else " *")
        weights = f"{r['weights_abs']:.1e}" if c["mini_batches"] > 1 else "-"
        print(f"| {name} | {r['loss']:.6f} | {r['trl_loss']:.6f} | {r['loss_abs']:.1e} | {r['grad_rel']:.1e} | {weights} | "
              f"{shown} | {coefs} |")
    print("\n\\* 2 micro-batches: TRL logs each micro-batch's token means and averages them, grpo the mean over "
          "the step's tokens; the loss (TRL: the micro-batch losses summed, as its Trainer logs), gradients and "
          "coefficients are compared")

    # the sampler correction's weights, with and without a lower bound (issue 38 item 5): TRL's lines vs grpo's
    from grpo_cli.algo.losses import sampler_correction

    mask = x["completion_mask"]
    print("\n| importance_sampling | lower bound | weights: max abs diff | tokens below the bound (share) |")
    print("|---|---|---|---|")
    for key, theirs in trl["sampler_weights"].items():
        mode, floor = key.split()
        floor = None if floor == "None" else float(floor)
        w, rho = sampler_correction(x[OLD], x[SAMPLING], mask, mode, CAP, floor)
        diff = ((w - theirs) * mask).abs().max().item()
        worst = max(worst, diff)
        below = ((rho < floor).float() * mask).sum().item() / mask.sum().item() if floor is not None else 0.0
        print(f"| {mode} | {floor} | {diff:.1e} | {below:.2f} |")

    # outcome advantages: TRL's float32 formula vs grpo's, groups with signal and flat groups apart
    rewards, Gr = x["rewards"], x["reward_group"]
    signal = torch.tensor(groups_with_signal(rewards, Gr)).repeat_interleave(Gr)
    print("\n| scale_rewards | groups with signal: max abs diff | flat groups: max abs TRL | flat groups: max abs grpo |")
    print("|---|---|---|---|")
    for scale in ("group", "batch", "none"):
        a, b = compute_advantages(rewards, Gr, scale), trl["advantages"][scale]
        with_signal = (a - b)[signal].abs().max().item()
        worst = max(worst, with_signal)
        print(f"| {scale} | {with_signal:.1e} | {b[~signal].abs().max().item():.1e} | {a[~signal].abs().max().item():.1e} |")
    verdict = "equal" if worst < 1e-5 else "DIFFERENT"
    print(f"\nworst difference over {len(rows)} loss cases (loss, metrics, coefficients absolute; gradients relative "
          f"to the largest), 8 sampler corrections and 3 advantage scales: {worst:.1e} ({verdict} to float32 precision; flat groups aside, "
          "where grpo gives 0 and TRL its float32 rounding)")
    if not math.isfinite(worst) or worst >= 1e-5:
        sys.exit(1)


if __name__ == "__main__":
    main()
