"""`grpo doctor RECIPE`: every preflight check in order; a check that cannot run says why instead."""

from __future__ import annotations

from pathlib import Path

from grpo_cli.errors import UserError
from grpo_cli.views.verdicts import Verdict, worst_first


def diagnose(recipe_path: Path, overrides: list[str], processes: int = 1, resume_steps: int = 0,
             say=lambda line: None) -> list[Verdict]:
    from grpo_cli.data.checks import check_data
    from grpo_cli.data.epochs import with_epoch_steps
    from grpo_cli.doctor.memory import PROMPT_ROWS, check_memory, prompt_lengths
    from grpo_cli.doctor.preflight import PROBE_ROWS, check_batch, check_prompt, check_served_teacher, probe_rewards
    from grpo_cli.doctor.versions import check_versions
    from grpo_cli.preflight import resolve
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.recipe.backends import backend_of
    from grpo_cli.process.hub import hub_names, work_offline_if_unreachable

    try:
        r = load_recipe(recipe_path, overrides)
        resolve(r)
        work_offline_if_unreachable(hub_names(r), say)
        notes = check_data(r)
        r = with_epoch_steps(r)
    except UserError as e:  # the run would stop here: nothing else can be checked
        return [Verdict("recipe", "fail", str(e), advice="`grpo validate` names the same field")]
    verdicts = [Verdict("recipe", "ok", f"{r.name}: {r.algorithm.loss_type}, G={r.algorithm.num_generations}, "
                                        f"{r.train.max_steps} steps", notes),
                check_versions(backend_of(r.rollout).imports_vllm)]
    try:
        tokenizer, config, dataset, stream = _inputs(r)
        batch = stream.upcoming(PROBE_ROWS)
        rows = None if r.data.streaming else len(dataset)  # a stream's size is not known ahead
        lengths = prompt_lengths(stream.upcoming(min(rows or PROMPT_ROWS, PROMPT_ROWS)))  # the longest pads a batch
    except UserError as e:
        return [*verdicts, Verdict("model and data", "fail", str(e))]
    verdicts += [check_batch(r, processes, rows), check_prompt(r, batch, tokenizer, config),
                 check_memory(r, config, processes, lengths, _config(r.distillation.teacher) if r.distillation and r.distillation.teacher else None),
                 probe_rewards(r, batch, tokenizer)]
    if r.distillation is not None and r.distillation.served is not None:
        verdicts.append(check_served_teacher(r, batch, tokenizer))
    if resume_steps:
        from grpo_cli.doctor.resume_check import resume_check

        say(f"resume check: {resume_steps} steps straight, then {resume_steps // 2} + resume + the rest ...")
        verdicts.append(resume_check(recipe_path, overrides, resume_steps))
    return worst_first(verdicts)


def _config(model):
    """A model section's config, None if unreadable (a GGUF file or an unusual folder: the checks that need it skip)."""
    from grpo_cli.models.loading import resolve_model_source

    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(resolve_model_source(model), trust_remote_code=model.trust_remote_code)
    except Exception:
        return None


def _inputs(r):
    """The tokenizer, the model's config (for its context length; None if unreadable), the rows, and the stream of
    prompts the run will see, not yet moved."""
    from grpo_cli.data.prompts import PromptStream
    from grpo_cli.data.sources import load_rows
    from grpo_cli.doctor.memory import PROMPT_ROWS
    from grpo_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer(r.model)
    config = _config(r.model)
    seed = r.data.seed if r.data.seed is not None else r.train.seed
    dataset = load_rows(r.data, seed)
    tools = None
    if r.rollout.tools:
        from grpo_cli.agents.tools import schemas

        tools = schemas(r.rollout.tools)
    B = r.train.prompts_per_step  # a stream remembers B x in_flight rows: enough for the memory plan's PROMPT_ROWS
    stream = PromptStream(dataset, r.data, tokenizer, B, seed, tools=tools, in_flight=-(-PROMPT_ROWS // B))
    return tokenizer, config, dataset, stream  # its next prompts are step 1's
