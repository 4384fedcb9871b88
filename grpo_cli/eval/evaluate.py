"""`grpo eval`: task metrics of one or more models on the same held-out problems.

accuracy   greedy decoding, the final answer extracted as the recipe's `accuracy` reward does
           (its `mode`/`tag` kwargs) and compared with math-verify: pass@1 of the greedy policy.
pass@k     unbiased estimator over n samples (Chen et al. 2021, arXiv:2107.03374): 1 - C(n-c, k) / C(n, k).
maj@k      majority vote over the extracted answers of the first k samples (self-consistency), answers
           grouped by mathematical equivalence ("3/4" and "0.75" are one vote), integers kept exact.
Plus the mean of each reward function, format compliance (share of greedy completions with an
extractable answer), mean completion length and truncation rate, all on greedy completions. The metrics are
metrics.py's, the targets targets.py's; this module loads the problems, samples and runs the command.
"""

from __future__ import annotations

import contextlib

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_cli.data.held_out import eval_data_config
from grpo_cli.errors import UsageError
from grpo_cli.eval.metrics import summarize
from grpo_cli.eval.targets import Target, resolve_target
from grpo_cli.recipe.schema import DataConfig, EvalConfig, Recipe


def accuracy_settings(recipe: Recipe) -> dict[str, str]:
    """Extraction mode and tag of the recipe's `accuracy` reward (the same rule in training and eval)."""
    for spec in recipe.rewards:
        if spec.name == "accuracy":
            return {"mode": spec.kwargs.get("mode", "auto"), "tag": spec.kwargs.get("tag", "answer")}
    return {"mode": "auto", "tag": "answer"}


@dataclass
class Problems:
    texts: list[str]  # [P] rendered prompts
    input_ids: list[list[int]]  # [P]
    columns: dict[str, list[Any]]  # dataset columns, each [P]
    data: DataConfig  # what was loaded (for the report)

    def __len__(self) -> int:
        return len(self.texts)


def eval_source(recipe: Recipe, cfg: EvalConfig) -> dict[str, Any]:
    """Where the eval problems come from and whether they are held out from training (eval.json's `eval_data`)."""
    d, e = recipe.data, eval_data_config(recipe, cfg)
    if e.files:
        held_out = cfg.files is not None and sorted(e.files) != sorted(d.files or [])
        source, note = ", ".join(e.files), None if held_out else "the training files: set eval.files to a held-out file"
    elif e.dataset:
        held_out = (e.dataset, e.config, e.split) != (d.dataset, d.config, d.split)
        source = f"{e.dataset}:{e.config or ''}:{e.split}"
        note = None if held_out else "the training split: set eval.split or eval.dataset to held-out data"
    else:
        held_out, source = False, f"generator {e.generator} (seed {cfg.seed})"
        note = "the training generator under another seed (problems may repeat): set eval.files or eval.dataset"
    return {"source": source, "held_out": held_out, **({"note": note} if note else {})}


def load_problems(recipe: Recipe, cfg: EvalConfig, tokenizer) -> Problems:
    from grpo_cli.data.prompts import encode_prompts, render_prompt
    from grpo_cli.data.sources import load_rows

    data = eval_data_config(recipe, cfg)
    rows = load_rows(data, cfg.seed)
    if data.streaming:  # the first eval.limit rows of the stream, not the whole of it
        from grpo_cli.data.streaming import head_rows

        rows = head_rows(rows, data.limit)
    columns = {k: list(v) for k, v in rows.to_dict().items()}
    if data.answer_column and data.answer_column != "answer" and data.answer_column in columns:
        columns["answer"] = columns.pop(data.answer_column)
    tools = None
    if recipe.rollout.tools:  # the prompts describe them, as in training
        from grpo_cli.agents.tools import schemas

        tools = schemas(recipe.rollout.tools)
    texts = [render_prompt(row, data, tokenizer, tools=tools) for row in rows]
    return Problems(texts, encode_prompts(texts, tokenizer, data.max_prompt_length), columns, data)


