"""What metrics.jsonl holds: every key a training step logs, what it measures and when it is there (TRL's names
where TRL has the metric). The docs' metrics page is made from this table, and a test checks that every key a
run logs has its row here. `<name>` is a reward function's log name (or a reward model's), `<k>` a number.

Values are over the whole generation batch (every process's rows) unless a row says otherwise; means over
tokens count the tokens the policy sampled (observation tokens of multi-turn episodes are left out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str  # the key, with <name> / <k> placeholders
    meaning: str
    when: str = "every step"
    group: str = ""


def _group(group: str, rows: list[tuple[str, str] | tuple[str, str, str]]) -> list[Metric]:
    return [Metric(*row, group=group) if len(row) == 3 else Metric(*row, "every step", group) for row in rows]


METRICS: list[Metric] = [
    *_group("rewards", [
        ("step", "The training step (1-based); every record has it."),
        ("reward", "Mean weighted reward of the step's completions: the outcome rewards plus each step-level reward's "
                   "mean step reward (a completion no reward function scored is left out)."),
        ("reward_std", "Mean over groups of the standard deviation of a group's rewards as `reward` counts them "
                       "(n - 1, as torch.std)."),
        ("frac_reward_zero_std", "Share of groups without signal: their rewards all equal (std <= 1e-6) and no "
                                 "step-level reward differs within them, so every advantage is exactly 0."),
        ("rewards/<name>/mean", "Mean of one reward function's values (step rewards: each completion's mean step reward)."),
        ("rewards/<name>/std", "Standard deviation of one reward function's values."),
        ("rewards/<name>/errors", "Calls of the function that raised and were skipped (on_error: skip).", "when > 0"),
        ("rewards/<name>/timeouts", "Calls killed at the reward's timeout_s.", "when > 0"),
        ("rewards/<name>/nonfinite", "NaN or infinite values turned into no reward (on_error: skip).", "when > 0"),
        ("rewards/<name>/failed", "Completions a judge or remote reward could not score, after its retries (no "
                                  "answer, an answer that did not parse), turned into no reward (on_error: skip).",
         "when > 0"),
        ("rewards/<name>/steps_per_completion", "Step rewards: steps per completion.", "rewards[].level: step"),
        ("rewards/<name>/frac_zero_std", "Step rewards: share of groups whose step rewards give no signal.",
         "rewards[].level: step"),
        ("distillation/reverse_kl", "On-policy distillation: the mean over the step's sampled tokens of log pi_student - "
                                    "log pi_teacher, the per-token KL(student || teacher) on the student's own samples.",
         "distillation"),
        ("curriculum/passed_over", "Rows data.curriculum passed over since the last step (their last group gave no "
                                   "signal, and their draw said so).", "data.curriculum"),
        ("curriculum/no_signal_rows", "Rows whose last group gave no signal (drawn with data.curriculum."
                                      "no_signal_weight when their turn comes).", "data.curriculum"),
        ("advantages/abs_mean", "Mean absolute advantage the update trained with: per completion the mean of |A_t| over "
                                "its sampled tokens (step rewards make A_t vary along it), averaged over completions."),
    ]),
    *_group("completions", [
        ("completions/mean_length", "Mean sampled tokens per completion."),
        ("completions/min_length", "Fewest sampled tokens of a completion."),
        ("completions/max_length", "Most sampled tokens of a completion."),
        ("completions/clipped_ratio", "Share of completions that hit the length limit (no EOS)."),
        ("completions/mean_terminated_length", "Mean length of the completions that ended with EOS (0 when none did)."),
        ("turns/mean", "Mean assistant turns per episode.", "rollout.environment, rollout.tools or rollout.agent"),
        ("turns/max", "Most assistant turns of an episode.", "rollout.environment, rollout.tools or rollout.agent"),
        ("episodes/samples", "Training samples per episode: an episode is split where the chat template changes "
                             "its history (Qwen3-style thinking templates).",
         "rollout.history_change: split on such a template"),
        ("environment/errors", "Episodes ended by an environment call that raised.", "rollout.environment"),
        ("environment/timeouts", "Episodes ended by an environment call past environment_timeout_s.",
         "rollout.environment"),
        ("tools/call_frequency", "Tool calls per episode.", "rollout.tools or an environment's methods"),
        ("tools/failure_frequency", "Share of tool calls that failed (malformed, unknown, raised, timed out).",
         "rollout.tools or an environment's methods"),
        ("agent/errors", "Agent programs that raised (their reward is missing, their episode cut).", "rollout.agent"),
        ("agent/timeouts", "Agent programs killed at rollout.agent_timeout_s (their episode cut where it was).",
         "rollout.agent"),
        ("agent/rewrites", "Requests whose history did not extend the one served: answered, not recorded (the "
                           "episode ends before them).", "rollout.agent"),
        ("agent/tool_call_frequency", "Tool calls the model wrote per episode (the program runs them).",
         "rollout.agent"),
    ]),
    *_group("update", [
        ("loss", "The step's objective as TRL logs it: each optimizer step's micro-batch losses as backpropagated, "
                 "summed, averaged over processes and over the mu optimizer steps (with the entropy bonus: "
                 "policy_loss minus the applied coefficient times the mean entropy). It changes with "
                 "train.micro_batch_size or the process count only where the objective does (docs/algorithms.md)."),
        ("policy_loss", "The loss without the entropy bonus.", "algorithm.entropy_coef != 0 or use_adaptive_entropy"),
        ("entropy_coef", "The entropy bonus's coefficient after the step's optimizer steps (mean over the mu of them; "
                         "it moves only with use_adaptive_entropy).",
         "algorithm.entropy_coef != 0 or use_adaptive_entropy"),
        ("learning_rate", "The learning rate of the step's first optimizer step."),
        ("grad_norm", "Global gradient norm before clipping, mean over the step's mu optimizer steps."),
        ("entropy", "Mean per-token entropy of the policy on the sampled tokens (first iteration)."),
        ("kl", "Mean per-token k3 estimate of KL(pi || pi_ref) (times the ratio with use_bias_correction_kl).",
         "algorithm.beta > 0"),
        ("clip_ratio/low_mean", "Share of tokens whose ratio fell below 1 - epsilon where the advantage is negative.",
         "loss_type other than vespo"),
        ("clip_ratio/high_mean", "Share of tokens whose ratio rose above the upper bound where the advantage is positive.",
         "loss_type other than vespo"),
        ("clip_ratio/region_mean", "Share of tokens clipped either way.", "loss_type other than vespo"),
        ("vespo/phi_seq_mean", "Mean VESPO weight phi(W) of the sequences (1 on-policy).", "algorithm.loss_type vespo"),
        ("off_policy_mask/masked_token_fraction", "Share of tokens left out by the off-policy sequence mask.",
         "algorithm.off_policy_mask_threshold"),
        ("ref_model/syncs", "Reference refreshes so far.", "algorithm.sync_ref_model"),
        ("nonfinite/skipped_updates", "Optimizer steps of this step skipped because the loss or a gradient was NaN or "
                                      "infinite on some process (the warning line names it); 0 on a healthy step."),
        ("nonfinite/skipped_total", "Optimizer steps skipped so far in the run (train.max_nonfinite_steps steps in a "
                                    "row with a skip stop it)."),
    ]),
    *_group("sampling", [
        ("sampling/sampling_logp_difference/mean", "Mean |log pi_train_old - log pi_sampler| per token.",
         "a sampler that reports log-probs (vLLM, rollout.dtype)"),
        ("sampling/sampling_logp_difference/max", "Largest such difference.",
         "a sampler that reports log-probs (vLLM, rollout.dtype)"),
        ("sampling/importance_sampling_ratio/mean", "Mean pi_train_old / pi_sampler per token (1 when they agree).",
         "a sampler that reports log-probs (vLLM, rollout.dtype)"),
        ("sampling/importance_sampling_ratio/min", "Smallest per-token ratio (per sequence with sequence_* modes).",
         "a sampler that reports log-probs (vLLM, rollout.dtype)"),
        ("sampling/importance_sampling_ratio/max", "Largest per-token ratio.",
         "a sampler that reports log-probs (vLLM, rollout.dtype)"),
        ("sampling/importance_sampling_below_min", "Share of the trained tokens whose ratio (per sequence with "
         "sequence_* modes) is below the lower bound: raised to it (truncate) or dropped (mask).",
         "rollout.importance_sampling_min"),
        ("sampling/staleness/mean", "Steps between the weights that sampled the batch and the ones trained.",
         "rollout.max_staleness"),
        ("sampling/staleness/max", "The same, largest (one batch a step: equal to the mean).", "rollout.max_staleness"),
        ("dynamic_sampling/rounds", "Generation batches sampled for the step.", "algorithm.dynamic_sampling"),
        ("dynamic_sampling/filtered_groups", "Groups dropped for want of signal.", "algorithm.dynamic_sampling"),
        ("dynamic_sampling/surplus_groups", "Groups with signal beyond the B trained.", "algorithm.dynamic_sampling"),
        ("dynamic_sampling/generated_reward_mean", "Mean reward of everything sampled in the step's rounds.",
         "algorithm.dynamic_sampling"),
    ]),
    *_group("reward models", [
        ("reward_model/<name>/updates", "Updates of the reward model so far.", "rewards[].update"),
        ("reward_model/<name>/loss", "Mean training loss of the update.", "a step that ends an update period"),
        ("reward_model/<name>/accuracy_before", "Accuracy on the period's groups before the update (none trained on).",
         "a step that ends an update period"),
        ("reward_model/<name>/accuracy", "Accuracy on the held-out groups after the update.",
         "a step that ends an update period"),
        ("reward_model/<name>/trained_groups", "The period's groups trained on.", "a step that ends an update period"),
        ("reward_model/<name>/replayed_groups", "Earlier groups replayed.", "a step that ends an update period"),
        ("reward_model/<name>/held_out_groups", "Groups held back.", "a step that ends an update period"),
        ("reward_model/<name>/buffer_groups", "Groups in the replay buffer after the update.",
         "a step that ends an update period"),
    ]),
    *_group("eval", [
        ("eval/accuracy", "Greedy pass@1 on the eval problems (the accuracy reward's extraction).", "an eval step"),
        ("eval/pass@<k>", "Unbiased pass@k over eval.num_samples samples.", "an eval step with num_samples > 1"),
        ("eval/maj@<k>", "Majority vote over the first k samples, answers grouped by equivalence.",
         "an eval step with num_samples > 1"),
        ("eval/rewards/<name>/mean", "Mean of a reward function on the greedy completions.", "an eval step"),
        ("eval/format_compliance", "Share of greedy completions with an extractable answer.", "an eval step"),
        ("eval/completions/mean_length", "Mean greedy completion length.", "an eval step"),
        ("eval/completions/clipped_ratio", "Share of greedy completions cut at the length limit.", "an eval step"),
        ("eval/num_problems", "Problems evaluated.", "an eval step"),
    ]),
    *_group("time and memory", [
        ("time/generate", "Seconds sampling (every round; with max_staleness the wait for the batch)."),
        ("time/score", "Seconds scoring completions."),
        ("time/train", "Seconds computing advantages and updating (reference refresh and reward models included)."),
        ("time/reward_model", "Seconds updating reward models.", "rewards[].update"),
        ("time/sync", "Seconds handing the new weights to what samples next."),
        ("sync/bytes", "Bytes the last weight sync handed to vLLM (tensors in its dtype, or the file sent to a "
                       "server; with rollout.max_staleness the last load that finished); 0 for the hf backend, "
                       "which samples with the policy itself."),
        ("servers/live", "grpo serve-vllm servers sampling (rollout.vllm.server_url a list): fewer than listed once "
                         "rollout.vllm.drop_failed_servers dropped one.", "several servers"),
        ("time/step", "Seconds of the whole step."),
        ("time/eval", "Seconds of the step's eval.", "an eval step"),
        ("throughput/gen_tokens_per_s", "Sampled tokens per second of time/generate."),
        ("memory/peak_gib", "This process's peak memory so far: CUDA allocator peak on a GPU, peak RSS on the CPU."),
        ("memory/generate_gib", "Peak memory while sampling (as memory/peak_gib counts it; on the CPU, memory an "
                                "earlier phase freed that the allocator kept counts too)."),
        ("memory/score_gib", "Peak memory while scoring (reward functions and reward models)."),
        ("memory/train_gib", "Peak memory of the update: the phases below and what time/train counts besides."),
        ("memory/reference_gib", "Peak memory of the reference's forwards (and a separate old policy's).",
         "beta > 0, or mu > 1 with dropout"),
        ("memory/forward_backward_gib", "Peak memory of a micro-batch's forward and backward (the highest of the step's)."),
        ("memory/optimizer_gib", "Peak memory of the optimizer step (AdamW's moments are made at the first)."),
        ("memory/sync_gib", "Peak memory while handing the new weights to what samples next."),
        ("epoch", "The data stream's epoch."),
    ]),
]


def _pattern(key: str) -> re.Pattern:
    parts = re.split(r"(<name>|<k>)", key)
    return re.compile("".join("[^/]+" if p == "<name>" else r"\d+" if p == "<k>" else re.escape(p) for p in parts) + "$")


_PATTERNS = [(_pattern(m.key), m) for m in METRICS]


def describe(key: str) -> Metric | None:
    """The row of a logged key, or None when the table lacks it."""
    exact = next((m for m in METRICS if m.key == key), None)
    return exact or next((m for p, m in _PATTERNS if p.match(key)), None)
