"""The checks of `grpo doctor` that read the recipe, its data and its tokenizer (no model weights): the batch
arithmetic, the first prompt as the model sees it, and the reward probe."""

from __future__ import annotations

import math
from typing import Any

from grpo_cli.errors import RewardError
from grpo_cli.trainer.layout import layout_problem, splits_into_mini_batches
from grpo_cli.views.audit import ACCURACY_WORDS
from grpo_cli.views.verdicts import Verdict

PROBE_ROWS = 4  # the data's first rows the rewards are probed on


def check_batch(recipe, processes: int, rows: int | None) -> Verdict:
    """B x G, micro-batches, processes, tokens per step, steps per epoch (`rows` None: a stream, size unknown)."""
    t, a, ro, d = recipe.train, recipe.algorithm, recipe.rollout, recipe.data
    N = recipe.generation_batch_size
    per = N // processes if N % processes == 0 else None
    micro = per // t.micro_batch_size if per is not None and per % t.micro_batch_size == 0 else None
    prompt = d.max_prompt_length or 0
    tokens = N * (prompt + ro.max_completion_length)
    epochs = t.max_steps * t.prompts_per_step / rows if rows else None
    evidence = [
        f"{t.prompts_per_step} prompts x G={a.num_generations} = {N} completions a step, over {processes} process(es)"
        + (f": {per} each, {micro} micro-batch(es) of {t.micro_batch_size} (gradient accumulation {micro})"
           if micro is not None and t.mini_batches == 1 else
           f": {per} each, {t.mini_batches} mini-batches of {per // t.mini_batches} (one optimizer step each)"
           if micro is not None else ""),
        f"{a.num_iterations * t.mini_batches} optimizer step(s) a training step (mu {a.num_iterations} x "
        f"train.mini_batches {t.mini_batches}), {t.max_steps} steps: "
        f"{t.max_steps * a.num_iterations * t.mini_batches} optimizer steps",
        f"at most {tokens:,} tokens a step ({N} x ({prompt} prompt + {ro.max_completion_length} completion))",
        f"{rows:,} prompts in the data: an epoch is {rows / t.prompts_per_step:.1f} steps; "
        f"{t.max_steps} steps are {epochs:.2f} epoch(s)" if rows else
        f"data.streaming: the number of prompts is not known ahead; {t.max_steps} steps read "
        f"{t.max_steps * t.prompts_per_step:,} of them",
    ]
    if per is None or micro is None:
        return Verdict("batch", "fail", f"{N} completions do not split into {processes} process(es) x micro-batches of "
                       f"{t.micro_batch_size}", evidence,
                       "make prompts_per_step x num_generations a multiple of processes x train.micro_batch_size")
    if not splits_into_mini_batches(per, t.mini_batches, t.micro_batch_size):
        return Verdict("batch", "fail", f"{per} completions a process do not split into train.mini_batches = "
                       f"{t.mini_batches} mini-batches of whole micro-batches of {t.micro_batch_size}", evidence,
                       "make the completions of a process a multiple of train.mini_batches x train.micro_batch_size")
    if (problem := layout_problem(recipe, processes)) is not None:  # what else the launcher refuses (group judges)
        return Verdict("batch", "fail", problem, evidence, "change the layout as the finding says, or the processes")
    if a.num_generations < 2:
        return Verdict("batch", "fail", "G = 1: a group of one has no relative advantage", evidence,
                       "algorithm.num_generations >= 2 (8 or 16 is usual)")
    if epochs is not None and epochs > 3:
        return Verdict("batch", "warn", f"{epochs:.1f} epochs over {rows} prompts: the policy will see each prompt "
                       "many times", evidence, "more data, or fewer steps")
    return Verdict("batch", "ok", f"{N} completions a step, {micro} micro-batch(es) per process"
                   + (f", {epochs:.2f} epoch(s)" if epochs is not None else ", streamed data"), evidence)