def evaluate_model(model, tokenizer, recipe: Recipe, cfg: EvalConfig, problems: Problems, *, progress: bool = False,
                   generator=None, label: str = "") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy (and n sampled) completions for every problem -> metrics and one record per completion.

    `generator` is any rollout backend (default: transformers generate on `model`); `label` names the model in the
    progress lines. Runs under its
    own RNG (seeded with cfg.seed) and leaves the caller's RNG untouched."""
    import torch

    from grpo_cli.agents.runners import episode_runner
    from grpo_cli.datatypes import PromptBatch
    from grpo_cli.rewards import answers_match, extract_answer, reference_text, score_rollout
    from grpo_cli.recipe.backends import for_eval
    from grpo_cli.rollout.backends import build_generator

    gen = generator or build_generator(for_eval(recipe.rollout, "hf"), tokenizer=tokenizer, model=model)
    episodes = episode_runner(recipe, tokenizer, gen, model)  # rollout.environment / tools: multi-turn, as in training
    ext = accuracy_settings(recipe)
    max_len, n = cfg.max_new_tokens or recipe.rollout.max_completion_length, cfg.num_samples
    samples: list[dict[str, Any]] = []
    batches = [list(range(s, min(s + cfg.batch_size, len(problems)))) for s in range(0, len(problems), cfg.batch_size)]
    with torch.random.fork_rng(devices=[]), _progress(progress, len(problems), label) as advance, \
            contextlib.closing(episodes) if episodes is not None else contextlib.nullcontext():  # agent endpoints
        torch.manual_seed(cfg.seed)
        for rows in batches:
            ids, texts = [problems.input_ids[i] for i in rows], [problems.texts[i] for i in rows]
            kinds = [("greedy", 1, dict(greedy=True))]
            if n > 1:
                kinds.append(("sample", n, dict(temperature=cfg.temperature, top_p=cfg.top_p)))
            for kind, per, sampling in kinds:
                cols = {k: [v[i] for i in rows for _ in range(per)] for k, v in problems.columns.items()}
                if episodes is not None:
                    batch = PromptBatch(texts=[t for t in texts for _ in range(per)], input_ids=[x for x in ids for _ in range(per)],
                                        columns=cols, indices=[i for i in rows for _ in range(per)])
                    rollout, extra = episodes.run(batch, with_reward=any(s.name == "environment" for s in recipe.rewards),
                                                  **sampling)
                    cols = cols | extra
                else:
                    rollout = gen.generate(ids, texts, per, max_new_tokens=max_len, **sampling)
                rewards = None
                if kind == "greedy":
                    rewards = score_rollout(recipe.rewards, rollout, cols, max_completion_length=max_len, tokenizer=tokenizer)
                lengths = rollout.trained_mask().sum(1).tolist()
                for j, text in enumerate(rollout.completions):
                    i = rows[j // per]
                    ref = reference_text(problems.columns.get("answer", [None] * len(problems))[i])
                    got = extract_answer(text, mode=ext["mode"], tag=ext["tag"])
                    samples.append({
                        "index": i, "kind": kind, "sample": j % per, "prompt": problems.texts[i],
                        "answer": ref, "completion": text, "extracted": got,
                        "correct": bool(ref is not None and got is not None and answers_match(ref, got)),
                        "rewards": {k: v[j] for k, v in rewards.per_function.items()} if rewards else None,
                        "length": int(lengths[j]), "truncated": bool(rollout.truncated[j]),
                        **({"turns": rollout.turns[j]} if rollout.turns is not None else {}),
                    })
            advance(len(rows))
    return summarize(samples, n), samples


class _progress:
    """Progress over problems: a rich bar with ETA on a terminal or in Jupyter; elsewhere (a log file, a pipe) a plain
    line at every tenth of the problems and at least every 30 s, so a log shows the eval is alive (or nothing)."""

    def __init__(self, enabled: bool, total: int, label: str = "") -> None:
        from rich.console import Console

        from grpo_cli.views.summary import live_bar_works

        self.enabled, self.total, self.terminal = enabled, total, live_bar_works(Console(stderr=True))
        self.name = f"eval {label}".rstrip()  # the model measured: `grpo eval` runs one target after another

    def _line(self, k: int) -> None:
        import sys
        import time

        self.done += k
        now = time.monotonic()
        tenth = self.done * 10 // max(self.total, 1)
        if tenth > self.tenth or now - self.last >= 30 or self.done >= self.total:
            spent = now - self.start
            eta = spent / self.done * (self.total - self.done) if self.done else 0.0
            print(f"{self.name}: {self.done}/{self.total} problems, {spent:.0f} s, eta {eta:.0f} s", file=sys.stderr,
                  flush=True)
            self.tenth, self.last = tenth, now

    def __enter__(self):
        if not self.enabled:
            return lambda k: None
        if not self.terminal:
            import time

            self.done, self.tenth, self.start = 0, 0, time.monotonic()
            self.last = self.start
            return self._line
        from rich.markup import escape
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn(f"[bold]{escape(self.name)}"), BarColumn(), MofNCompleteColumn(), TextColumn("eta"),
                            TimeRemainingColumn(), transient=True)
        task = self.bar.add_task("eval", total=self.total)
        self.bar.start()
        return lambda k: self.bar.advance(task, k)

    def __exit__(self, *exc) -> None:
        if self.enabled and self.terminal:
            self.bar.stop()


