"""OpenEnv environments trained unchanged (issue 37 item 2): OpenEnv's own echo environment, made by `openenv init`
(openenv-core, as its users install it) and run as its own uvicorn server, spoken to over OpenEnv's protocol by the
adapter (rollout.environment: openenv:<url>): the action is the tool, step rewards sum to the episode's reward."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.datatypes import PromptBatch
from grpo_cli.preflight import resolve
from grpo_cli.recipe.schema import Recipe
from grpo_cli.rollout.common import Samples
from grpo_cli.trainer.launch import free_port

from helpers import cli, read_jsonl

pytest.importorskip("openenv")
torch.set_num_threads(1)


def serve(folder, port: int) -> subprocess.Popen:
    """The environment's server, as its README starts it (`uvicorn server.app:app`), healthy."""
    log = open(folder / f"server-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1", "--port",
                             str(port)], cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/schema", timeout=1).read()
            return proc
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (folder / f"server-{port}.log").read_text()
            time.sleep(0.3)


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
    """`openenv init echo_env`: OpenEnv's echo environment, as its template makes it."""
    folder = tmp_path_factory.mktemp("openenv")
    made = subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env"], cwd=folder, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    return folder / "echo_env"


@pytest.fixture(scope="module")
def echo_server(echo_env, tmp_path_factory):
    """Its server, with room for a step's episodes (the template's own comment: increase max_concurrent_envs)."""
    folder = tmp_path_factory.mktemp("openenv-16") / "echo_env"
    shutil.copytree(echo_env, folder)
    app = folder / "server" / "app.py"
    app.write_text(app.read_text().replace("max_concurrent_envs=1,", "max_concurrent_envs=16,"))
    port = free_port()
    proc = serve(folder, port)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


class Echoer:
    """Calls the echo tool with the quoted text of its prompt, then says "done"."""

    def __init__(self, tok) -> None:
        self.tok, self.pad_id, self.eos = tok, tok.pad_token_id, tok.convert_tokens_to_ids("<|im_end|>")

    def sample(self, token_ids, budgets, **_):
        tokens, finished = [], []
        for ids, budget in zip(token_ids, budgets):
            context = self.tok.decode(ids)
            quoted = context.rsplit("<|im_start|>user\n", 1)[1].split("'")[1]
            text = "done" if "<|im_start|>tool" in context else \
                '<tool_call>{"name": "echo", "arguments": {"message": "%s"}}</tool_call>' % quoted
            toks = self.tok(text, add_special_tokens=False)["input_ids"] + [self.eos]
            tokens.append(toks[:budget])
            finished.append(len(toks) <= budget)
        return Samples(tokens, None, finished)


def test_the_servers_action_is_the_tool_and_its_rewards_the_reward(echo_server):
    from transformers import AutoTokenizer

    from grpo_cli.data.prompts import encode_prompts, render_prompt
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    recipe = Recipe.model_validate({"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "train": {"max_steps": 1},
                                    "data": {"generator": "arithmetic"}, "rewards": [{"name": "environment"}],
                                    "rollout": {"environment": f"openenv:{echo_server}", "max_turns": 3}})
    spec = resolve(recipe).environments[None]
    assert spec.tools == ("echo",) and spec.done_method == "is_done"
    assert spec.schemas[0]["function"]["parameters"]["properties"]["message"]["type"] == "string"
    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    runner = EpisodeRunner(recipe.rollout, recipe.data, tok, Echoer(tok), context_limit=2048)
    rows = [{"prompt": "Try to echo 'Hello World!' in the environment."}, {"prompt": "Make it echo 'TRL!'"}]
    texts = [render_prompt(r, recipe.data, tok) for r in rows]
    batch = PromptBatch(texts=texts, input_ids=encode_prompts(texts, tok, None),
                        columns={"prompt": [r["prompt"] for r in rows]}, indices=[0, 1])
    rollout, columns = runner.run(batch, with_reward=True)
    for i, said in enumerate(["Hello World!", "TRL!"]):
        # reset's observation joins the prompt
        assert '\n\nEcho Env environment ready!\n{"message_length": 0}<|im_end|>' in rollout.prompts[i]
        shown = f'{said}\n{{"message_length": {len(said)}}}'  # the text field, then the others
        assert [(t["role"], t["text"]) for t in rollout.turns[i]][1:] == [("tool", shown), ("assistant", "done")]
        assert columns["environment_reward"][i] == pytest.approx(0.1 * len(said))  # the template's reward
    assert runner.take_counts()["tool_calls"] == 2
    bad = recipe.rollout.model_copy(update={"environment": "openenv:http://127.0.0.1:9"})
    with pytest.raises(ValueError, match=r"rollout.environment: cannot read the OpenEnv server's action schema"):
        resolve(recipe.model_copy(update={"rollout": bad}))


def test_a_server_without_room_for_the_episodes_stops_the_run_saying_so(echo_env, echo_server):
    from transformers import AutoTokenizer

    from grpo_cli.errors import EnvironmentUnavailable
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    port = free_port()
    proc = serve(echo_env, port)  # as generated: one session at a time
    try:
        recipe = Recipe.model_validate({"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"},
                                        "train": {"max_steps": 1}, "data": {"generator": "arithmetic"},
                                        "rollout": {"environment": f"openenv:http://127.0.0.1:{port}", "max_turns": 2}})
        tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
        runner = EpisodeRunner(recipe.rollout, recipe.data, tok, Echoer(tok), context_limit=2048)
        text = tok.apply_chat_template([{"role": "user", "content": "echo 'a'"}], tokenize=False,
                                       add_generation_prompt=True)
        batch = PromptBatch(texts=[text] * 2, input_ids=[tok(text)["input_ids"]] * 2,
                            columns={"prompt": ["echo 'a'"] * 2}, indices=[0, 1])
        with pytest.raises(EnvironmentUnavailable, match="start the server with max_concurrent_envs >= the rows"):
            runner.run(batch, with_reward=True)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_train_the_openenv_recipe(echo_server, tmp_path, model_cache):
    out = cli("train", "recipes/openenv-echo.yaml", f"rollout.environment=openenv:{echo_server}", "train.max_steps=2",
              "train.prompts_per_step=1", f"logging.output_dir={tmp_path / 'run'}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["environment/errors"] == 0 == m["environment/timeouts"] and "rewards/environment/mean" in m
               for m in metrics)
    records = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    assert all('"name": "echo"' in r["prompt"] for r in records)
