"""`grpo doctor`'s memory plan against the peak memory real runs report (`memory/peak_gib`), shape by shape.

Each shape is a real `grpo train` subprocess (ci-tiny recipe, the model swapped for a random Qwen2 of a real
vocabulary, no download) and a `grpo doctor --json` of the same recipe and overrides; the plan's peak is read from
the doctor's evidence. Shapes: full and LoRA, fp32 and bf16 autocast, short and long prompts, hf and a
`grpo serve-vllm` server (started once, on the same model). The per-phase columns are the run's own phase peaks
(memory/generate_gib, memory/forward_backward_gib, memory/optimizer_gib) beside what the plan gives them.

    python bench/doctor_memory.py                 # every shape, on this machine (CPU: about 10 minutes)
    python bench/doctor_memory.py --only full     # the shapes whose name contains "full"
    python bench/doctor_memory.py --no-server     # without vLLM (the GPU check: bench/gpu_checks.sh)
    python bench/doctor_memory.py --trace         # on a GPU: what is alive at each run's peak (cuda_memory_trace.py)

The last line is the worst |plan - measured| / measured over the shapes (issue 35's target: within 10%): of the
tensors (on the CPU, tests/tensor_peak.py's live-tensor peak: what a GPU's allocator reports) and of the resident
memory (the CPU's peak RSS, which adds the C allocator's retention; on a GPU memory/peak_gib is the allocator's peak).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from train_memory import SHAPES as MODELS, build_model  # noqa: E402  (bench/: this script's folder)

sys.path.insert(0, str(ROOT))
from grpo_cli.doctor.memory import RETENTION  # noqa: E402  (the checkout's, not an installed one)

COMMON = ["train.max_steps=2", "checkpoint.every_steps=0", "logging.rollouts=false", "eval=null",
          "rollout.max_completion_length=64", "train.prompts_per_step=4", "train.micro_batch_size=8"]
SHAPES = {
    "full fp32, short prompts": [],
    "full fp32, long prompts": ["LONG"],
    "full bf16 autocast": ["train.mixed_precision=bf16"],
    "LoRA r=16 fp32": ["model.lora.r=16"],
    "LoRA r=16, long prompts": ["model.lora.r=16", "LONG"],
    "full fp32, vLLM server": ["SERVER"],
    "LoRA r=16, vLLM server": ["model.lora.r=16", "SERVER"],
}


def long_data(path: Path) -> list[str]:
    """Rows whose prompts run from a few tokens to about 500 (a context before the question); -> the overrides, with
    4 steps: every row is drawn (4 prompts a step), the longest too, which the plan counts."""
    rows = [{"question": "Context: " + " ".join(f"w{(k * 37 + i) % 997}" for i in range(12 * k)) + f". What is {k}?",
             "answer": str(k)} for k in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["data.generator=null", f"data.files={path}", "data.prompt_column=question", "data.template=null",
            "data.max_prompt_length=512", "train.max_steps=4"]


def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "grpo_cli", *args], capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode not in (0, 1):  # doctor exits 1 on a warning elsewhere (e.g. rewards a random model never earns)
        raise SystemExit(f"grpo {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def parts_of(evidence: list[str]) -> dict[str, float]:
    """The doctor's evidence lines 'name: 12.3 MiB' -> {name: GiB}."""
    out = {}
    for line in evidence:
        name, _, size = line.rpartition(": ")
        if size.endswith((" MiB", " GiB")):
            out[name] = float(size.split()[0]) / (1024 if size.endswith("MiB") else 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trace", action="store_true", help="on a GPU: run each shape under bench/cuda_memory_trace.py")
    args = ap.parse_args()
    import torch

    on_gpu = torch.cuda.is_available()
    shapes = {k: v for k, v in SHAPES.items() if args.only in k and not (args.no_server and "SERVER" in v)}
    with tempfile.TemporaryDirectory(prefix="grpo-doctor-mem-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "GRPO_CACHE_DIR": str(tmp / "cache"), "OMP_NUM_THREADS": str(args.threads)}
        model = tmp / "model"
        params = build_model("vocab32k", model)
        long = long_data(tmp / "long.jsonl")
        server = None
        if any("SERVER" in v for v in shapes.values()):
            from servers import start_server

            from grpo_cli.trainer.launch import free_port

            port = free_port()
            server = start_server(str(model), port, tmp / "cache", tmp / "server.log", token="bench-token")
            env["GRPO_SERVER_TOKEN"] = "bench-token"
        print(f"random Qwen2, {params:.1f}M parameters, vocab {MODELS['vocab32k']['vocab_size']}; {' '.join(COMMON)}")
        print("tensors: the plan's parts but the runtime, against the peak of live tensors (tests/tensor_peak.py: what "
              "a GPU reports); resident: the plan's peak against memory/peak_gib (the CPU's peak RSS; on a GPU the "
              "allocator's peak, which counts tensors only)\n")
        print("| shape | tensors planned | tensors measured | error | resident planned | resident measured | error "
              "| phases measured: sampling / forward + backward / optimizer |")
        print("|---|---|---|---|---|---|---|---|")
        worst: dict[str, float] = {}  # a kind no shape measured (tensors on a GPU) stays out of the last line
        traces: dict[str, str] = {}
        try:
            for name, extra in shapes.items():
                overrides = [f"model.name_or_path={model}", f"train.threads={args.threads}", *COMMON]
                for x in extra:
                    overrides += long if x == "LONG" else (
                        ["rollout.backend=vllm", "rollout.vllm.mode=server",
                         f"rollout.vllm.server_url=http://127.0.0.1:{port}"]
                        if x == "SERVER" else [x])
                out = tmp / name.replace(" ", "_").replace(",", "")
                if args.trace and on_gpu:
                    traced = subprocess.run([sys.executable, str(ROOT / "bench/cuda_memory_trace.py"), str(out),
                                             str(ROOT / "recipes/ci-tiny.yaml"), *overrides],
                                            capture_output=True, text=True, cwd=ROOT, env=env)
                    if traced.returncode:
                        raise SystemExit(traced.stderr[-3000:])
                    traces[name] = traced.stdout[traced.stdout.find("cuBLAS workspaces"):]
                else:
                    run(["train", str(ROOT / "recipes/ci-tiny.yaml"), "-o", str(out), *overrides], env)
                metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
                resident = max(m["memory/peak_gib"] for m in metrics)
                phases = " / ".join(f"{max(m.get(f'memory/{k}_gib', 0.0) for m in metrics):.3f}"
                                    for k in ("generate", "forward_backward", "optimizer"))
                tensors = {"tensors_gib": float("nan")}
                if not on_gpu:  # a GPU's memory/peak_gib counts tensors already; the tracker counts the CPU's
                    child = subprocess.run([sys.executable, str(ROOT / "tests/tensor_peak.py"), str(out) + "-tensors",
                                            str(ROOT / "recipes/ci-tiny.yaml"), *overrides],
                                           capture_output=True, text=True, cwd=ROOT, env=env)
                    if child.returncode:
                        raise SystemExit(child.stderr[-3000:])
                    tensors = json.loads(child.stdout.splitlines()[-1])
                doctor = json.loads(run(["doctor", str(ROOT / "recipes/ci-tiny.yaml"), *overrides, "--json"],
                                        env).stdout)
                evidence = {v["check"]: v for v in doctor["verdicts"]}["memory plan"]["evidence"]
                planned = float(next(e for e in evidence if e.startswith("peak: ")).split()[1])
                found = parts_of(evidence)  # the tensors: the plan but what a process holds beside them
                runtime = found.get("runtime", 0.0) + found.get(RETENTION, 0.0)
                rows = {"tensors": (planned - runtime, tensors["tensors_gib"]), "resident": (planned, resident)}
                cells = []
                for kind, (plan, measured) in rows.items():
                    error = (plan - measured) / measured
                    if error == error:  # not NaN
                        worst[kind] = max(worst.get(kind, 0.0), abs(error))
                    cells.append(f"{plan:.3f} | {measured:.3f} | {error:+.1%}" if error == error
                                 else f"{plan:.3f} | - | -")
                print(f"| {name} | {' | '.join(cells)} | {phases} |", flush=True)
        finally:
            if server is not None:
                server.kill()
    for name, trace in traces.items():
        print(f"\n{name}: {trace.rstrip()}")
    print(f"worst |plan - measured| / measured over {len(shapes)} shapes: "
          + ", ".join(f"{kind} {error:.1%}" for kind, error in worst.items()))


if __name__ == "__main__":
    main()
