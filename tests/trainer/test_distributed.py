"""Multi-process training on CPU (DDP over gloo through `accelerate launch`) and the shipped accelerate configs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_cli.algo.advantages import compute_advantages
from grpo_cli.errors import LaunchError
from grpo_cli.trainer.launch import free_port, gpu_count, launch_argv

from helpers import read_jsonl, stable

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"
CONFIGS = sorted((ROOT / "recipes/accelerate").glob("*.yaml"))
CPU_ENV = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.usefixtures("model_cache")


def run(argv: list[str], env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)


LOSSES = ["grpo", "dr_grpo", "dapo", "cispo"]
# issue 35: every statistic TRL takes over processes or micro-batches, with the overrides that turn it on, and the
# micro-batch sizes of one process and of each of two (None: 12 and 3, so a window is 1 micro-batch or 2 x 2)
CASES = [(loss, [f"algorithm.loss_type={loss}", *(["algorithm.epsilon_high=5.0"] if loss == "cispo" else [])], None)
         for loss in LOSSES] + [
    ("vespo", ["algorithm.loss_type=vespo"], None),
    ("luspo", ["algorithm.loss_type=luspo", "algorithm.importance_sampling_level=sequence"], None),
    ("sapo", ["algorithm.loss_type=sapo"], None),
    ("scale-batch", ["algorithm.loss_type=grpo", "algorithm.scale_rewards=batch"], None),
    ("packed", ["algorithm.loss_type=dapo", "train.packing=true"], None),  # every micro-batch packed on both sides
    # the LM head inside the chunks, tied to the embedding: each process adds its second micro-batch's head and
    # embedding gradients into the kept one in place (algo/head_gradient.py), which DDP then reduces as it finds it
    ("chunked-head", ["algorithm.loss_type=dapo", "train.chunked_lm_head=true"], (6, 3)),
]
# TRL's entropy bonus is each micro-batch's mean entropy / accumulation steps, averaged over processes, and its
# top-entropy threshold the quantile over the micro-batch of every process: the same batch is then one whose
# micro-batches hold as many tokens (full-length completions), and for the quantile one micro-batch a process
# (the two processes' micro-batches together are the one process's)
FULL_LENGTH = [
    ("entropy-bonus", ["algorithm.loss_type=dapo", "algorithm.entropy_coef=0.05"], None),
    ("adaptive-entropy", ["algorithm.loss_type=dapo", "algorithm.entropy_coef=0.01", "algorithm.use_adaptive_entropy=true",
                          "algorithm.entropy_target=100", "algorithm.entropy_coef_delta=0.02"], None),
    ("top-entropy", ["algorithm.loss_type=grpo", "algorithm.top_entropy_quantile=0.5"],
     (12, 6)),
]
# episodes split into several training samples where their history changed (issue 37): the processes hold unequal
# sample counts, the fewer padded with rows that train nothing; a global token mean is the single process's
SPLIT = [("split-episodes", ["algorithm.loss_type=dapo"], None)]
# train.mini_batches (issue 38): 2 optimizer steps a window (4 with mu = 2), each on block j of the 12 rows: one
# process's rows 6j..6j+5 (one micro-batch of 6), or each of two processes' share of them (one micro-batch of 3)
MINI = [(f"mini-batches-{loss}", [f"algorithm.loss_type={loss}", "train.mini_batches=2"], None)
        for loss in ("dapo", "grpo")]
# on-policy distillation's term, added in the update with each process's old log-probs as the student's
DISTILL = [("distillation", ["algorithm.loss_type=dapo"], None)]
LOGGED = ("loss", "policy_loss", "entropy", "kl", "entropy_coef", "clip_ratio/region_mean", "vespo/phi_seq_mean")
LR = 0.05  # the worker's learning rate


@pytest.mark.multiprocess
def test_two_processes_give_the_single_process_gradient_weights_and_metrics(tmp_path):
    # The same fixed 12-row rollout: one process with one micro-batch of 12, or 2 processes x 2 micro-batches
    # of 3 (group 1 spans both). mu=2, beta>0: two accumulation windows, the second after an AdamW step.
    worker = str(ROOT / "tests/mp_grad_worker.py")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    for folder, k in ((one, 0), (two, 1)):
        (folder / "cases.json").write_text(json.dumps([
            {"name": name, "overrides": overrides, "micro_batch_size": (sizes or (12, 3))[k], "full_length": full,
             "split": cases is SPLIT, "teacher": cases is DISTILL}
            for full, cases in ((False, CASES), (True, FULL_LENGTH), (False, SPLIT), (False, MINI), (False, DISTILL))
            for name, overrides, sizes in cases]))
    p = run([sys.executable, worker, str(one), str(one / "cases.json")])
    assert p.returncode == 0, p.stderr[-3000:]
    argv, env = launch_argv(2, None, [], gpus=0)  # the route `grpo train --num-processes 2` takes on CPU
    argv = argv[: argv.index("-m", 3)] + [worker, str(two), str(two / "cases.json")]
    p = run(argv, env)
    assert p.returncode == 0, p.stderr[-3000:]
    for name, overrides, _ in CASES + FULL_LENGTH + SPLIT + MINI + DISTILL:
        a, b = load_file(str(one / f"{name}.safetensors")), load_file(str(two / f"{name}.safetensors"))
        windows = 2 * (2 if "train.mini_batches=2" in overrides else 1)  # mu = 2
        assert a.keys() == b.keys() and {k.split(".")[0] for k in a} == {*map(str, range(windows)), "weights"}
        first = [k for k in a if k.startswith("0.")]
        assert max(a[k].abs().max().item() for k in first) > 1e-2, name  # a real gradient
        assert max((a[k] - b[k]).abs().max().item() for k in first) <= 1e-6, name
        # after one AdamW step the fp32 rounding of the two sums (~1e-8) is amplified by Adam's normalisation
        assert max((a[k] - b[k]).abs().max().item() for k in a if not k.startswith("weights.")) <= 1e-4, name
        # the weights after both AdamW steps: Adam divides by |g|, so a gradient entry at float noise can flip its
        # update (up to 2 x LR); a wrong statistic moves every entry
        diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a if k.startswith("weights.")])
        assert diff.mean().item() <= 1e-4 * LR and (diff > 0.01 * LR).float().mean().item() <= 1e-3, name
        ma, mb = json.loads((one / f"{name}.json").read_text()), json.loads((two / f"{name}.json").read_text())
        logged = [k for k in LOGGED if k in ma]
        assert "loss" in logged and logged == [k for k in LOGGED if k in mb], name
        for k in logged:
            assert mb[k] == pytest.approx(ma[k], rel=1e-4, abs=1e-6), (name, k)
    taught, plain = load_file(str(one / "distillation.safetensors")), load_file(str(one / "dapo.safetensors"))
    assert max((taught[k] - plain[k]).abs().max().item() for k in taught if k.startswith("0.")) > 1e-3  # it acts


def grpo_train(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "grpo_cli", "train", str(TINY), "-o", str(run_dir), "--num-processes", "2",
                "train.prompts_per_step=3", "train.micro_batch_size=3", *args], CPU_ENV)


@pytest.mark.multiprocess
def test_num_processes_trains_checkpoints_and_resumes_exactly(tmp_path):
    # B=3 prompts x G=4 = 12 rows, 6 per process: group 1 (rows 4-7) is split over both processes.
    mp = tmp_path / "mp"
    p = grpo_train(mp, "train.max_steps=2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("done: 2 steps") == 1  # only the main process reports
    rollouts, metrics = read_jsonl(mp / "rollouts.jsonl"), read_jsonl(mp / "metrics.jsonl")
    assert len(rollouts) == 2 * 12 and len(metrics) == 2
    for step in (1, 2):
        rows = [r for r in rollouts if r["step"] == step]
        assert [(r["group"], r["sample"]) for r in rows] == [(g, s) for g in range(3) for s in range(4)]
        rewards = torch.tensor([r["reward"] for r in rows])
        adv = compute_advantages(rewards, 4, "group")  # each group normalised over all its G completions
        assert torch.allclose(adv, torch.tensor([r["advantage"] for r in rows]), atol=1e-5)
        assert metrics[step - 1]["reward"] == pytest.approx(rewards.mean().item(), abs=1e-6)  # global metric
        lengths = torch.tensor([float(r["length"]) for r in rows])
        assert metrics[step - 1]["completions/mean_length"] == pytest.approx(lengths.mean().item())
    assert len({r["completion"] for r in rollouts if r["step"] == 1}) > 6  # seed + rank: different samples
    assert sorted(x.name for x in (mp / "checkpoints").iterdir()) == ["step-2"]

    # resume to step 4 == an uninterrupted 4-step run (each rank gets its own RNG state back)
    p = grpo_train(mp, "train.max_steps=4", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from" in p.stdout + p.stderr
    full = grpo_train(tmp_path / "full", "train.max_steps=4")
    assert full.returncode == 0, full.stderr[-3000:]
    a, b = read_jsonl(tmp_path / "full/metrics.jsonl"), read_jsonl(mp / "metrics.jsonl")
    assert [stable(m) for m in a] == [stable(m) for m in b]
    ca = [r["completion"] for r in read_jsonl(tmp_path / "full/rollouts.jsonl")]
    assert ca == [r["completion"] for r in read_jsonl(mp / "rollouts.jsonl")]


@pytest.mark.multiprocess
def test_sigterm_to_the_launcher_stops_every_process_after_a_checkpoint(tmp_path):
    import signal
    import time

    mp = tmp_path / "sig"
    cmd = [sys.executable, "-m", "grpo_cli", "train", str(TINY), "-o", str(mp), "--num-processes", "2",
           "train.prompts_per_step=3", "train.micro_batch_size=3", "train.max_steps=500", "checkpoint.every_steps=0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **CPU_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics, deadline = mp / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert (mp / "checkpoints").is_dir(), (out + err)[-4000:]  # what the processes said when none was saved
    (ckpt,) = (mp / "checkpoints").iterdir()  # both processes stopped after the same step, one saved it
    steps = len(read_jsonl(metrics))
    assert ckpt.name == f"step-{steps}" and 3 <= steps < 500
    assert (out + err).count("stopped by signal after step") == 1


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_accelerate_configs_parse_into_their_plugins(path, monkeypatch):
    """Each config goes through accelerate's own launch parsing; the env it produces builds the plugin."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "x.py"]))
    machines = 2 if "machines" in path.stem else 1
    assert args.num_processes == 8 * machines and defaults.num_machines == machines
    assert "#" in path.read_text().splitlines()[0]  # opens with when to use it
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    name = path.stem
    if name == "fsdp2":
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert plugin.state_dict_type.name == "FULL_STATE_DICT" and plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    elif name.startswith("deepspeed"):
        plugin = DeepSpeedPlugin()
        stage = int(name[-1])
        zero = plugin.deepspeed_config["zero_optimization"]
        assert plugin.zero_stage == stage and zero["stage"] == stage
        assert plugin.deepspeed_config["gradient_accumulation_steps"] == "auto" or plugin.gradient_accumulation_steps == 1
        assert zero.get("stage3_gather_16bit_weights_on_model_save", False) is (stage == 3)
    else:
        assert name.startswith("ddp") and args.multi_gpu and env.get("ACCELERATE_USE_FSDP") is None
        if machines > 1:  # what torchrun gets on machine 0 (--machine_rank overrides the rank on the others)
            assert (args.num_machines, args.machine_rank, args.main_process_ip, args.main_process_port) == (2, 0, "10.0.0.1", 29500)


