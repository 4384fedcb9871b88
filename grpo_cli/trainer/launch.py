"""`grpo train --num-processes N [--accelerate-config FILE]`: re-run the same command under `accelerate launch`.

accelerate owns processes and devices (DDP, FSDP2, DeepSpeed); we only build its command line. The
children run `python -m grpo_cli train ...` without the launch options and see the torchrun environment
(RANK, WORLD_SIZE, ...), so `accelerate launch -m grpo_cli train ...` by hand is the same thing.

CPU-only machines: accelerate's `--cpu` multi-process launcher wants mpirun, so the CPU route is its
torchrun launcher (`--multi_gpu`) with ACCELERATE_USE_CPU=1, which gives DDP over gloo. accelerate
enables FSDP and DeepSpeed only on accelerators, so those configs are refused on CPU before launching.
Importing this module must not import torch.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from grpo_cli.errors import LaunchError, SetupError

GPU_ONLY = {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed"}


def launched_by_torchrun() -> bool:
    """True inside a process started by accelerate launch / torchrun (do not launch again)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def read_accelerate_config(path: str | Path) -> dict[str, Any]:
    """An accelerate config file parsed by accelerate itself (so what it rejects, we reject)."""
    from accelerate.commands.config.config_args import load_config_from_file

    path = Path(path)
    if not path.is_file():
        raise LaunchError(f"--accelerate-config {path}: file not found (see recipes/accelerate/ for examples)")
    try:
        cfg = load_config_from_file(str(path))
    except Exception as e:  # accelerate raises ValueError, TypeError, yaml errors for bad files
        raise LaunchError(f"--accelerate-config {path}: not a valid accelerate config: {e}") from None
    return cfg.to_dict()


def gpu_count() -> int:
    """Visible NVIDIA GPUs, without importing torch (nvidia-smi), honouring CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_argv(num_processes: int | None, config_file: Path | None, train_args: list[str], gpus: int) -> tuple[list[str], dict[str, str]]:
    """The `accelerate launch` command line and the extra environment for `train_args` on N processes."""
    cfg = read_accelerate_config(config_file) if config_file else {}
    n = num_processes or int(cfg.get("num_processes") or 1)
    kind = str(cfg.get("distributed_type", "MULTI_GPU" if n > 1 else "NO")).split(".")[-1]
    env: dict[str, str] = {}
    if gpus == 0:
        if kind in GPU_ONLY:
            raise LaunchError(
                f"--accelerate-config {config_file}: {GPU_ONLY[kind]} needs GPUs (accelerate enables it only on "
                "accelerators) and this machine has none; on CPU use recipes/accelerate/ddp.yaml or just --num-processes"
            )
        env["ACCELERATE_USE_CPU"] = "1"
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    elif n > gpus:
        raise LaunchError(f"--num-processes {n} is more than the {gpus} visible GPU(s); use at most {gpus}")
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n)]
    if config_file:
        argv += ["--config_file", str(config_file)]
    elif n > 1:
        argv += ["--multi_gpu"]  # torchrun-based launcher; on CPU it gives DDP over gloo (see above)
    if n > 1 or kind != "NO":
        argv += ["--num_machines", str(cfg.get("num_machines") or 1)]
        if "main_process_port" not in cfg:
            argv += ["--main_process_port", str(free_port())]
    if not config_file:  # silences accelerate's "defaults were used" warning; the recipe's train.mixed_precision decides
        argv += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    return [*argv, "-m", "grpo_cli", *train_args], env


def relaunch(num_processes: int | None, config_file: Path | None, train_args: list[str]) -> int:
    """Run `train_args` under accelerate launch and return its exit code (signals reach the whole group)."""
    import signal
    import subprocess

    argv, extra_env = launch_argv(num_processes, config_file, train_args, gpu_count())
    proc = subprocess.Popen(argv, env={**os.environ, **extra_env})
    forwarded = []

    def forward(signum, frame) -> None:
        forwarded.append(signum)
        proc.send_signal(signal.SIGTERM)

    # Ctrl-C reaches every process of the foreground group already; SIGTERM sent to us is passed on to the
    # workers' launcher (torchrun), which sends it to each worker: all finish the step, save, and exit. The
    # launcher SIGKILLs workers that take longer than its grace period (~30 s); the last checkpoint stays intact.
    previous = signal.signal(signal.SIGTERM, forward)
    interrupted = False
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # the children got the same SIGINT and stop on their own
                interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    # the launcher itself reports a signal as a failure (1): exit as a single process would, 143 / 130
    return 143 if forwarded else 130 if interrupted else code


def relaunch_run(run, recipe: Path, overrides: list[str], num_processes: int | None, config_file: Path | None) -> int:
    """`grpo train` of a prepared run (grpo_cli/preflight/prepare.py) again under accelerate launch, its workers told
    that this process holds the run folder's lock; -> the launch's exit code."""
    from grpo_cli.run import lock
    from grpo_cli.trainer.layout import layout_problem

    if num_processes and (problem := layout_problem(run.recipe, num_processes)) is not None:
        raise SetupError(problem)  # before any process starts
    flags = [f for f, on in (("--start-over", run.start_over), ("--allow-recipe-change", run.allow_recipe_change),
                             ("--rewind", run.rewind)) if on]
    args = ["train", str(recipe), *overrides, "--output-dir", str(run.folder), *flags]
    os.environ[lock.HOLDER_ENV] = f"{os.getpid()}:{run.folder.resolve()}"  # the workers' lock is ours
    return relaunch(num_processes, config_file, args + (["--resume", run.resume] if run.resume else []))