def eval_settings(recipe: Recipe, cfg: EvalConfig, problems: Problems) -> dict[str, Any]:
    data = eval_source(recipe, cfg)
    return {
        "problems": len(problems), "source": data["source"], "eval_data": data, "seed": cfg.seed, "extraction": accuracy_settings(recipe),
        "accuracy_decoding": "greedy", "num_samples": cfg.num_samples, "temperature": cfg.temperature,
        "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens or recipe.rollout.max_completion_length,
    }


def run_eval(specs: list[str], recipe: Recipe | None, cfg_overrides: dict[str, Any], output: Path, backend: str = "hf",
             threads: int | str | None = None, resolve: Callable[[Recipe], Any] = lambda r: None,
             own_process: bool = False) -> dict[str, Any]:
    """Evaluate every target on the same problems; print a table, write eval.json and samples.jsonl. `threads`: CPU
    threads (None: the recipe's); `resolve`: the preflight, run on the recipe settled on (given or a checkpoint's);
    `own_process`: the process is `grpo eval`'s own, whose C allocator the recipe's train.keep_freed_memory may set
    (process/allocator.py: a CPU generate then reuses the pages its last step freed)."""
    import json
    import sys

    import torch

    from grpo_cli.models.loading import load_tokenizer, quiet_libraries
    from grpo_cli.process.allocator import keep_freed_memory
    from grpo_cli.process.cpus import apply_threads

    quiet_libraries()
    resolved = {s: resolve_target(s, recipe) for s in specs if s != "base"}  # `base` needs the recipe first
    recipe = recipe or next((t.recipe for t in resolved.values() if t.recipe is not None), None)
    if recipe is None:
        raise UsageError("no recipe: give --recipe, or a checkpoint written by `grpo train` as a target")
    resolve(recipe)  # its rewards score every target: each must resolve before any model loads
    targets = [resolved.get(s) or resolve_target(s, recipe) for s in specs]
    setting = threads if threads is not None else recipe.train.threads
    if setting is not None:
        print(apply_threads(setting), file=sys.stderr)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if kept := keep_freed_memory(recipe.train.keep_freed_memory, device_type, own_process):  # before a model loads
        print(kept, file=sys.stderr)
    cfg = (recipe.eval or EvalConfig()).model_copy(update={k: v for k, v in cfg_overrides.items() if v is not None})
    results, settings = [], None
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "samples.jsonl", "w", encoding="utf-8") as f:
        for t in targets:
            tokenizer = load_tokenizer(t.model)
            model, generator = _backend(backend, t, tokenizer, recipe, cfg.seed)
            problems = load_problems(recipe, cfg, tokenizer)
            settings = settings or {**eval_settings(recipe, cfg, problems), "backend": backend}
            metrics, samples = evaluate_model(model, tokenizer, recipe, cfg, problems, progress=True, generator=generator,
                                              label=t.spec)
            if generator is not None:
                generator.close()
            f.writelines(json.dumps({"target": t.spec, **s}, ensure_ascii=False) + "\n" for s in samples)
            results.append({"target": t.spec, "model": str(t.adapter or t.model.name_or_path), "gguf_file": t.model.gguf_file,
                            "metrics": metrics})
            del model
    report = {"settings": settings, "targets": results}
    (output / "eval.json").write_text(json.dumps(report, indent=2, default=str))
    print_results(report)
    return report


