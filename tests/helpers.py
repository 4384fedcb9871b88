"""Small helpers shared by tests (fixtures live in conftest.py)."""

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("time/", "throughput/", "memory/")  # wall-clock and peak-memory numbers differ between runs


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(m: dict) -> dict:
    """A metrics record without the keys that differ between two identical runs."""
    return {k: v for k, v in m.items() if not k.startswith(VOLATILE)}


def cli(*args: str, timeout: float = 300, fresh: bool = False, cwd=ROOT, **kw) -> subprocess.CompletedProcess:
    """`python -m grpo_cli ARGS` in `cwd` (the repo root), output captured: a child forked from a zygote of this
    worker (tests/zygote.py: the imports already done). A new interpreter instead with `fresh`, with GRPO_TEST_FRESH
    set, with other subprocess.run arguments, or where no zygote serves `env` (Zygote.get)."""
    env = dict(kw.pop("env", os.environ))
    args = tuple(os.fspath(a) for a in args)
    argv = [sys.executable, "-m", "grpo_cli", *args]
    zygote = None if fresh or kw or os.environ.get("GRPO_TEST_FRESH") else Zygote.get(args, env)
    if zygote is None:
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env, **kw)
    return zygote.run(argv, list(args), env, os.fspath(cwd), timeout)


def popen(*args: str, env: dict | None = None, stdout=None, stderr=None, cwd=None, fresh: bool = False):
    """`python -m grpo_cli ARGS` started and not waited for (a server, a run to interrupt): a child forked from a
    zygote as `cli` forks one, with subprocess.Popen's pid, returncode, poll, wait, send_signal, terminate and kill
    (Forked); a subprocess.Popen where `cli` would start a new interpreter or where an output is a pipe."""
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", "grpo_cli", *(os.fspath(a) for a in args)]
    piped = subprocess.PIPE in (stdout, stderr)
    zygote = None if fresh or piped or os.environ.get("GRPO_TEST_FRESH") else Zygote.get(args, env)
    if zygote is None:
        return subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, cwd=cwd)
    with open(os.devnull, "wb") as null:
        def fd(target, inherited: int) -> int:  # as Popen reads stdout= and stderr=
            return {None: inherited, subprocess.DEVNULL: null.fileno()}.get(target, target) if isinstance(
                target, int) or target is None else target.fileno()

        out = fd(stdout, 1)
        err = out if stderr == subprocess.STDOUT else fd(stderr, 2)
        pid, conn = zygote.start(argv[3:], env, [out, err], os.fspath(cwd or os.getcwd()))
    return Forked(argv, pid, conn, zygote)


class Forked:
    """A command forked by a zygote, seen as subprocess.Popen shows a child: its status arrives on the zygote's
    connection (a thread waits for it). A zygote that goes away before its child ends reads as a SIGKILL."""

    def __init__(self, argv: list[str], pid: int, conn, zygote: "Zygote") -> None:
        import threading

        self.args, self.pid, self.returncode = argv, pid, None
        self._ended = threading.Event()
        zygote.children.append(self)
        threading.Thread(target=self._await, args=(conn,), daemon=True).start()

    def _await(self, conn) -> None:
        import signal

        with conn, conn.makefile("rb") as replies:
            line = replies.readline()
        self.returncode = os.waitstatus_to_exitcode(json.loads(line)["status"]) if line else -signal.SIGKILL
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._ended.is_set():
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc) -> None:
        self.wait()


