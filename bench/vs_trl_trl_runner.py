"""TRL's side of `bench/vs_trl.py`: one GRPOTrainer run, timed per step. Runs in bench/.venv-trl, not grpo's venv.

    bench/.venv-trl/bin/python bench/vs_trl_trl_runner.py SPEC.json OUT_DIR

SPEC.json (written by vs_trl.py) holds the model folder, prompts file and settings. OUT_DIR gets:
  steps.jsonl    one line per optimizer step, written as it ends (step, wall time, generation time, peak memory so
                 far and of each phase, measured by grpo_cli.process.memory as grpo measures its own)
  prompts.json   the prompt token ids TRL generates from: all prompts (TRL's own tokenization) and per step
  result.json    the log lines TRL wrote, TRL's version, peak RSS
Step time is on_step_begin -> on_step_end (generation, scoring, forward, backward, clipping, optimizer);
generation time is GRPOTrainer._generate (prompt tokenization, transformers generate, decoding).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(spec["threads"])
    import transformers
    import trl
    from datasets import load_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # grpo_cli.process.memory: torch only
    import vs_trl_reward

    reward = getattr(vs_trl_reward, spec.get("reward", "reward"))

    from grpo_cli.process.memory import PhasePeaks, peak_memory_gib  # the phases measured as grpo measures its own

    transformers.utils.logging.set_verbosity_error()
    G, mb = spec["num_generations"], spec["micro_batch_size"]
    rows = spec["prompts_per_step"] * G
    cuda, bf16 = spec.get("device", "cpu") == "cuda", spec.get("dtype", "float32") == "bfloat16"
    args = GRPOConfig(
        output_dir=str(out / "trl-output"), use_cpu=not cuda, bf16=bf16, fp16=False, seed=spec["seed"],
        max_steps=spec["steps"], learning_rate=spec["learning_rate"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=spec["adam_beta2"], max_grad_norm=1.0,
        # one generation batch (B*G rows) = one optimizer step, in micro-batches of `mb` rows
        per_device_train_batch_size=mb, gradient_accumulation_steps=rows // mb, steps_per_generation=rows // mb,
        num_generations=G, num_iterations=1, beta=0.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
        scale_rewards="group", max_completion_length=spec["max_completion_length"], temperature=spec["temperature"],
        top_p=1.0, top_k=0, shuffle_dataset=False, model_init_kwargs={"dtype": spec.get("dtype", "float32")},
        logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False,
        **({} if spec.get("gradient_checkpointing") is None else
           {"gradient_checkpointing": spec["gradient_checkpointing"] == "on"}),
    )
    tok = AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    dataset = load_dataset("json", data_files=spec["prompts_file"], split="train")
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tok)

    all_ids, _, _ = trainer._tokenize_prompts(list(dataset["prompt"]))  # TRL's own tokenization of every prompt
    step_ids: list[list[list[int]]] = []
    gen_time = [0.0]
    tokenize, generate = trainer._tokenize_prompts, trainer._generate

    def tokenize_and_record(prompts):
        ids, images, fields = tokenize(prompts)
        unique = []  # each prompt is repeated G times in a row
        for x in ids:
            if not unique or list(x) != unique[-1]:
                unique.append(list(x))
        step_ids.append(unique)
        return ids, images, fields

    device = torch.device("cuda" if cuda else "cpu")
    peaks = [PhasePeaks(device)]  # this step's; memory/<phase>_gib in steps.jsonl

    def timed_generate(prompts):
        t0 = time.perf_counter()
        try:
            with peaks[0]("generate"):
                return generate(prompts)
        finally:
            gen_time[0] += time.perf_counter() - t0

    def in_phase(phase, fn):
        def wrapped(*a, **kw):
            with peaks[0](phase):
                return fn(*a, **kw)
        return wrapped

    trainer._tokenize_prompts, trainer._generate = tokenize_and_record, timed_generate
    # sampling and scoring (TRL does both in one method; generate is measured inside it as well)
    trainer._generate_and_score_completions = in_phase("score", trainer._generate_and_score_completions)
    trainer.compute_loss = in_phase("forward_backward", trainer.compute_loss)
    trainer.accelerator.backward = in_phase("forward_backward", trainer.accelerator.backward)
    logs_seen: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, gen_time[0] = time.perf_counter(), 0.0
            peaks[0] = PhasePeaks(device)

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.optimizer_phase = peaks[0]("optimizer")
            self.optimizer_phase.__enter__()

        def on_optimizer_step(self, args, state, control, **kw):
            self.optimizer_phase.__exit__(None, None, None)

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()  # the step's kernels have run, as grpo's logged loss makes them
            line = {"step": state.global_step, "time/step": time.perf_counter() - self.t0,
                    "time/generate": gen_time[0], "rss_gib": peak_memory_gib(torch.device("cpu")),
                    "cuda_gib": peak_memory_gib(device) if cuda else 0.0, **peaks[0].metrics()}
            with open(out / "steps.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")

        def on_log(self, args, state, control, logs=None, **kw):  # TRL's metrics, completions/mean_length among them
            numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
            logs_seen.append(numbers | {"step": state.global_step})

    trainer.add_callback(Timer())
    t0 = time.perf_counter()
    trainer.train()
    (out / "prompts.json").write_text(json.dumps({"all": [list(x) for x in all_ids], "steps": step_ids}))
    (out / "result.json").write_text(json.dumps({
        "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "train_s": time.perf_counter() - t0, "peak_rss_gib": peak_memory_gib(torch.device("cpu")),
        "logs": logs_seen, "pid": os.getpid(),
    }))


if __name__ == "__main__":
    main()
