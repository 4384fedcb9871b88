"""On-policy distillation (issue 39 item 2): a teacher scores each token the policy sampled and lambda (log pi_T -
log pi_S) is added to that token's advantage, alone (rewards: []) or beside the rewards."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli.algo.advantages import Advantages
from grpo_cli.algo.distillation import reverse_kl_advantages
from grpo_cli.datatypes import Rollout
from grpo_cli.errors import SetupError
from grpo_cli.trainer.teacher import ServedTeacher, Teacher

from helpers import ROOT, cli, read_jsonl, tiny_tokenizer
from servers import make_model, openai_server

torch.set_num_threads(1)


def test_the_per_token_term_by_hand():
    teacher = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -9.0]])
    student = torch.tensor([[-1.5, -0.5, -0.5], [-1.0, -0.3, -2.0]])
    sampled = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # 0.5 * (teacher - student) on sampled tokens: 0.5 * 0.5, 0.5 * -1.5, 0 (not sampled); 0.5 * -2, 0.5 * 0.2, 0.5 * -7
    expected = torch.tensor([[0.25, -0.75, 0.0], [-1.0, 0.1, -3.5]])
    assert torch.allclose(reverse_kl_advantages(teacher, student, sampled, 0.5), expected)


# The runs' precision, named: the recipe's `auto` is bf16 autocast only on a CPU that computes bf16 natively, and the
# teacher and its distillation differ with it (these tests were first measured in bf16 on such a CPU, and the held-out
# KL's halving failed on an AMD EPYC without it: 6.84 -> 3.78 in 40 steps at 3e-3, still falling). float32 is the
# same arithmetic on every machine.
PRECISION = "train.mixed_precision=no"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny model, and a teacher of the same tokenizer that knows something it does not: the tiny model after 30
    GRPO steps on the fraction of digits it writes (0.54 -> 0.99 when measured)."""
    base = make_model(tmp_path_factory.mktemp("student"))
    run = tmp_path_factory.mktemp("teacher") / "run"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), f"rewards=[{{name: '{ROOT}/recipes/rewards/toy.py:digit_fraction'}}]",
            "train.max_steps=30", "train.learning_rate=1e-2", "checkpoint.every_steps=0", PRECISION)
    assert p.returncode == 0, p.stderr[-3000:]
    assert read_jsonl(run / "metrics.jsonl")[-1]["reward"] > 0.8
    return base, run / "checkpoints/step-30"


def _full_logps(model, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(ids).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_len:, None])[..., 0]


def test_advise_adds_lambda_times_the_log_ratio_to_each_sampled_token(models):
    """Teacher.advise against a plain full-vocabulary log-softmax of both models, with an outcome advantage beside it."""
    base, trained = models
    student, teacher = (AutoModelForCausalLM.from_pretrained(p).eval() for p in (base, trained))
    torch.manual_seed(0)
    prompt, completion = torch.randint(3, 700, (3, 5)), torch.randint(3, 700, (3, 4))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    rollout = Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), completion_ids=completion,
                      completion_mask=mask, truncated=torch.zeros(3, dtype=torch.bool), prompts=["p"] * 3,
                      completions=["c"] * 3)

    def logps(model):
        return lambda r: _full_logps(model, torch.cat([r.prompt_ids, r.completion_ids], 1), 5)

    outcome = torch.tensor([0.5, -1.0, 0.25])
    adv = Advantages(local=outcome, outcome=outcome, signal=torch.tensor([True]), stats={})
    got = Teacher(logps(teacher), logps(student), weight=0.3).advise(adv, rollout, mask)
    ids = torch.cat([prompt, completion], 1)
    by_hand = outcome[:, None] + 0.3 * (_full_logps(teacher, ids, 5) - _full_logps(student, ids, 5)) * mask
    assert got.local.shape == (3, 4) and torch.allclose(got.local, by_hand, atol=1e-6)
    assert (got.local[mask == 0] == outcome[:, None].expand(3, 4)[mask == 0]).all()  # only sampled tokens gain it
    assert Teacher(None, logps(student)).advise(adv, rollout, mask) is adv