class Zygote:
    """A tests/zygote.py of this worker. One per flavor (with vLLM imported or not) and per value of what libraries
    read at import (IMPORT_TIME), started at its first command; at most LIMIT at a time: a new one replaces the one
    used least recently that has no command running, and a command gets a new interpreter where every one has."""

    IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "MKL_", "KMP_", "PYTHON", "TORCH",
                   "CUDA_", "ACCELERATE_", "WANDB_", "MLFLOW_", "TENSORBOARD", "LD_", "VLLM_")  # read at import
    LIMIT = 3
    instances: dict[tuple, "Zygote"] = {}

    def __init__(self, env: dict, vllm: bool) -> None:
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="grpo-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.log = open(os.path.join(self.folder, "log"), "wb")
        self.children: list[Forked] = []  # popen's, while they run
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests/zygote.py"), self.path, *["--vllm"] * vllm],
                                     cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    @classmethod
    def get(cls, args, env: dict) -> "Zygote | None":
        """The zygote for a command: with vLLM imported where an argument names vLLM (serve-vllm, rollout.backend=
        vllm, --backend vllm); None (a new interpreter) where `env` puts other folders on PYTHONPATH or every zygote is
        busy. A child of it sees what a new interpreter with `env` would have imported."""
        if env.get("PYTHONPATH") != os.environ.get("PYTHONPATH"):  # a sitecustomize there may read anything at start
            return None
        vllm = any("vllm" in os.fspath(a) for a in args)
        key = (vllm, tuple(sorted((k, v) for k, v in env.items() if k.startswith(cls.IMPORT_TIME))))
        zygote = cls.instances.pop(key, None)
        if zygote is None or zygote.proc.poll() is not None:
            while len(cls.instances) >= cls.LIMIT:
                idle = [k for k, z in cls.instances.items() if not z.busy()]
                if not idle:
                    return None
                cls.instances.pop(idle[0]).close()
            zygote = cls(env, vllm)
        cls.instances[key] = zygote  # (last: the order is of use)
        return zygote

    def busy(self) -> bool:
        self.children = [c for c in self.children if c.poll() is None]
        return bool(self.children)

    def close(self) -> None:
        import shutil

        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _connect(self):
        import socket
        import time

        deadline = time.monotonic() + 120
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                return s
            except OSError:
                s.close()
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tests/zygote.py did not start: {open(self.log.name).read()[-3000:]}")
                time.sleep(0.05)

    def start(self, args: list[str], env: dict, fds: list[int], cwd: str, timeout: float = 120):
        """Fork `python -m grpo_cli ARGS` with stdout and stderr on `fds`: (its pid, the connection its status
        comes on)."""
        import socket

        request = json.dumps({"argv": args, "env": env, "cwd": cwd}).encode() + b"\n"
        s = self._connect()
        try:
            sent = socket.send_fds(s, [request], fds)
            s.sendall(request[sent:])
            s.settimeout(timeout)
            line = b""
            while not line.endswith(b"\n"):
                more = s.recv(1)
                if not more:
                    raise RuntimeError(f"tests/zygote.py went away: {open(self.log.name).read()[-3000:]}")
                line += more
        except BaseException:
            s.close()
            raise
        s.settimeout(None)
        return json.loads(line)["pid"], s

    def run(self, argv: list[str], args: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
        import signal
        import tempfile

        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                pid, s = self.start(args, env, [out.fileno(), err.fileno()], cwd, timeout)
            except TimeoutError:  # the zygote never forked it
                raise subprocess.TimeoutExpired(argv, timeout) from None
            with s, s.makefile("rb") as replies:
                s.settimeout(timeout)
                try:
                    status = json.loads(replies.readline())["status"]
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    s.settimeout(30)
                    replies.readline()
                    out.seek(0), err.seek(0)
                    raise subprocess.TimeoutExpired(argv, timeout, output=out.read().decode(errors="replace"),
                                                    stderr=err.read().decode(errors="replace")) from None
            out.seek(0), err.seek(0)
            return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status),
                                               out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def wait_for(predicate, timeout: float = 120, proc: subprocess.Popen | None = None) -> None:
    """Poll `predicate` until it holds; AssertionError with its stderr when `proc` exits first."""
    import time

    t0 = time.monotonic()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited early with {proc.returncode}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        time.sleep(0.1)


