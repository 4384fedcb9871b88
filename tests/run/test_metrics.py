"""The metrics table (grpo_cli/run/metrics.py, the source of the docs' metrics page) is complete: every key real runs
log has its row, every key the emitting code spells out has its row, and the table names nothing that nothing logs."""

import ast
import re
from pathlib import Path

import pytest

from grpo_cli.recipe.files import load_recipe
from grpo_cli.run.metrics import METRICS, describe
from grpo_cli.trainer.engine import Engine

from helpers import ROOT, build_reward_model, read_jsonl

# the modules that put keys into a step's metrics, and the prefix the engine adds to theirs
EMITTERS = {"trainer/reporting.py": "", "trainer/update.py": "", "rollout/rollouts.py": "", "algo/losses.py": "",
            "algo/advantages.py": "", "algo/dynamic_sampling.py": "", "rewards/rm_update.py": "",
            "eval/evaluate.py": "eval/", "eval/metrics.py": "eval/", "process/memory.py": "", "process/clock.py": "",
            "trainer/nonfinite.py": "", "rollout/vllm_servers.py": "",
            "trainer/teacher.py": "", "data/curriculum.py": ""}
SUMS = {"add_tokens", "add_weighted", "add_scalar", "add_extremes"}


def spelled_keys(path: Path, prefix: str) -> set[str]:
    """Keys a module writes: `m["k"] = ...`, `out[f"a/{x}/b"] = ...`, `sums.add_tokens("k", ...)`, dict displays
    `{"k": ...}` of keys with a slash, and `p + "k"` where p is an f-string prefix; placeholders become <name>."""

    def text(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "<name>" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.Name) and node.id == "p":  # rm_update's prefix, f"reward_model/{name}/"
            return "reward_model/<name>/"
        return None

    keys, plain = set(), set()  # plain: dict displays, which the engine does not prefix
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]:
                if isinstance(target, ast.Subscript) and (not isinstance(target.value, ast.Name) or
                                                          target.value.id in ("m", "out", "metrics", "stats")):
                    keys.add(text(target.slice))
                elif isinstance(target, ast.Name) and target.id == "m" and isinstance(node.value, ast.Dict):
                    keys |= set(map(text, node.value.keys))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SUMS:
            keys.add(text(node.args[0]))
        elif isinstance(node, ast.Dict):
            plain |= {k for k in map(text, node.keys) if k and "/" in k and not k.startswith(("/", "<"))}
    keys.discard(None)
    keys = {k.replace("<name>", "<k>") if re.fullmatch(r"(pass|maj)@<name>", k) else k for k in keys}
    return {prefix + k for k in keys if not k.endswith("/")} | {k for k in plain if not k.endswith("/")}


def matches(pattern: str, key: str) -> bool:
    """Whether `key` is one of `pattern`'s keys; placeholders (<name>, <k>) stand for any one segment or number."""
    regex = "^" + re.sub(r"<name>|<k>", "[^/]+", re.escape(pattern).replace(r"\<", "<").replace(r"\>", ">")) + "$"
    return re.match(regex, re.sub(r"<name>|<k>", "x", key)) is not None


def has_row(key: str) -> bool:
    return any(matches(key, m.key) or matches(m.key, key) for m in METRICS)


def test_every_key_the_code_spells_out_has_its_row():
    found = set()
    for module, prefix in EMITTERS.items():
        found |= spelled_keys(ROOT / "grpo_cli" / module, prefix)
    assert len(found) > 40  # the scan reads the code
    missing = sorted(k for k in found if not has_row(k))
    assert not missing, f"metrics without a row in grpo_cli/run/metrics.py: {missing}"
    # and no row for a key nothing writes (the engine writes `step` itself)
    stale = [m.key for m in METRICS if m.key != "step" and not any(matches(f, m.key) or matches(m.key, f) for f in found)]
    assert not stale, f"rows of grpo_cli/run/metrics.py that no code writes: {stale}"


def test_patterns_match_what_they_say():
    assert describe("rewards/accuracy/mean").key == "rewards/<name>/mean"
    assert describe("eval/pass@8").key == "eval/pass@<k>"
    assert describe("eval/rewards/accuracy/mean").key == "eval/rewards/<name>/mean"
    assert describe("rewards/a/b/mean") is None and describe("rewardz") is None
    assert len({m.key for m in METRICS}) == len(METRICS)  # one row a key


def _run(tmp_path, name, *overrides):
    r = load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=2", "checkpoint.every_steps=0", *overrides])
    Engine(r, tmp_path / name).fit()
    return read_jsonl(tmp_path / name / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.usefixtures("model_cache")
def test_every_key_real_runs_log_has_its_row(tmp_path, turn_model):
    runs = [
        _run(tmp_path, "options", "algorithm.beta=0.05", "algorithm.num_iterations=2", "algorithm.sync_ref_model=true",
             "algorithm.ref_model_sync_steps=1", "algorithm.off_policy_mask_threshold=0.0", "rollout.dtype=bfloat16",
             "algorithm.dynamic_sampling={enabled: true, max_rounds: 2}", "eval={limit: 2, num_samples: 2, max_new_tokens: 4}"),
        _run(tmp_path, "steps", "rewards=[{name: accuracy}, {name: 'tests/signal_rewards.py:digit_steps', level: step}]",
             "rewards.1.on_error=skip"),
        _run(tmp_path, "episodes", f"model.name_or_path={turn_model}", "rollout.environment=tests/envs.py:Echo",
             "rollout.max_turns=2", "rollout.environment_kwargs={turns: 2}", "rollout.tools=[tests/calc_tools.py:add]",
             "rollout.max_completion_length=16",
             "rewards=[{name: environment}, {name: recipes/rewards/toy.py:digit_fraction}]"),
        _run(tmp_path, "reward-model", "rewards=[{name: 'recipes/rewards/toy.py:digit_fraction'}, "
             f"{{name: 'model:{build_reward_model(tmp_path / 'rm')}', weight: 0.5, "
             "update: {every_steps: 2, learning_rate: 0.003}}]"),
    ]
    logged = {k for run in runs for record in run for k in record}
    assert {"ref_model/syncs", "sampling/importance_sampling_ratio/mean", "dynamic_sampling/rounds", "eval/pass@2",
            "rewards/digit_steps/steps_per_completion", "turns/mean", "tools/call_frequency",
            "reward_model/rm_rm/updates"} <= logged, sorted(logged)
    missing = sorted(k for k in logged if describe(k) is None)
    assert not missing, f"logged keys without a row in grpo_cli/run/metrics.py: {missing}"