def check_prompt(recipe, batch, tokenizer, model_config: Any) -> Verdict:
    """The first prompt rendered exactly as the model will see it, with its token count against the limits."""
    d, ro = recipe.data, recipe.rollout
    text, ids = batch.texts[0], batch.input_ids[0]
    full = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    context = getattr(model_config, "max_position_embeddings", None)
    evidence = [f"first prompt (data row {batch.indices[0]}), {full} tokens:", *text.splitlines()]
    problems = []
    if d.max_prompt_length is not None and full > d.max_prompt_length:
        problems.append(f"{full} tokens, cut to data.max_prompt_length = {d.max_prompt_length} from the left: the model "
                        f"sees {tokenizer.decode(ids[:12])!r}... at its start")
    if context is not None and len(ids) + ro.max_completion_length > context:
        problems.append(f"{len(ids)} prompt + {ro.max_completion_length} completion tokens exceed the model's "
                        f"{context} positions")
    if problems:
        return Verdict("first prompt", "warn", "; ".join(problems), evidence,
                       "raise data.max_prompt_length, shorten the template or lower rollout.max_completion_length")
    return Verdict("first prompt", "ok", f"{full} tokens (data.max_prompt_length {d.max_prompt_length}, "
                                         f"+ {ro.max_completion_length} completion tokens)", evidence)


def wrong_answer(answer: Any) -> str:
    """An answer that is not `answer`: a number off by one, else a text that is no answer."""
    text = str(answer).strip()
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return "I do not know."
    if math.isfinite(value) and value == int(value):
        return str(int(value) + 1)
    return f"{value + 1:g}"


def answer_forms(answer: str) -> list[str]:
    """Ways a completion states an answer: plain, as a sentence, boxed."""
    return [answer, f"The answer is {answer}.", f"The answer is $\\boxed{{{answer}}}$."]