def _distill(out: Path, teacher: Path | str, *args: str):
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(out), "rewards=[]",
            f"distillation={{teacher: {{name_or_path: '{teacher}'}}}}", "checkpoint.every_steps=0", PRECISION, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return read_jsonl(out / "metrics.jsonl")


def _policy_forwards_after_sampling(recipe, out: Path) -> dict[str, int]:
    """Forwards of the policy between a step's sampling and its end, with and without grad, over a run."""
    from grpo_cli.trainer.engine import Engine

    engine = Engine(recipe, out)
    seen = {"sampled": False, "grad": 0, "no_grad": 0}
    sample = engine.rollouts.next

    def next_batch(*args, **kwargs):
        seen["sampled"] = False
        batch = sample(*args, **kwargs)
        seen["sampled"] = True
        return batch

    def count(module, args):
        if seen["sampled"]:
            seen["grad" if torch.is_grad_enabled() else "no_grad"] += 1

    engine.rollouts.next = next_batch
    engine.accelerator.unwrap_model(engine.policy).register_forward_pre_hook(count)
    engine.fit()
    return {k: v for k, v in seen.items() if k != "sampled"}


@pytest.mark.filterwarnings("error:The use of `x.T`")  # rewards: [] gathered a 1-D tensor's transpose
def test_the_student_runs_once_a_micro_batch_as_without_a_teacher(models, tmp_path):
    """The student's log-probs are the old policy's, from the update's own forward: after sampling, a distillation step
    runs the policy exactly as a step without a teacher does (the forwards with grad of each micro-batch, none
    without); it ran a no-grad forward of every row besides."""
    from grpo_cli.recipe.files import load_recipe

    _, trained = models
    common = ["train.max_steps=2", "checkpoint.every_steps=0", "eval=null"]
    plain = load_recipe("recipes/ci-tiny.yaml", common)
    taught = load_recipe("recipes/ci-tiny.yaml", [*common, "rewards=[]",
                                                  f"distillation={{teacher: {{name_or_path: '{trained}'}}}}"])
    without, with_teacher = (_policy_forwards_after_sampling(r, tmp_path / n) for r, n in ((plain, "a"), (taught, "b")))
    assert without["no_grad"] == 0 and without["grad"] > 0
    assert with_teacher == without, (with_teacher, without)


@pytest.mark.parametrize("extra", [[], ["algorithm.num_iterations=2", "train.mini_batches=2"]], ids=["mu1", "mu2-k2"])
def test_the_term_added_in_the_update_equals_the_term_added_before_it(models, tmp_path, extra):
    """The update's own forward gives the student's log-probs (the old policy's: iteration 0's, or the separate old
    forward of mini-batches); `advise` took them from a forward of its own before the update, which the update still
    does where it deals rows to processes by mini-batch (`keeps_layout` False). Both give the same run."""
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.engine import Engine

    _, trained = models
    recipe = load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=3", "checkpoint.every_steps=0", "eval=null",
                                                  "train.learning_rate=3e-3", *extra,
                                                  f"distillation={{teacher: {{name_or_path: '{trained}'}}}}"])
    runs = {}
    for inline in (True, False):
        engine = Engine(recipe, tmp_path / str(inline))
        if not inline:
            engine.update.keeps_layout = lambda rollout: False
        engine.fit()
        weights = {n: p.detach().clone() for n, p in engine.accelerator.unwrap_model(engine.policy).named_parameters()}
        runs[inline] = read_jsonl(tmp_path / str(inline) / "metrics.jsonl"), weights
    (inline, w_inline), (before, w_before) = runs[True], runs[False]
    for a, b in zip(inline, before):
        for key in ("distillation/reverse_kl", "loss", "advantages/abs_mean", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(b[key])), (key, a[key], b[key])
    assert all(torch.allclose(w_inline[n], w_before[n], atol=1e-6) for n in w_inline)


