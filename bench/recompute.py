"""A step's training forwards and backwards, with and without activation recomputation, as grpo and TRL run them.

The rows of one step (B prompts x G completions of exactly --new-tokens tokens, left-padded prompts), micro-batch by
micro-batch, forward + backward of the completions' log-probs; its median time over --repeat passes and the GPU's
peak above the weights and gradients. Each row is one way of running it:

  grpo                 the model as `grpo train` loads it (models/loading.py: grouped attention, the lean MLP and
                       norms) and grpo's token_logprobs with the chunked LM head as train.chunked_lm_head's auto
                       runs it (a GPU's logits recomputed in the backward, a CPU's kept)
  grpo, up recomputed  the same with train.recompute_up_projection (the MLP's up projection recomputed in the backward)
  grpo, own norms      grpo's without the lean norms (the model's own RMS norm forward)
  transformers         the model as transformers loads it, whole logits, a float32 log-softmax (TRL's way)
each with its activations kept, and for grpo and transformers recomputed (model.gradient_checkpointing: non-reentrant
checkpointing of every layer, as both grpo and TRL run it).

    python bench/recompute.py --shape narrow --device cpu        # Qwen2.5-0.5B's 24 layers at width 64: the host's
                                                                 # share of each way (a GPU's launch-bound regime)
    python bench/recompute.py --device cuda --new-tokens 256 --B 16 --profile "grpo, recomputed"

--profile LABEL adds torch.profiler's table of that row's operators (one pass): host time by operator and, on a GPU,
the device's.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from step_phases import measure, step_parser, sync  # noqa: E402  (bench/ on the path first)


def load(folder: Path, how: str, recompute: bool, dtype: str, device: torch.device):
    """-> the model of the way `how` ("transformers", "grpo", "grpo, up recomputed", "grpo, own norms")."""
    if how == "transformers":
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device)
        if recompute:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        from grpo_cli.models.loading import load_model
        from grpo_cli.recipe.schema import ModelConfig
        from grpo_cli.models.swiglu import recompute_up_projection
        model = load_model(ModelConfig(name_or_path=str(folder), dtype=dtype, gradient_checkpointing=recompute),
                           device=device)
        recompute_up_projection(model, how == "grpo, up recomputed")
        from grpo_cli.models.rmsnorm import runs_lean
        for m in model.modules() if how == "grpo, own norms" else ():
            if runs_lean(m):
                del m.forward  # the class's own
    model.train()
    for p in model.parameters():  # the step's gradients exist already (as after its first micro-batch)
        p.grad = torch.zeros_like(p)
    return model


def transformers_logps(model, ids, mask, completions, cmask):
    """TRL's way: the model's logits of the completion positions, a float32 log-softmax per row, the targets'."""
    T = completions.shape[1]
    logits = model(input_ids=torch.cat([ids, completions], 1), attention_mask=torch.cat([mask, cmask], 1),
                   logits_to_keep=T + 1, use_cache=False).logits[:, :-1]
    out = []
    for row, target in zip(logits, completions):
        out.append(torch.log_softmax(row.float(), -1).gather(-1, target[:, None])[:, 0])
    return torch.stack(out)


def main() -> None:
    from train_memory import SHAPES, build_model

    SHAPES.setdefault("narrow", dict(SHAPES["qwen2.5-0.5b"], vocab_size=4096, hidden_size=64, intermediate_size=192,
                                     num_attention_heads=4, num_key_value_heads=2))
    ap = step_parser(__doc__, SHAPES, prompt_tokens=17, new_tokens=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="labels of the rows to run (default: all)")
    ap.add_argument("--profile", nargs="*", default=[], help="labels of rows to profile (one pass each)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from grpo_cli.algo.logprobs import KEEP_LOGITS, token_logprobs

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    g = torch.Generator().manual_seed(0)
    N = args.B * args.G
    ids = torch.randint(3, 700, (args.B, args.prompt_tokens), generator=g).repeat_interleave(args.G, 0)
    mask = torch.ones_like(ids)
    mask[::3, : args.prompt_tokens // 3] = 0  # left padding: every micro-batch runs a mask, as a step's do
    completions = torch.randint(3, 700, (N, args.new_tokens), generator=g)
    ids, mask, completions = ids.to(device), mask.to(device), completions.to(device)
    cmask = torch.ones_like(completions)

    ways = ("grpo", "grpo, up recomputed", "grpo, own norms", "transformers")
    rows = [(f"{w}, {'recomputed' if r else 'kept'}", w, r) for w in ways
            for r in ((False, True) if w in ("grpo", "transformers") else (False,))]
    rows = [row for row in rows if args.only is None or row[0] in args.only]
    tmp = tempfile.TemporaryDirectory()
    params = build_model(args.shape, Path(tmp.name) / "m")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.shape} ({params:.0f}M parameters), {args.dtype} on {name} ({args.threads} threads); B={args.B} x "
          f"G={args.G}, {args.prompt_tokens} prompt + {args.new_tokens} new tokens, micro-batch {args.micro_batch}; "
          f"median of {args.repeat} passes over the step's rows, forward + backward")
    print("| way | activations | s | peak above weights + gradients GiB |\n|---|---|---|---|")
    peaks = {}
    results = {}
    for label, way, recompute in rows:
        how = way
        model = load(Path(tmp.name) / "m", how, recompute, args.dtype, device)

        def run():
            for s in range(0, N, args.micro_batch):
                sl = slice(s, s + args.micro_batch)
                if how == "transformers":
                    lp = transformers_logps(model, ids[sl], mask[sl], completions[sl], cmask[sl])
                else:
                    lp, _ = token_logprobs(model, ids[sl], mask[sl], completions[sl], cmask[sl], with_entropy=True,
                                           shared_prompts=False, chunked_head=True if cuda else KEEP_LOGITS)
                (-(lp * cmask[sl]).sum() / cmask.sum()).backward()

        results[label], peaks[label] = measure(run, device, args.repeat)  # a warm-up pass, then the median
        print(f"| {way} | {'recomputed' if recompute else 'kept'} | {results[label]:.3f} | {peaks[label]:.2f} |",
              flush=True)
        if label in args.profile:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=acts) as prof:
                run()
                sync(device)
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(f"profile of {label}:")
            print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))
            if device.type == "cuda":
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for way in ways:
        kept, rec = results.get(f"{way}, kept"), results.get(f"{way}, recomputed")
        if kept and rec:
            print(f"{way}: recomputation costs {rec - kept:+.3f} s ({rec / kept:.2f}x)")
    base = "grpo, kept"
    for label in ("grpo, up recomputed, kept", "grpo, own norms, kept"):
        if base in results and label in results:
            peak = f", peak {peaks[label] / peaks[base]:.2f}x" if cuda else ""  # (a CPU has no allocator peak here)
            print(f"{label} against {base}: time {results[label] / results[base]:.2f}x{peak}")
    if "grpo, recomputed" in results and "transformers, recomputed" in results:
        both = results["grpo, recomputed"] / results["transformers, recomputed"]
        print(f"grpo/transformers, both recomputed: {both:.2f}x")
    tmp.cleanup()


if __name__ == "__main__":
    main()