def probe_rewards(recipe, batch, tokenizer) -> Verdict:
    """Every reward scores, on the first rows, the row's own answer (in a few forms) and a wrong one: a reward that
    gives the right answer 0, or no more than the wrong one, is named with the row and the values."""
    from grpo_cli.data.prompts import user_prompts
    from grpo_cli.rewards import score
    from grpo_cli.recipe.names import is_reward_model

    column = recipe.data.answer_column
    if column is None or "answer" not in batch.columns:
        return Verdict("reward probe", "skip", "no answer column: nothing to probe with")
    specs = [s for s in recipe.rewards if s.name != "environment"]
    rows = list(range(min(PROBE_ROWS, len(batch))))
    prompts, completions, columns = [], [], {k: [] for k in batch.columns}
    kinds = []  # (row, right?) of each completion
    for i in rows:
        gold = str(batch.columns["answer"][i])
        for right, answer in ((True, gold), (False, wrong_answer(gold))):
            for text in answer_forms(answer):
                prompts.append(batch.texts[i])
                completions.append(text)
                kinds.append((i, right))
                for k, v in batch.columns.items():
                    columns[k].append(v[i])
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id or 0] for c in completions]
    users = user_prompts(recipe.data, columns) if any(is_reward_model(s.name) for s in specs) else None
    try:
        limits = [recipe.rollout.max_completion_length] * len(completions)
        result = score(specs, prompts, completions, ids, {"max_completion_length": limits, **columns}, user_prompts=users)
    except RewardError as e:  # a judge or remote reward nobody answers for: the run would stop at its first step
        return Verdict("reward probe", "fail", str(e).splitlines()[0], str(e).splitlines()[1:],
                       "start what the reward calls (its server, its judge) or fix its address, then run doctor again")
    evidence, flagged, total_prefers, blind = [], {}, [], []  # flagged: what -> the data rows
    for name, values in result.per_function.items():
        bests = []
        for i in rows:
            best = {right: max((v for (r, ok), v in zip(kinds, values) if r == i and ok == right and v is not None),
                               default=None) for right in (True, False)}
            bests.append(best)
            evidence.append(f"{name}, row {batch.indices[i]} (answer {batch.columns['answer'][i]!r}): right "
                            f"{_fmt(best[True])}, wrong ({wrong_answer(batch.columns['answer'][i])!r}) {_fmt(best[False])}")
        # a reward that scores the right and the wrong answer alike on every row reads the form (a format, length
        # or digit reward), not the answer: not probed, unless its name says it checks answers
        if all(b[True] == b[False] for b in bests) and not any(w in name.lower() for w in ACCURACY_WORDS):
            paid = {b[True] for b in bests}
            blind.append(f"{name} scores every answer alike" + (f" ({_fmt(paid.pop())})" if len(paid) == 1 else ""))
            continue
        for i, best in zip(rows, bests):
            if not best[True]:
                flagged.setdefault(f"{name} gives the right answer {_fmt(best[True])}", []).append(batch.indices[i])
            elif best[False] is not None and best[False] >= best[True]:
                flagged.setdefault(f"{name} gives a wrong answer as much as the right one", []).append(batch.indices[i])
    for i in rows:
        right = max((t for (r, ok), t in zip(kinds, result.total) if r == i and ok and not math.isnan(t)), default=-math.inf)
        wrong = max((t for (r, ok), t in zip(kinds, result.total) if r == i and not ok and not math.isnan(t)),
                    default=-math.inf)
        total_prefers.append(right > wrong)
    probed = ", ".join(n for n in result.per_function if not any(b.startswith(f"{n} scores") for b in blind))
    found = "; ".join([f"{what} (row{'s' if len(at) > 1 else ''} {', '.join(map(str, at))})"
                       for what, at in flagged.items()] + blind)
    if not any(total_prefers):
        return Verdict("reward probe", "fail", "the summed reward prefers the right answer on none of the first "
                       f"{len(rows)} rows: {found}", evidence,
                       "check the reward against the answer column's format (extraction, \\boxed{}, units); "
                       "grpo_cli's accuracy reward: rewards[].kwargs")
    if flagged:
        return Verdict("reward probe", "warn", found, evidence,
                       "a reward that tells right from wrong on some rows but not these cannot read their answers: "
                       "check it on these rows")
    also = f"; {'; '.join(blind)}: a reward of the form, not the answer (not probed)" if blind else ""
    return Verdict("reward probe", "ok", f"{probed}: the right answer scores above a wrong one on the first "
                                         f"{len(rows)} rows{also}", evidence)


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def check_served_teacher(recipe, batch, tokenizer) -> Verdict:
    """distillation.served: the server's tokenizer gives the policy's ids (the run's own start check), and it scores
    the first prompt with a short answer as the run will each micro-batch (prompt log-probs, token ids in)."""
    import torch

    from grpo_cli.datatypes import Rollout
    from grpo_cli.errors import SetupError, VLLMServerError
    from grpo_cli.trainer.teacher import ServedTeacher

    s = recipe.distillation.served
    teacher = ServedTeacher(s.base_url, s.model, s.api_key_env, min(s.timeout_s, 30.0), batch=1)
    prompt = torch.tensor([list(batch.input_ids[0])])
    completion = torch.tensor([tokenizer("The answer is 42.", add_special_tokens=False)["input_ids"]])
    rollout = Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), completion_ids=completion,
                      completion_mask=torch.ones_like(completion), truncated=torch.zeros(1, dtype=torch.bool),
                      prompts=[batch.texts[0]], completions=["The answer is 42."])
    try:
        teacher.check_tokenizer(tokenizer)
        logps = teacher(rollout)[0]
    except (SetupError, VLLMServerError) as e:
        return Verdict("served teacher", "fail", str(e), [f"{s.base_url}, model {s.model!r}"],
                       "start the teacher's vLLM server (docs/algorithms.md, On-policy distillation) or fix "
                       "distillation.served")
    return Verdict("served teacher", "ok", f"{s.model!r} at {s.base_url}: the policy's tokenizer, and it scores the "
                                           f"first prompt's answer ({len(logps)} tokens, mean log-prob "
                                           f"{float(logps.mean()):.2f})", [f"log-probs: {logps.tolist()}"])