@pytest.mark.slow
def test_the_student_as_its_own_teacher_gives_no_signal_and_keeps_its_weights(models, tmp_path):
    base, _ = models
    metrics = _distill(tmp_path / "run", base, "train.max_steps=3", "train.learning_rate=1e-2")
    assert [m["distillation/reverse_kl"] for m in metrics] == [0.0, 0.0, 0.0]
    assert all(m["loss"] == 0.0 and m["advantages/abs_mean"] == 0.0 for m in metrics)
    before, after = load_file(base / "model.safetensors"), load_file(tmp_path / "run/checkpoints/step-3/model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def _held_out_kl(student_dir: Path, teacher_dir: Path) -> float:
    """KL(pi_S || pi_T) per token, over the whole vocabulary, on the student's own samples for prompts the run
    never saw (sums of two numbers above 20; the run's are at most 20)."""
    tok = AutoTokenizer.from_pretrained(teacher_dir)
    student, teacher = (AutoModelForCausalLM.from_pretrained(p).eval() for p in (student_dir, teacher_dir))
    kls = []
    for a, b in [(31, 45), (52, 27), (66, 38), (24, 99), (73, 73), (88, 21), (47, 56), (35, 90)]:
        text = tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}? Answer with a number."}],
                                       tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt").input_ids
        torch.manual_seed(a * b)
        out = student.generate(ids, do_sample=True, max_new_tokens=16, top_k=0, pad_token_id=tok.pad_token_id)
        with torch.no_grad():
            ls = torch.log_softmax(student(out).logits[0, ids.shape[1] - 1 : -1].float(), -1)
            lt = torch.log_softmax(teacher(out).logits[0, ids.shape[1] - 1 : -1].float(), -1)
        kls.append((ls.exp() * (ls - lt)).sum(-1).mean().item())
    return sum(kls) / len(kls)


@pytest.mark.slow
def test_a_student_distilled_from_another_teacher_moves_its_held_out_kl_down(models, tmp_path):
    """40 steps of distillation alone from the teacher that learnt to write digits: the held-out KL to it falls from
    6.84 to 0.03 nats a token when measured (3.78 at a learning rate of 3e-3), and so does the run's own estimate on its
    samples (6.4 -> 0.54)."""
    base, trained = models
    metrics = _distill(tmp_path / "run", trained, "train.max_steps=40", "train.learning_rate=1e-2")
    before, after = _held_out_kl(base, trained), _held_out_kl(tmp_path / "run/checkpoints/step-40", trained)
    assert after < 0.5 * before, (before, after)
    first, last = (sum(m["distillation/reverse_kl"] for m in part) / 10 for part in (metrics[:10], metrics[-10:]))
    assert last < 0.5 * first, (first, last)  # and on its own samples during the run


def test_validate_refuses_a_teacher_with_another_vocabulary(models, tmp_path):
    base, _ = models
    other = tmp_path / "other"
    AutoModelForCausalLM.from_pretrained(base).save_pretrained(other)
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_tokens(["<extra_token>"])
    tok.save_pretrained(other)
    p = cli("validate", "recipes/ci-tiny.yaml", "rewards=[]", f"distillation={{teacher: {{name_or_path: '{other}'}}}}")
    assert p.returncode == 2, p.stderr
    assert "distillation.teacher.name_or_path: the teacher's tokenizer is not the policy's (1 of" in p.stderr
    assert "'<extra_token>': None vs" in p.stderr
    p = cli("validate", "recipes/ci-tiny.yaml", "rewards=[]")
    assert p.returncode == 2 and "rewards: name at least one reward" in p.stderr
    p = cli("validate", "recipes/ci-tiny.yaml", "rewards=[]", f"distillation={{teacher: {{name_or_path: '{base}'}}}}")
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def served_teacher(models, tmp_path_factory):
    """The digit teacher behind vLLM's own OpenAI server (float32), named `teacher`."""
    pytest.importorskip("vllm")
    _, trained = models
    with openai_server(trained, "teacher", "float32", tmp_path_factory.mktemp("teacher-log") / "vllm.log") as url:
        yield url


