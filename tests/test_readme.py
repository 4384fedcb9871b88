"""The README's table of recipe keys is the schema's: every leaf field, its default and description."""

import re
from pathlib import Path

from grpo_cli.recipe.schema import key_table, schema_keys

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = 'python -c "from grpo_cli.recipe.schema import key_table; print(key_table())"'


def readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("<!-- recipe-keys:start -->\n", 1)[1].split("\n<!-- recipe-keys:end -->", 1)[0].strip()


def test_readme_key_table_matches_the_schema():
    documented = re.findall(r"^\| `([^`]+)` \|", readme_table(), re.M)
    keys = [k for k, _ in schema_keys()]
    assert not set(keys) - set(documented), f"undocumented recipe keys {sorted(set(keys) - set(documented))}; {REGENERATE}"
    assert not set(documented) - set(keys), f"stale keys in README {sorted(set(documented) - set(keys))}; {REGENERATE}"
    assert readme_table() == key_table(), f"defaults or descriptions differ from the schema; {REGENERATE}"


def test_the_table_lists_the_keys_the_issue_found_missing():
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme_table(), re.M))
    assert {"model.lora.r", "model.lora.target_modules", "model.load_in_4bit", "rollout.vllm.mode",
            "rollout.vllm.server_url", "rollout.importance_sampling", "rollout.importance_sampling_cap",
            "eval.files", "rewards[].on_error"} <= documented
    assert len(documented) == len(schema_keys()) > 90