@pytest.mark.multiprocess
@pytest.mark.skipif(gpu_count() > 0, reason="checks the CPU-only refusal")
@pytest.mark.parametrize("name", ["fsdp2", "deepspeed-zero3"])
def test_gpu_only_configs_are_refused_on_cpu(tmp_path, name):
    cfg = ROOT / f"recipes/accelerate/{name}.yaml"
    with pytest.raises(LaunchError, match="needs GPUs"):
        launch_argv(None, cfg, [], gpus=0)
    p = run([sys.executable, "-m", "grpo_cli", "train", str(TINY), "-o", str(tmp_path / "r"), "--accelerate-config", str(cfg)])
    assert p.returncode == 2 and "ddp.yaml" in p.stderr and "Traceback" not in p.stderr
    if name != "fsdp2":
        return  # accelerate launch itself stops a DeepSpeed config when deepspeed is not installed
    # launched by hand, accelerate would set up 2 unrelated single-process runs: the engine refuses
    p = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), "--num_processes", "2",
             "-m", "grpo_cli", "train", str(TINY), "-o", str(tmp_path / "r")], {"OMP_NUM_THREADS": "1"})
    assert p.returncode != 0 and "FSDP and DeepSpeed need GPUs" in p.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_launch_argv_is_accelerate_launch_of_the_same_command(tmp_path):
    argv, env = launch_argv(2, None, ["train", "r.yaml", "a.b=1"], gpus=0)
    assert argv[1:4] == ["-m", "accelerate.commands.launch", "--num_processes"] and argv[4] == "2"
    assert "--multi_gpu" in argv and argv[-5:] == ["-m", "grpo_cli", "train", "r.yaml", "a.b=1"]
    assert env["ACCELERATE_USE_CPU"] == "1"
    argv, env = launch_argv(None, ROOT / "recipes/accelerate/fsdp2.yaml", ["train"], gpus=8)
    assert argv[argv.index("--num_processes") + 1] == "8" and "--multi_gpu" not in argv and env == {}
    with pytest.raises(LaunchError, match="more than the 4 visible"):
        launch_argv(8, None, ["train"], gpus=4)
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: [unclosed\n")
    with pytest.raises(LaunchError, match="not a valid accelerate config"):
        launch_argv(2, bad, ["train"], gpus=0)


def fsdp_train(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
                str(ROOT / "tests/fsdp_cpu_worker.py"), str(TINY), "-o", str(run_dir), "train.prompts_per_step=3",
                "train.micro_batch_size=3", "algorithm.beta=0.05", "eval={every_steps: 2, limit: 3}", *args], CPU_ENV)