@pytest.mark.vllm
def test_a_served_teacher_gives_the_local_teachers_log_probs(models, served_teacher):
    """ServedTeacher (vLLM's prompt log-probs, token ids in) against the same model's full-vocabulary log-softmax here,
    on left-padded prompts and completions of different lengths; the server's tokenizer is checked against the
    policy's."""
    base, trained = models
    teacher = AutoModelForCausalLM.from_pretrained(trained).eval()
    torch.manual_seed(1)
    prompt, completion = torch.randint(3, 700, (3, 6)), torch.randint(3, 700, (3, 5))
    prompt_mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    rollout = Rollout(prompt_ids=prompt, prompt_mask=prompt_mask, completion_ids=completion, completion_mask=mask,
                      truncated=torch.zeros(3, dtype=torch.bool), prompts=["p"] * 3, completions=["c"] * 3)
    served = ServedTeacher(served_teacher, "teacher", None, 60, batch=2)
    got = served(rollout)
    for i in range(3):
        ids = torch.cat([prompt[i][prompt_mask[i].bool()], completion[i][mask[i].bool()]])[None]
        here = _full_logps(teacher, ids, int(prompt_mask[i].sum()))[0]
        assert torch.allclose(got[i, : len(here)], here, atol=1e-4), (got[i], here)
        assert (got[i, len(here):] == 0).all()
    served.check_tokenizer(AutoTokenizer.from_pretrained(base))
    with pytest.raises(SetupError, match="the teacher's tokenizer is not the policy's"):
        served.check_tokenizer(tiny_tokenizer())


@pytest.mark.vllm
def test_doctor_checks_a_served_teacher_as_the_run_will_use_it(models, served_teacher):
    """`grpo doctor` asks the server for its tokenizer and for the log-probs of the first prompt's answer: ok against
    the real one (the log-probs are the teacher's own, negative and finite), a fail naming the server's refusal for a
    model it does not serve."""
    def doctor(model: str) -> dict:
        p = cli("doctor", "recipes/ci-tiny.yaml", "--json", "rewards=[]",
                f"distillation={{served: {{base_url: '{served_teacher}', model: {model}}}}}")
        return {v["check"]: v for v in json.loads(p.stdout)["verdicts"]}["served teacher"]

    v = doctor("teacher")
    assert v["severity"] == "ok" and "the policy's tokenizer" in v["finding"], v
    logps = json.loads(v["evidence"][0].removeprefix("log-probs: "))
    assert len(logps) >= 4 and all(-30 < x < 0 for x in logps), logps
    v = doctor("no-such-model")
    assert v["severity"] == "fail" and "HTTP 404" in v["finding"], v


@pytest.mark.vllm
@pytest.mark.slow
def test_distillation_from_a_served_teacher_trains_as_from_a_local_one(models, served_teacher, tmp_path):
    _, trained = models
    local = _distill(tmp_path / "local", trained, "train.max_steps=3", "train.learning_rate=3e-3")
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / "served"), "rewards=[]", "checkpoint.every_steps=0",
            f"distillation={{served: {{base_url: '{served_teacher}', model: teacher}}}}", "train.max_steps=3",
            "train.learning_rate=3e-3")
    assert p.returncode == 0, p.stderr[-3000:]
    served = read_jsonl(tmp_path / "served/metrics.jsonl")
    for a, b in zip(local, served):
        assert abs(a["distillation/reverse_kl"] - b["distillation/reverse_kl"]) < 1e-3, (a, b)