def _backend(backend: str, t: Target, tokenizer, recipe: Recipe, seed: int):
    """(HF model or None, generator or None): a backend with weights of its own (vLLM) loads them itself, HF
    generates with the model.

    A LoRA target is its base plus the adapter: merged for speed (kept apart on a 4-bit base, as trained);
    vLLM loads the base and receives the merged weights."""
    import torch

    from grpo_cli.models.loading import load_model, resolve_model_source
    from grpo_cli.models.lora import load_adapter_model
    from grpo_cli.recipe.backends import backend_of, for_eval
    from grpo_cli.rollout.backends import build_generator

    cfg = for_eval(recipe.rollout, backend)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy = load_adapter_model(t.adapter, t.model, trainable=False, device=device) if t.adapter else None
    if not backend_of(cfg).own_weights:
        if policy is None:
            return load_model(t.model, device=device), None
        return (policy if t.model.load_in_4bit else policy.merge_and_unload().to(device)), None
    generator = build_generator(cfg, tokenizer=tokenizer, model_dir=resolve_model_source(t.model), seed=seed)
    if policy is not None:
        generator.sync_weights(policy)
    return None, generator


def evaluate_during_training(accelerator, model, tokenizer, recipe: Recipe, generator, cache: dict, sharded: bool,
                             say) -> dict[str, float]:
    """The recipe's eval during training: on the main process (every process when the weights are sharded, and those
    that share the main process's tensor-parallel vLLM engine; the main one reports) -> eval/* metrics and time/eval.
    `cache` keeps the problems between calls; `say` prints once that the eval set is not held out when it is not."""
    import time

    out: dict[str, float] = {}
    group = getattr(generator, "group", None)  # rollout/vllm_colocate.py's EngineGroup: its processes sample together
    if accelerator.is_main_process or sharded or (group is not None and group.with_main):
        if "problems" not in cache:
            cache["problems"] = load_problems(recipe, recipe.eval, tokenizer)
            source = eval_source(recipe, recipe.eval)
            if not source["held_out"]:  # once per run: eval/* then measures fit to the training problems
                say(f"eval: not held out: {source['source']} is {source['note']}")
        t0 = time.perf_counter()
        metrics, _ = evaluate_model(model, tokenizer, recipe, recipe.eval, cache["problems"], generator=generator)
        if accelerator.is_main_process:
            out = {f"eval/{k}": v for k, v in metrics.items()} | {"time/eval": time.perf_counter() - t0}
    accelerator.wait_for_everyone()
    return out


def print_results(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s, results = report["settings"], report["targets"]
    console = Console()
    data = s.get("eval_data", {})
    if data and not data["held_out"]:
        console.print(f"[bold yellow]not held out:[/] evaluating on {data['note']}", soft_wrap=True)
    where = s["source"] if "(seed " in s["source"] else f"{s['source']} (seed {s['seed']})"  # a generator's says it
    console.print(
        f"{s['problems']} problems from {where}; answers extracted with mode "
        f"{s['extraction']['mode']!r}; accuracy = greedy pass@1; pass@k/maj@k from n={s['num_samples']} samples "
        f"at temperature {s['temperature']}, top_p {s['top_p']}; max_new_tokens {s['max_new_tokens']}", soft_wrap=True,
    )
    table = Table("metric", *[r["target"] for r in results])
    for key in results[0]["metrics"]:
        table.add_row(key, *[f"{r['metrics'].get(key, float('nan')):.4g}" for r in results])
    console.print(table)
    formats = [k.split("/")[1] for k in results[0]["metrics"] if k.startswith("rewards/") and "format" in k.lower()]
    if formats and "format_compliance" in results[0]["metrics"]:  # two meanings of "format" side by side
        console.print(f"format_compliance is the share of greedy completions with an answer the accuracy extraction "
                      f"(mode {s['extraction']['mode']!r}) finds; {', '.join(formats)} is a reward with a format rule of "
                      "its own: they measure different formats, and one can be 1 where the other is 0", soft_wrap=True)
