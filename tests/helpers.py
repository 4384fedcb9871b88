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


def cli(*args: str, timeout: float = 300, fresh: bool = False, **kw) -> subprocess.CompletedProcess:
    """`python -m grpo_cli ARGS` from the repo root, output captured: a child forked from this worker's zygote
    (tests/zygote.py: the imports already done). A new interpreter instead with `fresh`, with GRPO_TEST_FRESH set,
    or where `env` changes what libraries read at import."""
    env = dict(kw.pop("env", os.environ))
    argv = [sys.executable, "-m", "grpo_cli", *args]
    if fresh or kw or os.environ.get("GRPO_TEST_FRESH") or not Zygote.serves(env):
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env, **kw)
    return Zygote.get().run(argv, [os.fspath(a) for a in args], env, timeout)


class Zygote:
    """This worker's tests/zygote.py, started at its first command."""

    IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "MKL_", "KMP_", "PYTHON", "TORCH",
                   "CUDA_", "ACCELERATE_", "WANDB_", "MLFLOW_", "TENSORBOARD", "LD_")  # read by libraries at import
    instance: "Zygote | None" = None

    def __init__(self) -> None:
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="grpo-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.env = dict(os.environ)
        self.log = open(os.path.join(self.folder, "log"), "wb")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests/zygote.py"), self.path], cwd=ROOT,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    @classmethod
    def get(cls) -> "Zygote":
        if cls.instance is None or cls.instance.proc.poll() is not None:
            cls.instance = cls()
        return cls.instance

    @classmethod
    def serves(cls, env: dict) -> bool:
        """Whether a child of the zygote would see what a new interpreter with `env` would have imported."""
        base = cls.instance.env if cls.instance is not None else os.environ

        def imported(e):
            return {k: v for k, v in e.items() if k.startswith(cls.IMPORT_TIME)}

        return imported(env) == imported(base)

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

    def run(self, argv: list[str], args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        import signal
        import socket
        import tempfile

        request = json.dumps({"argv": args, "env": env, "cwd": str(ROOT)}).encode() + b"\n"
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, self._connect() as s:
            sent = socket.send_fds(s, [request], [out.fileno(), err.fileno()])
            s.sendall(request[sent:])
            replies = s.makefile("rb")
            s.settimeout(timeout)
            try:
                pid = json.loads(replies.readline())["pid"]
            except TimeoutError:  # the zygote never forked it
                raise subprocess.TimeoutExpired(argv, timeout) from None
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
