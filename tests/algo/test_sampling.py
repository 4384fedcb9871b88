"""The truncated sampling policy (grpo_cli/algo/sampling.py): kept sets worked by hand, the log-ratio it removes
(log S, trl#6789), its gradient, and vLLM's own truncation as the reference."""

import math

import pytest
import torch

from grpo_cli.algo.sampling import Truncation, kept_mask, truncated_logps
from helpers import chi_square_p

# one position, five tokens: p = 0.5, 0.2, 0.15, 0.1, 0.05 (logits log p, temperature 1)
P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
X = P.log()


@pytest.mark.parametrize("t, kept", [
    # ascending 0.05 0.1 0.15 0.2 0.5, cumulative 0.05 0.15 0.30 0.50 1.0; drop where <= 1 - 0.8 = 0.2
    (Truncation(top_p=0.8), [0, 1, 2]),
    (Truncation(top_p=0.6), [0, 1]),  # drop where <= 0.4: the 0.05, 0.1 and 0.15
    (Truncation(top_p=0.01), [0]),  # the most probable token always stays
    (Truncation(top_k=2), [0, 1]),
    (Truncation(min_p=0.35), [0, 1]),  # below 0.35 x 0.5 = 0.175
    # min_p first (vLLM's order): 0.25 x 0.5 = 0.125 keeps 0.5 0.2 0.15, renormalised 0.588 0.235 0.176;
    # top_p 0.8 then drops the 0.176 (cumulative 0.176 <= 0.2). top_p first would keep all three.
    (Truncation(top_p=0.8, min_p=0.25), [0, 1]),
    (Truncation(top_k=4, top_p=0.8), [0, 1, 2]),  # top-4 renormalised: 0.526 0.211 0.158 0.105; cumulative 0.105
    (Truncation(), [0, 1, 2, 3, 4]),
])
def test_kept_sets_worked_by_hand(t, kept):
    assert kept_mask(X, t).nonzero().flatten().tolist() == kept


@pytest.mark.parametrize("t, S", [(Truncation(top_p=0.8), 0.85), (Truncation(top_k=2), 0.7),
                                  (Truncation(min_p=0.35), 0.7), (Truncation(top_p=0.8, min_p=0.25), 0.7)])
def test_the_replayed_log_ratio_is_zero_and_the_full_one_is_log_s(t, S):
    """The sampler reports log pi_K(t) = log(p_t / S) (vLLM's processed log-probs). Against it the trainer's
    full-vocabulary log-prob is off by log S on every kept token; the replayed one by nothing."""
    for token in kept_mask(X, t).nonzero().flatten().tolist():
        sampler = math.log(P[token].item() / S)
        ids = torch.tensor(token)
        full = truncated_logps(X, ids, 1.0, None).item()
        replayed = truncated_logps(X, ids, 1.0, t).item()
        assert full - sampler == pytest.approx(math.log(S), abs=1e-6)
        assert replayed - sampler == pytest.approx(0.0, abs=1e-6)


def test_temperature_comes_first():
    # T = 2: p ∝ sqrt(p) = 0.707 0.447 0.387 0.316 0.224 -> / 2.081 = 0.340 0.215 0.186 0.152 0.107;
    # top_p 0.8: ascending cumulative 0.107 0.259 ... -> only the 0.107 (<= 0.2) goes, S = 0.893
    t = Truncation(top_p=0.8)
    assert kept_mask(X / 2, t).nonzero().flatten().tolist() == [0, 1, 2, 3]
    q = P.sqrt() / P.sqrt().sum()
    S = q[:4].sum().item()
    assert truncated_logps(X, torch.tensor(0), 2.0, t).item() == pytest.approx(math.log(q[0].item() / S), abs=1e-6)


def test_the_sampled_token_stays_kept():
    """A token just outside the trainer's kept set (float noise between sampler and trainer) keeps a finite
    log-prob: the kept set plus the sampled token."""
    t = Truncation(top_k=2)
    lp = truncated_logps(X, torch.tensor(2), 1.0, t).item()  # p = 0.15, outside the top 2
    assert lp == pytest.approx(math.log(0.15 / 0.85), abs=1e-6)


def test_gradient_is_that_of_the_renormalised_policy():
    """d log pi_K(t) / dx_j = (1[j = t] - pi_K(j)) / T on K, 0 outside it; checked by finite differences too."""
    t, T, token = Truncation(top_p=0.8), 1.5, 1
    x = (X * 1.0).requires_grad_()
    lp = truncated_logps(x, torch.tensor(token), T, t)
    lp.backward()
    K = kept_mask(X / T, t)
    q = torch.softmax((X / T).masked_fill(~K, float("-inf")), -1)
    expected = (torch.nn.functional.one_hot(torch.tensor(token), 5).float() - q) / T * K
    assert torch.allclose(x.grad, expected, atol=1e-6)
    for j in range(5):  # central differences, small enough that K does not change
        e = torch.zeros(5)
        e[j] = 1e-3
        fd = (truncated_logps(X + e, torch.tensor(token), T, t) - truncated_logps(X - e, torch.tensor(token), T, t)) / 2e-3
        assert fd.item() == pytest.approx(x.grad[j].item(), abs=1e-4)


