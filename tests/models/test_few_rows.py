"""The few-row product kernel (grpo_cli/models/few_rows.py): torch's product to float rounding at every shape it takes,
the same result whatever the threads, torch's own product wherever it does not apply (and where it cannot be built),
and a `generate` through it that samples the policy's distribution."""

import os
import platform
import shutil
import stat
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2ForCausalLM

from grpo_cli.models import few_rows
from grpo_cli.models.linear import use_accumulating_linears
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.hf import HFGenerator

from helpers import KERNEL_WIDTHS, IdsTokenizer as Tok, tiny_sampler, two_tokens_p_values

torch.set_num_threads(1)

needs_kernel = pytest.mark.skipif(few_rows.library() is None, reason="no C compiler, AVX2 or AVX-512 on this machine")


def test_it_is_built_wherever_the_cpu_has_avx2_or_avx512():
    """AVX2 with FMA (AMD since 2017, Intel since 2013) is enough: the CI machine and most rented ones take it."""
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split())
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("not Linux on x86-64 with a C compiler")
    if not ({"avx2", "fma"} <= flags or "avx512f" in flags):
        pytest.skip("a CPU without AVX2 and FMA")
    assert few_rows.library() is not None
    assert few_rows.vectors(" ".join(flags)) == ("AVX-512" if "avx512f" in flags else "AVX2")


def test_the_width_is_the_widest_the_cpu_flags_name():
    assert few_rows.vectors("flags\t: fpu sse2 avx avx2 fma bmi2") == "AVX2"
    assert few_rows.vectors("flags\t: fpu avx avx2 fma avx512f avx512bw avx512vl") == "AVX-512"
    assert few_rows.vectors("flags\t: fpu sse4_2 avx avx2") is None  # AVX2 without FMA: no kernel
    assert few_rows.vectors("flags\t: fpu sse4_2 avx") is None
    assert few_rows.vectors("") is None