@pytest.mark.multiprocess
def test_fsdp2_checkpoints_gather_and_resume_exactly(tmp_path):
    """FSDP2 (fully_shard over gloo, through tests/fsdp_cpu_worker.py): synced generation and eval, gathered
    weights and optimizer state in checkpoints, and an exact resume."""
    mp = tmp_path / "mp"
    p = fsdp_train(mp, "train.max_steps=2")
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = mp / "checkpoints/step-2"
    optimizer = json.loads((ckpt / "trainer/optimizer.json").read_text())["state"]
    assert "model.layers.0.self_attn.q_proj.weight" in optimizer["state"]  # full state, by parameter name
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt)  # full weights, an ordinary HF model
    assert sum(p.numel() for p in model.parameters()) == 123456
    p = fsdp_train(mp, "train.max_steps=4", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    full = fsdp_train(tmp_path / "full", "train.max_steps=4")
    assert full.returncode == 0, full.stderr[-3000:]
    a, b = read_jsonl(tmp_path / "full/metrics.jsonl"), read_jsonl(mp / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4] and "eval/accuracy" in b[1] and b[-1]["kl"] > 0
    assert [stable(m) for m in a] == [stable(m) for m in b]
    ca = [r["completion"] for r in read_jsonl(tmp_path / "full/rollouts.jsonl")]
    assert ca == [r["completion"] for r in read_jsonl(mp / "rollouts.jsonl")]


@pytest.mark.multiprocess
def test_dynamic_sampling_decides_over_both_processes(tmp_path):
    # group 1 of each round is split over the two processes; the kept groups are redistributed by rows
    run_dir = tmp_path / "ds"
    p = grpo_train(run_dir, "train.max_steps=2", "rewards=[{name: 'tests/signal_rewards.py:odd_answers_only'}]",
                   "algorithm.dynamic_sampling={enabled: true, max_rounds: 8}")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics, rollouts = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "rollouts.jsonl")
    assert [m["frac_reward_zero_std"] for m in metrics] == [0.0, 0.0]
    assert any(m["dynamic_sampling/rounds"] > 1 for m in metrics)
    for step in (1, 2):
        rows = [r for r in rollouts if r["step"] == step]
        assert [(r["group"], r["sample"]) for r in rows] == [(g, s) for g in range(3) for s in range(4)]
        assert all(int(r["answer"]) % 2 == 1 for r in rows)
        rewards = torch.tensor([r["reward"] for r in rows])
        adv = compute_advantages(rewards, 4, "group")
        assert torch.allclose(adv, torch.tensor([r["advantage"] for r in rows]), atol=1e-5)
        assert all(len({r["prompt"] for r in rows if r["group"] == g}) == 1 for g in range(3))


