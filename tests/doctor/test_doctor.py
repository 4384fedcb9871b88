"""`grpo doctor` through the CLI, on the tiny recipe: each check ok and planted to warn or fail."""

import json
import os
import re

import pytest

from helpers import cli

pytestmark = pytest.mark.usefixtures("model_cache")
TINY = "recipes/ci-tiny.yaml"


def doctor(*args: str, env: dict | None = None):
    p = cli("doctor", TINY, "--json", *args, env={**os.environ, **(env or {})})
    out = json.loads(p.stdout)
    assert p.returncode == out["exit_code"], p.stderr[-3000:]
    return p.returncode, {v["check"]: v for v in out["verdicts"]}


def test_the_tiny_recipe_checks_out():
    code, v = doctor()
    assert code == 0  # issue 35: its digit reward, which reads the form and not the answer, made it warn
    assert v["recipe"]["severity"] == v["versions"]["severity"] == v["batch"]["severity"] == "ok"
    assert "torch 2." in v["versions"]["evidence"][0] and "a CPU build" in v["versions"]["evidence"][1]
    assert v["batch"]["finding"] == "8 completions a step, 2 micro-batch(es) per process, 0.03 epoch(s)"
    assert "at most 640 tokens a step (8 x (64 prompt + 16 completion))" in v["batch"]["evidence"]
    prompt = v["first prompt"]
    assert prompt["severity"] == "ok" and re.match(r"\d+ tokens \(data.max_prompt_length 64", prompt["finding"])
    assert "<|im_start|>assistant" in prompt["evidence"] and any("Answer with a number." in e for e in prompt["evidence"])
    probe = v["reward probe"]  # accuracy tells right from wrong; digit_fraction pays for any digits
    assert probe["severity"] == "ok"
    assert probe["finding"] == ("accuracy: the right answer scores above a wrong one on the first 4 rows; "
                                "digit_fraction scores every answer alike (1): a reward of the form, not the answer "
                                "(not probed)"), probe["finding"]
    assert all(re.search(r"right 1, wrong \('\d+'\) 0$", e) for e in probe["evidence"] if e.startswith("accuracy"))
    # a format reward beside accuracy (gsm8k's): the probe's plain answers have no <think> tags, so it pays 0 to all
    code, v = doctor("rewards=[{name: accuracy}, {name: format, weight: 0.2}]")
    assert v["reward probe"]["severity"] == "ok" and "format scores every answer alike (0)" in v["reward probe"]["finding"]


def test_a_reward_that_never_pays_fails_and_a_batch_that_does_not_split_fails():
    code, v = doctor("rewards=[{name: 'tests/probe_rewards.py:always_zero'}]")
    assert code == 2 and v["reward probe"]["severity"] == "fail"
    assert "always_zero scores every answer alike (0)" in v["reward probe"]["finding"]
    code, v = doctor("--num-processes", "3")
    assert code == 2 and v["batch"]["severity"] == "fail"
    assert v["batch"]["finding"] == "8 completions do not split into 3 process(es) x micro-batches of 4"


def test_a_reward_that_cannot_be_reached_fails_the_probe_and_every_other_check_still_runs():
    """A judge nobody serves: the probe's scoring raises, which ended `grpo doctor` with an error and no verdicts (no
    JSON with --json); it is the reward probe's finding, with the batch and memory checks beside it."""
    judge = "{name: judge, kwargs: {base_url: 'http://127.0.0.1:1/v1', model: m}}"
    code, v = doctor(f"rewards=[{judge}]")
    assert code == 2 and v["reward probe"]["severity"] == "fail", v.get("reward probe")
    finding = v["reward probe"]["finding"]
    assert "reward 'judge' failed" in finding and "Connection refused" in finding, finding
    assert v["batch"]["severity"] == "ok" and "memory plan" in v


def test_a_served_teacher_nobody_serves_fails_its_check():
    """distillation.served at an address nothing listens on: the run would stop before step 1; doctor says so in its
    own verdict (tests/trainer/test_distillation.py checks a real one)."""
    code, v = doctor("rewards=[]", "distillation={served: {base_url: 'http://127.0.0.1:1/v1', model: teacher}}")
    assert code == 2 and v["served teacher"]["severity"] == "fail", v.get("served teacher")
    assert "could not read the teacher's tokenizer at http://127.0.0.1:1/tokenize" in v["served teacher"]["finding"]
    assert v["batch"]["severity"] == "ok" and v["memory plan"]["severity"] != "fail"
    code, v = doctor()
    assert "served teacher" not in v  # no distillation, no such check