@pytest.mark.parametrize("width", list(KERNEL_WIDTHS))
def test_each_vector_width_is_torchs_product_whatever_the_threads(kernels, width):
    """The AVX2 build (x packed transposed, tiles of 12, 6 or 4 rows of W by 1-3 vectors of 8 rows of x) and the
    AVX-512 one (4 x 4 tiles of 16 lanes), each where the CPU runs it: every tile shape and tail, to float rounding,
    the same bits on 1 and 2 threads."""
    lib = kernels(width)
    g = torch.Generator().manual_seed(7)
    for rows, n, k in [(4, 1, 1), (5, 7, 17), (9, 25, 40), (13, 97, 103), (16, 129, 64), (16, 1000, 576),
                       (24, 64, 1536), (30, 23, 48)]:
        x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
        outs = []
        for threads in (1, 2):
            y = torch.full((rows, n), float("nan"))
            lib.few_rows_product(x.data_ptr(), rows, w.data_ptr(), n, k, y.data_ptr(), threads)
            outs.append(y)
        want = F.linear(x, w)
        torch.testing.assert_close(outs[0], want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        assert torch.equal(outs[0], outs[1]), (rows, n, k)


@pytest.fixture
def sampling():
    """The test samples, as the hf backend's generate does (few_rows.sampling)."""
    with few_rows.sampling():
        yield


@pytest.mark.usefixtures("sampling")
@needs_kernel
@pytest.mark.parametrize("rows", [4, 5, 16, 23, 24])
@pytest.mark.parametrize("n, k", [(1, 1), (3, 15), (4, 16), (7, 17), (129, 64), (64, 1536)])
def test_the_product_is_torchs_to_float_rounding(rows, n, k):
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias in (None, b):
        want, got = F.linear(x, w, bias), few_rows.linear(x, w, bias)
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.usefixtures("sampling")
@needs_kernel
def test_leading_dimensions_and_a_strided_input():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 24, generator=g)
    x = torch.randn(2, 3, 24, generator=g)  # 6 rows in a [2, 3, 24] batch
    torch.testing.assert_close(few_rows.linear(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-5)
    xt = torch.randn(24, 8, generator=g).t()  # 8 rows, not contiguous
    assert not xt.is_contiguous()
    torch.testing.assert_close(few_rows.linear(xt, w, None), F.linear(xt, w), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("sampling")
@needs_kernel
def test_the_threads_do_not_change_the_result():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(16, 576, generator=g), torch.randn(1000, 576, generator=g)
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(few_rows.linear(x, w, None))
    finally:
        torch.set_num_threads(1)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.usefixtures("sampling")
@needs_kernel
def test_outside_its_cases_it_leaves_the_product_to_torch():
    w, x = torch.randn(8, 16), torch.randn(16, 16)
    assert few_rows.linear(x[:1], w, None) is None  # one row: torch's product reads as fast
    assert few_rows.linear(torch.randn(25, 16), w, None) is None  # past FEW_ROWS: torch's is faster
    assert few_rows.linear(x.double(), w.double(), None) is None
    assert few_rows.linear(x.bfloat16(), w.bfloat16(), None) is None
    assert few_rows.linear(x, torch.randn(16, 8).t(), None) is None  # a strided weight would be copied every call
    assert few_rows.linear(x, w, None) is not None
    done = []
    threading.Thread(target=lambda: done.append(few_rows.linear(x, w, None))).start()  # another thread: not sampling
    while not done:
        time.sleep(0.01)
    assert done == [None]


def tiny() -> Qwen2ForCausalLM:
    model = tiny_sampler().eval()
    use_accumulating_linears(model)
    return model


def counted(monkeypatch) -> list:
    calls, real = [], few_rows.linear
    monkeypatch.setattr(few_rows, "linear", lambda *a: calls.append(1) or real(*a))
    return calls


def products(monkeypatch) -> list:
    """The kernel's own products, counted (its sums can equal torch's bit for bit: AVX2's add each output in K's
    order, as MKL does at a small K)."""
    lib, calls = few_rows.library(), []
    real = lib.few_rows_product
    monkeypatch.setattr(lib, "few_rows_product", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.usefixtures("sampling")
@needs_kernel
def test_a_model_outside_autograd_takes_it_and_gives_torchs_logits(monkeypatch):
    model, ids = tiny(), torch.randint(2, 64, (2, 4))  # 8 rows
    calls, kernel = counted(monkeypatch), products(monkeypatch)
    with torch.no_grad():
        got = model(ids).logits
    assert len(calls) == 2 * 7 + 1  # every product: q, k, v, o, gate, up, down a layer and the head
    assert len(kernel) == 2 * 7 + 1  # each by the kernel's sums
    monkeypatch.setattr(few_rows, "FEW_ROWS", range(0))
    with torch.no_grad():
        want = model(ids).logits
    assert len(kernel) == 2 * 7 + 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    n = len(calls)
    model(ids).logits.sum().backward()  # under autograd: the accumulating linear, never the kernel
    assert len(calls) == n and model.lm_head.weight.grad is not None


@needs_kernel
def test_the_trainers_forwards_without_autograd_keep_torchs_products(monkeypatch):
    """An old policy's or a reference's forward (no autograd, not sampling) gives the training forward's logits bit
    for bit, as algo/logprobs.py promises."""
    model, ids = tiny(), torch.randint(2, 64, (2, 4))
    kernel = products(monkeypatch)
    with torch.no_grad():
        no_grad = model(ids).logits
    assert torch.equal(no_grad, model(ids).logits) and kernel == []
    with torch.no_grad(), few_rows.sampling():
        model(ids)
    assert len(kernel) == 2 * 7 + 1  # where the kernel gives its own sums


@needs_kernel
def test_generate_through_it_samples_the_policys_distribution(monkeypatch):
    """4,800 first and second tokens of one prompt at temperature 0.8, drawn by `generate` 16 rows at a time (the
    prompt's 4 positions and each decode step's 16 rows through the kernel): each position passes a chi-square test
    against the distribution from torch's products, the first softmax(logits / 0.8) at the prompt's last position, the
    second that after each first token weighted by its probability (tokens with fewer than 5 expected draws pooled)."""
    model = tiny()
    calls = counted(monkeypatch)
    torch.manual_seed(5)
    gen = HFGenerator(model, Tok(), RolloutConfig(max_completion_length=2, temperature=0.8))
    drawn = torch.cat([gen.generate([[5, 6, 7, 8]], ["a"], n=16).completion_ids for _ in range(300)])
    assert len(calls) >= 300 * 2 * 14  # the prefill's and the decode step's layers, each time
    monkeypatch.setattr(few_rows, "FEW_ROWS", range(0))  # the distribution from torch's products
    first, second = two_tokens_p_values(model, drawn, [5, 6, 7, 8], 0.8)
    assert first > 0.01 and second > 0.01, (first, second)


def test_a_machine_that_cannot_build_it_keeps_torchs_products(tmp_path, monkeypatch):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: no such thing' >&2\nexit 1\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    few_rows.library.cache_clear()
    try:
        assert few_rows.library() is None
        assert few_rows.linear(torch.randn(8, 16), torch.randn(4, 16), None) is None
        monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
        monkeypatch.setenv(few_rows.OFF_ENV, "off")
        few_rows.library.cache_clear()
        assert few_rows.library() is None  # switched off, whatever the machine
    finally:
        few_rows.library.cache_clear()
    assert not list((tmp_path / "cache").glob("kernels/*.so"))


@needs_kernel
def test_it_is_built_once_per_machine(tmp_path):
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    first = few_rows.build(tmp_path, compiler)
    made = first.stat().st_mtime_ns
    assert few_rows.build(tmp_path, compiler) == first and first.stat().st_mtime_ns == made
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left beside it