@pytest.mark.multiprocess
def test_step_rewards_are_normalised_over_both_processes(tmp_path):
    # group 1 of B=3 x G=4 is split over the two processes: its step rewards are gathered before normalising
    run_dir = tmp_path / "steps"
    p = grpo_train(run_dir, "train.max_steps=2",
                   "rewards=[{name: accuracy}, {name: 'tests/signal_rewards.py:digit_steps', level: step}]")
    assert p.returncode == 0, p.stderr[-3000:]
    rollouts = read_jsonl(run_dir / "rollouts.jsonl")
    assert len(rollouts) == 2 * 12 and all("digit_steps" in r["steps"] for r in rollouts)
    assert [(r["group"], r["sample"]) for r in rollouts if r["step"] == 1] == [(g, s) for g in range(3) for s in range(4)]


@pytest.mark.multiprocess
def test_a_group_judge_is_refused_where_a_group_would_be_split_over_processes(tmp_path):
    """A group judge ranks a prompt's G completions together; with B=3 x G=4 rows dealt 6 to a process, group 1 would
    be ranked as two halves, each half's best getting 1. The launch stops before any step and says what fits."""
    judge = "{name: judge, kwargs: {base_url: 'http://127.0.0.1:1/v1', model: m, mode: group}}"
    p = grpo_train(tmp_path / "split", "train.max_steps=1", f"rewards=[{judge}]")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]  # refused before any process started
    assert "ranks each prompt's 4 completions together" in p.stderr and "6 rows" in p.stderr, p.stderr[-3000:]
    assert not (tmp_path / "split" / "metrics.jsonl").exists()
    p = grpo_train(tmp_path / "whole", "train.max_steps=1", "train.prompts_per_step=4", "train.micro_batch_size=4",
                   f"rewards=[{judge}]")  # 8 rows a process: whole groups; the judge is then asked (and unreachable)
    assert p.returncode == 1 and "ranks each prompt" not in p.stderr and "Connection refused" in p.stderr, p.stderr[-3000:]