def test_inactive_truncation_is_the_full_log_softmax_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(3, 7, 50, generator=g), torch.randint(0, 50, (3, 7), generator=g)
    full = torch.gather(logits / 0.7, -1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits / 0.7, -1)
    assert torch.equal(truncated_logps(logits, ids, 0.7, None), full)
    assert torch.equal(truncated_logps(logits, ids, 0.7, Truncation()), full)


@pytest.mark.vllm
def test_kept_sets_equal_vllms_own_truncation():
    """vLLM's sampler: temperature, min-p (its builtin processor's rule), then apply_top_k_top_p."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        x = torch.randn(6, 300, generator=g) * (0.5 + 3 * torch.rand(1, generator=g).item())
        top_k = [None, 1, 5, 40][trial % 4]
        top_p = [1.0, 0.9, 0.5, 0.2, 0.95][trial % 5]
        min_p = [None, 0.05, 0.3][trial % 3]
        ours = kept_mask(x, Truncation(top_k, top_p, min_p))
        theirs = x.clone()
        if min_p:
            probs = theirs.softmax(-1)
            theirs = theirs.masked_fill(probs < probs.amax(-1, keepdim=True) * min_p, float("-inf"))
        theirs = apply_top_k_top_p_pytorch(theirs, torch.full((6,), top_k) if top_k else None,
                                           torch.full((6,), top_p) if top_p < 1 else None, allow_cpu_sync=True)
        assert torch.equal(ours, theirs > float("-inf")), (top_k, top_p, min_p)


# --------------------------------------------------------------------------- the draw (InverseCDFDraw)


def _drawn(logits: torch.Tensor, temperature: float, rows: int, seed: int, chunk: int = 100) -> torch.Tensor:
    """`rows` draws from one row of logits, `chunk` rows a call (a call's scores are [chunk, V]: 20,000 rows of a
    49,152-token vocabulary at once would be 4 GB a tensor)."""
    from grpo_cli.algo.sampling import InverseCDFDraw

    torch.manual_seed(seed)
    drawn = []
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        out = InverseCDFDraw(temperature)(torch.zeros(n, 1, dtype=torch.long), logits.expand(n, -1).clone())
        assert (torch.isfinite(out).sum(-1) == 1).all() and (out.max(-1).values == 0).all()  # one token left a row
        drawn.append(out.argmax(-1))
    return torch.cat(drawn)


def test_the_draw_has_the_softmax_distribution():
    """40,000 draws from softmax(x / 0.7) over 8 tokens, one of them -inf: the counts pass a chi-square test against
    the probabilities (p > 0.01), the -inf token is never drawn; the same test rejects the counts against the
    temperature-1 probabilities (so it can tell), and torch.multinomial's counts pass it as well."""
    torch.set_num_threads(1)
    x = torch.tensor([1.2, -0.3, 0.0, 2.1, float("-inf"), 0.7, -1.5, 0.4])
    p = torch.softmax(x / 0.7, -1)
    counts = torch.bincount(_drawn(x, 0.7, 40_000, seed=0), minlength=8)
    print(counts.tolist(), (p * 40_000).round().tolist())
    assert counts[4] == 0
    assert chi_square_p(counts, p) > 0.01
    assert chi_square_p(counts, torch.softmax(x, -1)) < 1e-6
    torch.manual_seed(0)
    reference = torch.bincount(torch.multinomial(p.expand(40_000, -1), 1).flatten(), minlength=8)
    assert chi_square_p(reference, p) > 0.01


def test_the_draw_over_a_real_vocabulary_and_a_peaked_distribution():
    """49,152 tokens (SmolLM2's vocabulary) with most of the mass on three: the three and the rest (pooled) pass the
    chi-square test over 20,000 draws."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(49_152, generator=g)
    x[[7, 100, 40_000]] += torch.tensor([9.0, 8.0, 8.5])
    p = torch.softmax(x, -1)
    drawn = _drawn(x, 1.0, 20_000, seed=2)
    pooled = lambda v: torch.stack([v[7], v[100], v[40_000], v.sum() - v[7] - v[100] - v[40_000]])  # noqa: E731
    counts = pooled(torch.bincount(drawn, minlength=49_152).double())
    assert chi_square_p(counts, pooled(p.double())) > 0.01


def test_the_draw_names_nonfinite_probabilities_as_multinomial_does():
    from grpo_cli.algo.sampling import InverseCDFDraw

    with pytest.raises(RuntimeError, match="probability tensor contains"):
        InverseCDFDraw(1.0)(torch.zeros(2, 1, dtype=torch.long), torch.tensor([[0.0, float("nan")], [0.0, 1.0]]))
