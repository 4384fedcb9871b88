"""TRL's side of `bench/vs_trl_loss.py`: GRPOTrainer._compute_loss on the rollouts grpo's side wrote, per case.
Runs in bench/.venv-trl, not grpo's venv.

    bench/.venv-trl/bin/python bench/vs_trl_loss_trl.py DIR

DIR holds cases.json (each case's GRPOConfig fields and calls), inputs.pt (the tensors) and model/ (the policy);
writes trl.pt: per case and call TRL's loss, its gradient by parameter name, the entropy coefficient after the
call, and its logged metrics; and the advantages of TRL's sum_then_normalize formula on the reward batches.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def trl_advantages(rewards, G: int, scale: str):
    """TRL 1.16's sum_then_normalize lines (GRPOTrainer._generate_and_score_completions), on [N] rewards."""
    import torch
    from trl.trainer.utils import nanstd

    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return adv


def trl_sampler_weights(old, sampling, mask, mode: str, clip_min, clip_max):
    """TRL 1.16's vLLM importance-sampling lines (GRPOTrainer._generate_and_score_completions), as written there."""
    import math

    import torch

    per_token_logps_diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    return ratio.expand_as(old)


def main() -> None:
    folder = Path(sys.argv[1])
    import torch

    torch.set_num_threads(1)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    transformers.utils.logging.set_verbosity_error()
    cases = json.loads((folder / "cases.json").read_text())
    inputs = torch.load(folder / "inputs.pt")
    tok = AutoTokenizer.from_pretrained(folder / "model", padding_side="left")
    dataset = Dataset.from_list([{"prompt": "What is 1 + 1?"}] * 8)
    results = {"trl": trl.__version__, "cases": {}}
    for case in cases["cases"]:
        N, K, M = inputs["completion_ids"].shape[0], case.get("micro_batches", 1), case.get("mini_batches", 1)
        args = GRPOConfig(output_dir=str(folder / "trl-output"), use_cpu=True, bf16=False, report_to="none",
                          per_device_train_batch_size=N // (K * M), gradient_accumulation_steps=K,
                          steps_per_generation=K * M,
                          num_generations=cases["G"], max_completion_length=inputs["completion_ids"].shape[1],
                          temperature=cases["temperature"], **case["trl"])
        trainer = GRPOTrainer(model=str(folder / "model"), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=args, train_dataset=dataset, processing_class=tok)
        trainer.current_gradient_accumulation_steps = K  # set by train(): the micro-batches of an optimizer step
        if case.get("trl_vllm_correction"):  # the correction TRL applies to vLLM rollouts, without a vLLM
            trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
        model = trainer.model
        model.train()
        batch = {k: inputs[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
        for key in case["inputs"]:  # old_per_token_logps, ref_per_token_logps, sampling_per_token_logps, ...
            batch[key] = inputs[key]
        calls = []
        for call in range(case.get("calls", 1)):
            model.zero_grad(set_to_none=True)
            trainer._metrics["train"].clear()
            loss = 0.0
            R, start = N // (K * M), (call % M) * (N // M)  # a micro-batch's rows; the mini-batch's first
            for k in range(K):  # one optimizer step: its micro-batches accumulated, as Trainer.training_step does
                micro = {key: v[start + k * R : start + (k + 1) * R] for key, v in batch.items()}
                micro["num_items_in_batch"] = inputs["completion_mask"].sum()  # over the whole generation batch
                trainer.accelerator.gradient_state._set_sync_gradients(k == K - 1)  # the window's last: a step
                micro_loss = trainer._compute_loss(model, micro)
                micro_loss.backward()
                loss += micro_loss.item()  # what the Trainer logs: the micro-batch losses summed
            calls.append({
                "loss": loss,
                "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
                "entropy_coef": trainer.entropy_coef,
                "metrics": {k: sum(v) / len(v) for k, v in trainer._metrics["train"].items() if v},
            })
            if M > 1:  # the step bench/vs_trl_loss.py takes on grpo's side
                with torch.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            p -= cases["sgd_lr"] * p.grad
                calls[-1]["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer.accelerator.gradient_state._set_sync_gradients(True)
        results["cases"][case["name"]] = calls
    results["sampler_weights"] = {
        f"{mode} {clip_min}": trl_sampler_weights(inputs["old_per_token_logps"], inputs["sampling_per_token_logps"],
                                                  inputs["completion_mask"], mode, clip_min, cases["cap"])
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
        for clip_min in (None, cases["floor"])}
    results["advantages"] = {f"{scale}": trl_advantages(inputs["rewards"], inputs["reward_group"], scale)
                             for scale in ("group", "batch", "none")}
    torch.save(results, folder / "trl.pt")


if __name__ == "__main__":
    main()