@contextmanager
def saved_for_backward(model):
    """What autograd saves for the backward inside the block, the model's parameters left out: a list that fills
    with (storage address, shape, storage bytes, element size), one entry per saved tensor (views of one storage
    give one entry each)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: list[tuple[int, tuple, int, int]] = []

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved.append((storage.data_ptr(), tuple(t.shape), storage.nbytes(), t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def counted_applies(monkeypatch, function) -> list:
    """The calls of an autograd function's `apply` from here to the test's end: a list that fills with one entry
    each."""
    calls: list[int] = []
    real = function.apply
    monkeypatch.setattr(function, "apply", lambda *a: calls.append(1) or real(*a))
    return calls


def loss_of(loss_type: str, logps, old_logps, advantages, mask, **kw):
    """compute_loss with the loss's settings by keyword, as a recipe's algorithm section gives them."""
    from grpo_cli.algo.losses import LossConfig, compute_loss

    settings = {k: kw.pop(k) for k in list(kw) if k in LossConfig.__dataclass_fields__}
    return compute_loss(LossConfig(loss_type, **settings), logps, old_logps, advantages, mask, **kw)


# ----- small models and optimizers for the checkpoint tests (tests/run/)
RECIPE = "name: tiny\ntrain:\n  max_steps: 3\n"


def tiny_model(seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(cfg)


class IdsTokenizer:
    """What the hf backend asks of a tokenizer, for sampling tests: pad 0, end of turn 1, ids decoded as numbers."""

    pad_token_id, eos_token_id = 0, 1

    def batch_decode(self, lists, skip_special_tokens=True):
        return [" ".join(map(str, x)) for x in lists]


def tiny_sampler(dtype=None):
    """A random 2-layer Qwen2 to sample from (vocabulary 64, 4 query heads on 2 key/value heads, as Qwen2.5's; tied
    head), its generation config ending at 1 and padding with 0 (`IdsTokenizer`'s)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to(dtype or torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0)
    return model


def tiny_lm(kind: str):
    """A random 2-layer Qwen2 or Llama (4 query heads on 2 key/value heads, vocabulary 300), float32, in train mode:
    for the log-prob tests (tests/algo/)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(Qwen2Config(**common)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**common))
    return model.float().train()


def warmup(step: int) -> float:  # a plain function: LambdaLR stores None for it
    return min(1.0, (step + 1) / 4)


def make_opt(model):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup)


def train_step(model, opt, sched, ids) -> None:
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()


def batch(seed: int):
    import torch

    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["one two three", "2 + 2 = 4", "the answer is 4"], trainers.BpeTrainer(vocab_size=300))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


# ----- a tiny reward model (tests/rewards/)
def build_reward_model(folder, *, num_labels: int = 1, chat_template: bool = True, causal: bool = False) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen2Config

    from grpo_cli.models.builtin import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    if not chat_template:
        tok.chat_template = None
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, num_labels=num_labels,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    auto.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def train_on_echo(model: str, out_dir, *args: str) -> subprocess.CompletedProcess:
    """`grpo train` of the tiny recipe on 3-turn episodes with tests/envs.py's Echo environment."""
    return cli("train", "recipes/ci-tiny.yaml", f"model.name_or_path={model}", "rollout.environment=tests/envs.py:Echo",
               "rollout.max_turns=3", "rollout.environment_kwargs={turns: 3}", "rollout.max_completion_length=24",
               "rewards=[{name: environment}, {name: recipes/rewards/toy.py:digit_fraction}]",
               "checkpoint.every_steps=2", f"logging.output_dir={out_dir}", *args, timeout=300)


def chi_square_p(counts, probs) -> float:
    """The p-value of Pearson's chi-square test of `counts` against `probs` (tensors; tokens of probability 0 left
    out): the regularised upper incomplete gamma function at (k - 1) / 2 and half the statistic."""
    import torch

    kept = probs > 0
    expected = probs[kept] * counts.sum()
    stat = ((counts[kept].double() - expected.double()) ** 2 / expected.double()).sum()
    return float(torch.special.gammaincc(torch.tensor((int(kept.sum()) - 1) / 2, dtype=torch.float64), stat / 2))


def two_tokens_p_values(model, drawn, prompt: list[int], temperature: float) -> list[float]:
    """Chi-square p-values of the first and second tokens `drawn` ([n, 2]) after `prompt`, by a model of 64 tokens
    that ends a turn at 1 and pads with 0, against its own distribution at `temperature`: the first softmax(logits / T)
    at the prompt's last position, the second that after each first token weighted by its probability (tokens with
    fewer than 5 expected draws pooled)."""
    import torch

    with torch.no_grad():
        rows = torch.tensor(prompt).expand(64, len(prompt))
        logits = model(torch.cat([rows, torch.arange(64)[:, None]], 1)).logits[:, -2:].double()
    first, then = torch.softmax(logits[0, 0] / temperature, -1), torch.softmax(logits[:, 1] / temperature, -1)
    then[1] = torch.nn.functional.one_hot(torch.tensor(0), 64)  # after the end of turn (1): padding (0)
    second = first @ then  # the sum over first tokens f of p(f) p(. | f)
    out = []
    for position, p in ((0, first), (1, second)):
        counts = torch.bincount(drawn[:, position], minlength=64).double()
        small = p * len(drawn) < 5
        pooled = lambda v: torch.cat([v[~small], v[small].sum().view(1)])  # noqa: E731
        out.append(chi_square_p(pooled(counts), pooled(p)))
    return out


def resident_gib() -> float:
    """What is resident now (VmRSS): the baseline of a phase, whose counter restarts from here. Not the process
    peak, which an earlier test in the same worker may have set far higher."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 2**20


def kept_after_free(mib: int) -> float:
    """MiB of a `mib` MiB block, made, written and freed, that stay resident: about all of it where the allocator kept
    it for reuse (grpo_cli/process/allocator.py), about none where it went back to the kernel (glibc's default for a
    first block of that size)."""
    import torch

    before = resident_gib()
    t = torch.ones(mib * 2**20, dtype=torch.uint8)  # written: every page resident
    del t
    return (resident_gib() - before) * 1024


# The kernels' vector widths (grpo_cli/models/simd.h) as -march names, and the CPU flags each needs to run
KERNEL_WIDTHS = {"AVX2": ("x86-64-v3", {"avx2", "fma"}),
                 "AVX-512": ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})}


def kernel_of_width(width: str, folder: Path):
    """grpo_cli/models/few_rows.py's library built for `width` (a key of KERNEL_WIDTHS) in `folder`, whatever width
    this machine's own build takes; skips the test where this CPU cannot run it or there is no C compiler."""
    import platform
    import shutil

    import pytest

    from grpo_cli.models import few_rows

    march, needs = KERNEL_WIDTHS[width]
    compiler = shutil.which("cc") or shutil.which("gcc")
    if platform.machine() != "x86_64" or not needs <= set(few_rows.cpu_flags().split()) or compiler is None:
        pytest.skip(f"this machine cannot run the kernels' {width} build")
    return few_rows.load(few_rows.build(folder, compiler, march))