def test_a_group_judge_split_over_processes_fails_the_batch_check():
    """The launcher refuses a layout whose process slices split a group a group judge ranks (trainer/layout.py);
    doctor says so too: 8 rows over 4 processes are 2 a process, half of a G = 4 group each."""
    judge = "{name: judge, kwargs: {base_url: 'http://127.0.0.1:1/v1', model: m, mode: group}}"
    code, v = doctor("--num-processes", "4", "train.micro_batch_size=2", f"rewards=[{judge}]")
    assert code == 2 and v["batch"]["severity"] == "fail", v["batch"]
    assert "ranks each prompt's 4 completions together, but 2 rows a process" in v["batch"]["finding"], v["batch"]
    code, v = doctor("--num-processes", "2", "train.micro_batch_size=2", f"rewards=[{judge}]")  # 4 a process: whole
    assert v["batch"]["severity"] == "ok", v["batch"]


def test_a_prompt_cut_by_the_limit_and_a_bad_field():
    code, v = doctor("data.max_prompt_length=8")
    assert v["first prompt"]["severity"] == "warn"
    assert re.match(r"\d+ tokens, cut to data.max_prompt_length = 8 from the left", v["first prompt"]["finding"])
    p = cli("doctor", TINY, "algorithm.epsilon=-1")
    assert p.returncode == 2 and "FAIL recipe: invalid recipe" in p.stdout and "algorithm.epsilon" in p.stdout


def test_an_installed_package_declaring_other_versions_is_named(tmp_path):
    info = tmp_path / "trl-0.0.1.dist-info"  # a real distribution's metadata, as pip writes it
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 0.0.1\nRequires-Dist: transformers<5\n")
    code, v = doctor(env={"PYTHONPATH": str(tmp_path)})
    assert v["versions"]["severity"] == "warn"
    assert re.search(r"trl 0.0.1 requires transformers<5, installed 5\.", v["versions"]["finding"])


def test_the_resume_check_proves_exact_resume_and_catches_a_reward_it_cannot_restore():
    code, v = doctor("--resume-check", "4")
    check = v["resume check"]
    assert check["severity"] == "ok" and check["finding"].startswith("exact: the same metrics at every step")
    assert "26 weight tensors compared" in check["evidence"][0]
    code, v = doctor("--resume-check", "2", "rewards=[{name: accuracy}, {name: 'tests/probe_rewards.py:unseeded'}]")
    check = v["resume check"]
    assert code == 2 and check["severity"] == "fail" and check["finding"].startswith("a resumed run differs")


@pytest.mark.slow
def test_a_streamed_recipe_is_checked_on_its_first_rows_and_resumes_exactly(tmp_path):
    """data.streaming over 3 JSON Lines shards: the batch check says the size is not known ahead, the prompt and
    reward checks run on the stream's first rows (step 1's), and the resume check proves the stream resumes exactly."""
    from grpo_cli.data.generators import GENERATORS

    problems = GENERATORS["arithmetic"](n=30, seed=2, min_value=0, max_value=20)
    files = [tmp_path / f"part-{s}.jsonl" for s in range(3)]
    for s, f in enumerate(files):
        f.write_text("".join(json.dumps(r) + "\n" for r in problems[s * 10:(s + 1) * 10]))
    stream = ["data.generator=null", f"data.files=[{','.join(map(str, files))}]", "data.streaming=true",
              "data.shuffle_buffer=6"]
    code, v = doctor(*stream, "--resume-check", "4")
    assert v["batch"]["severity"] == "ok"
    assert v["batch"]["finding"] == "8 completions a step, 2 micro-batch(es) per process, streamed data"
    assert "data.streaming: the number of prompts is not known ahead; 4 steps read 8 of them" in v["batch"]["evidence"]
    first = v["first prompt"]["evidence"][0]
    assert first.startswith("first prompt (data row 0), ")  # the stream's first row, as step 1 takes it
    shown = "\n".join(v["first prompt"]["evidence"])
    assert sum(f"{p['prompt']} Answer with a number." in shown for p in problems) >= 1
    assert v["reward probe"]["severity"] == "ok" and "digit_fraction scores every answer alike" in v["reward probe"]["finding"]
    check = v["resume check"]
    assert check["severity"] == "ok" and check["finding"].startswith("exact: the same metrics at every step")
