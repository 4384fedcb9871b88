"""Rows -> prompts: check columns, render templates (+ chat template), tokenize, stream seeded batches.

Rows come from a hub or local dataset, local .json/.jsonl/.parquet/.csv files, or an offline problem
generator, loaded, or read as a stream with data.streaming (`grpo_cli/data/sources.py`'s `load_rows`).
A prompt is `data.template` formatted with the row's columns, or the row's `data.prompt_column` (a string, or a
TRL-style conversation: a list of {"role", "content"} dicts). `PromptStream` hands out endless, seeded, resumable
batches of `PromptBatch`.

Importing this module must not import torch, transformers or datasets (`grpo validate` checks data
through it); heavy imports live inside the functions that need them.
"""

from __future__ import annotations

import json
import string
import sys
from typing import TYPE_CHECKING, Any

from grpo_cli.data.curriculum import Curriculum
from grpo_cli.errors import DataError
from grpo_cli.registry import did_you_mean

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

    from grpo_cli.data.table import Rows
    from grpo_cli.datatypes import PromptBatch
    from grpo_cli.recipe.schema import DataConfig


# ---------------------------------------------------------------- columns and templates


def _template_columns(template: str) -> list[str]:
    """Column names used by a str.format template ({a}, {a.b} and {a[0]} all use column a)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise DataError(f"data.template is not a valid format string: {e}") from None
    names = []
    for f in fields:
        name = f.split(".")[0].split("[")[0]
        if not name or name.isdigit():
            raise DataError("data.template uses positional placeholders ({} or {0}); name a column, e.g. {question}")
        names.append(name)
    return names


def _did_you_mean(name: str, columns: list[str]) -> str:
    return did_you_mean(name, columns, cutoff=0.75)  # column names are short: a stricter match


def check_columns(cfg: DataConfig, columns: list[str], source: str, needs_answer: bool | None = None) -> None:
    """DataError unless the prompt column or the template's placeholders, and the answer column, are in `columns`.

    A missing answer column is an error when `needs_answer` (default: when data.answer_column names
    another column than the default `answer`, which a dataset without answers may lack)."""
    listing = ", ".join(columns) or "none"
    if cfg.template:
        missing = [c for c in _template_columns(cfg.template) if c not in columns]
        if missing:
            raise DataError(
                f"data.template uses column(s) {missing}{_did_you_mean(missing[0], columns)} that {source} does not "
                f"have; columns: {listing}; fix data.template"
            )
    elif cfg.prompt_column is not None and cfg.prompt_column not in columns:
        raise DataError(
            f"data.prompt_column {cfg.prompt_column!r}{_did_you_mean(cfg.prompt_column, columns)} is not a column "
            f"of {source}; columns: {listing}; set data.prompt_column or data.template (or data.prompt_column: "
            "null when an environment's reset() writes every prompt)"
        )
    if needs_answer is None:
        needs_answer = bool(cfg.answer_column) and cfg.answer_column != "answer"
    if needs_answer and cfg.answer_column not in columns:
        raise DataError(
            f"data.answer_column {cfg.answer_column!r}{_did_you_mean(cfg.answer_column, columns)} is not a column "
            f"of {source}; columns: {listing}; set data.answer_column to the column with the reference answers"
        )


# ---------------------------------------------------------------- prompts


def render_prompt(row: dict[str, Any], cfg: DataConfig, tokenizer: Any, extra_user_text: str | None = None,
                  tools: list[dict] | None = None) -> str:
    """One row -> prompt text: template or prompt column, system prompt, chat template (with generation prompt).
    `extra_user_text` (an environment's reset): appended to the last user message, after a blank line (the
    message itself when it is empty).
    `tools` (rollout.tools' JSON schemas): given to the chat template; one that ignores them gets system_text
    as (the end of) the system message instead."""
    messages = prompt_messages(row, cfg, extra_user_text)
    if not cfg.chat_template:
        return "\n\n".join(str(m["content"]) for m in messages)
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the tokenizer has no chat template; set data.chat_template: false to use plain text prompts")
    # A conversation ending in an assistant turn is a prefix the completion continues (TRL convention).
    return render_messages(messages, tokenizer, cfg.chat_template_kwargs, tools,
                           continue_final=messages[-1]["role"] == "assistant")


def prompt_messages(row: dict[str, Any], cfg: DataConfig, extra_user_text: str | None = None) -> list[dict]:
    """One row -> its prompt's messages (render_prompt's, before the chat template)."""
    if cfg.template:
        try:
            messages = [{"role": "user", "content": cfg.template.format_map(row)}]
        except KeyError as e:
            raise DataError(f"data.template uses column {e.args[0]!r}, missing from the row; columns: {', '.join(row)}") from None
        except (IndexError, ValueError) as e:
            _template_columns(cfg.template)  # raises the specific message for positional placeholders
            raise DataError(f"data.template cannot be formatted: {e}") from None
    elif cfg.prompt_column is None:  # an environment's reset() writes the prompt
        messages = [{"role": "user", "content": ""}]
    else:
        if cfg.prompt_column not in row:
            raise DataError(
                f"data.prompt_column {cfg.prompt_column!r} is not a column; columns: {', '.join(row)}; "
                "set data.prompt_column or data.template"
            )
        messages = _as_messages(row[cfg.prompt_column], cfg.prompt_column)
    if extra_user_text:
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if users:
            m = messages[users[-1]]
            text = f"{m['content']}\n\n{extra_user_text}" if m["content"] else extra_user_text
            messages[users[-1]] = {**m, "content": text}
        else:
            messages.append({"role": "user", "content": extra_user_text})
    if cfg.system_prompt is not None:
        # the recipe's system prompt applies to every row: it replaces one the conversation brings
        messages = [{"role": "system", "content": cfg.system_prompt}] + [m for m in messages if m["role"] != "system"]
    return messages


def render_messages(messages: list[dict], tokenizer: Any, template_kwargs: dict[str, Any],
                    tools: list[dict] | None = None, continue_final: bool = False) -> str:
    """A conversation as the chat template renders it, with the generation prompt (or, `continue_final`, open at
    its last message). `tools`: given to the template; one that ignores them gets system_text as (the end of) the
    system message instead."""
    render = dict(tokenize=False, add_generation_prompt=not continue_final, continue_final_message=continue_final,
                  **template_kwargs)
    if tools:
        with_tools = tokenizer.apply_chat_template(messages, tools=tools, **render)
        if with_tools != tokenizer.apply_chat_template(messages, **render):
            return with_tools
        text = system_text(tools)
        if messages[0]["role"] == "system":
            messages = [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": text}, *messages]
    return tokenizer.apply_chat_template(messages, **render)


def _as_messages(value: Any, column: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataError(
        f"column {column!r} holds {type(value).__name__} {str(value)[:80]!r}; a prompt is a string or a list of "
        '{"role": ..., "content": ...} messages; set data.template to build it from other columns'
    )


def user_prompts(cfg: DataConfig, columns: dict[str, list]) -> list[str] | None:
    """[N] each row's prompt before the policy's chat template and system prompt (the user message a reward
    model's own chat template needs), or None when the rows cannot be rendered so."""
    plain = cfg.model_copy(update={"chat_template": False, "system_prompt": None})
    n = len(next(iter(columns.values()), []))
    try:
        return [render_prompt({k: v[i] for k, v in columns.items()}, plain, None) for i in range(n)]
    except DataError:  # e.g. a template naming the answer column, which rewards get as `answer`
        return None


def encode_prompts(texts: list[str], tokenizer: Any, max_prompt_length: int | None) -> list[list[int]]:
    """Token ids, no special tokens added (the chat template has them), left-truncated to the last N tokens.

    Keeping the end keeps the question and the assistant turn marker the completion follows.
    """
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    if max_prompt_length is None:
        return [list(x) for x in ids]
    return [list(x[-max_prompt_length:]) for x in ids]


# ---------------------------------------------------------------- stream


def reward_columns(columns: dict[str, Any], answer_column: str | None) -> dict[str, Any]:
    """The dataset columns a reward receives by name: every column, and the reference answer (data.answer_column)
    also as `answer`, in place of a data column of that name (TRL's rewards read `solution`: a TRL reward function
    works unchanged, and grpo's read `answer`). `grpo validate` checks reward parameters against these names."""
    out = dict(columns)
    if answer_column and answer_column != "answer":
        out.pop("answer", None)
        if answer_column in out:
            out["answer"] = out[answer_column]
    return out


def is_stream(dataset: Any) -> bool:
    """Whether `dataset` is a datasets IterableDataset (data.streaming), without importing datasets: a run whose rows
    came from grpo_cli/data/table.py never has."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(dataset, module.IterableDataset)


class DatasetRows:
    """An in-memory dataset's rows, epoch after epoch: epoch e visits every row once, in the order of a permutation
    drawn from numpy's Generator seeded with (seed, e) (dataset order without data.shuffle). A row's index is its
    row in the dataset. The state is {"epoch", "index"}: the next row is position `index` of epoch `epoch`. With a
    `curriculum` (data/curriculum.py) a row may be passed over when its turn comes; its marks are in the state."""

    def __init__(self, dataset: Rows | Dataset, shuffle: bool, seed: int, curriculum: Curriculum | None = None) -> None:
        self.dataset, self.shuffle, self.seed, self.curriculum = dataset, shuffle, seed, curriculum
        self.epoch, self.index = 0, 0
        self._order: list[int] | None = None  # permutation of the current epoch

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epoch": self.epoch, "index": self.index}
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "index" not in state:
            raise ValueError(f"the data position {state} was saved by a streamed run (data.streaming)")
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index <= len(self.dataset):
            raise ValueError(f"prompt stream state {state} does not fit a dataset of {len(self.dataset)} rows")
        self.epoch, self.index, self._order = epoch, index, None
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state.get("curriculum", {}))

    def epoch_order(self, epoch: int) -> list[int]:
        """Row indices in the order epoch `epoch` visits them."""
        import numpy as np

        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        rng = np.random.default_rng([self.seed % 2**63, epoch])  # SeedSequence needs non-negative entries
        return rng.permutation(n).tolist()

    def take(self, n: int) -> list[int]:
        """The indices of the next n rows (a batch may run into the next epoch); the stream moves past them."""
        picked: list[int] = []
        while len(picked) < n:
            if self.index >= len(self.dataset):
                self.epoch, self.index, self._order = self.epoch + 1, 0, None
            if self._order is None:
                self._order = self.epoch_order(self.epoch)
            if self.curriculum is None:
                take = min(n - len(picked), len(self._order) - self.index)
                picked += self._order[self.index : self.index + take]
                self.index += take
            else:
                row = self._order[self.index]
                if self.curriculum.draws(row, self.epoch, self.index):
                    picked.append(row)
                self.index += 1
        return picked

    def columns(self, indices: list[int]) -> dict[str, list]:
        return self.dataset[indices]  # column -> list, in the order of `indices`

    def close(self) -> None:
        pass


class PromptStream:
    """Endless, seeded, resumable batches of prompts from a dataset's rows: `DatasetRows` for a loaded dataset,
    `streaming.StreamedRows` for an IterableDataset (data.streaming); both tell the epoch in their state.

    The shuffle seed is data.seed when set, else `seed`. `state_dict()` is the rows' position: a restored stream
    continues identically. `in_flight`: batches handed out whose rows `batch_of` must still give back (the batches
    a checkpoint holds in flight: rollout.max_staleness + 1).
    """

    def __init__(self, dataset: Rows | Dataset | IterableDataset, cfg: DataConfig, tokenizer: Any, batch_size: int,
                 seed: int, tools: list[dict] | None = None, in_flight: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.cfg, self.tokenizer, self.batch_size = cfg, tokenizer, batch_size
        self.tools = tools  # rollout.tools' schemas: every prompt describes them
        self.seed = cfg.seed if cfg.seed is not None else seed
        if is_stream(dataset):
            from grpo_cli.data.streaming import StreamedRows

            self.rows: DatasetRows | StreamedRows = StreamedRows(dataset, cfg, self.seed, keep=batch_size * in_flight)
        elif len(dataset) == 0:
            raise DataError("the dataset has no rows")
        else:
            curriculum = cfg.curriculum and Curriculum(cfg.curriculum.no_signal_weight, self.seed)
            self.rows = DatasetRows(dataset, cfg.shuffle, self.seed, curriculum)

    def state_dict(self) -> dict[str, Any]:
        return self.rows.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows.load_state_dict(state)

    def next_batch(self) -> PromptBatch:
        return self.batch_of(self.rows.take(self.batch_size))

    def observe(self, rows: list[int], rewards: Any, group_size: int) -> None:
        """A step's rewards ([len(rows) * G], every process's) for data.curriculum's marks; nothing without one."""
        if getattr(self.rows, "curriculum", None) is not None:
            self.rows.curriculum.observe(rows, [float(r) for r in rewards], group_size)

    def metrics(self) -> dict[str, float]:
        curriculum = getattr(self.rows, "curriculum", None)
        return curriculum.metrics() if curriculum is not None else {}

    def upcoming(self, n: int) -> PromptBatch:
        """The next n prompts, without moving the stream (a fresh stream's: step 1's first)."""
        state = self.rows.state_dict()
        batch = self.batch_of(self.rows.take(n))
        self.rows.load_state_dict(state)
        return batch

    def batch_of(self, indices: list[int]) -> PromptBatch:
        """The prompts of rows `indices`, rendered and tokenized (the stream does not move)."""
        from grpo_cli.datatypes import PromptBatch

        columns = self.rows.columns(indices)
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(indices))]
        texts = [render_prompt(row, self.cfg, self.tokenizer, tools=self.tools) for row in rows]
        input_ids = encode_prompts(texts, self.tokenizer, self.cfg.max_prompt_length)
        return PromptBatch(texts=texts, input_ids=input_ids, columns=reward_columns(columns, self.cfg.answer_column),
                           indices=indices)

    def close(self) -> None:
        """Close the stream's open reader, if any."""
        self.rows.close()

    def __iter__(self) -> PromptStream:
        return self

    def __next__(self) -> PromptBatch:
        return self.next_batch()


def system_text(tool_schemas: list[dict]) -> str:
    """Our own description of the tools and the call format, for chat templates that ignore `tools=`."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in tool_schemas)
    return ("You can use tools. Their JSON schemas, one per line:\n<tools>\n" + lines + "\n</tools>\n\nTo use a "
            "tool, write a JSON object with its name and arguments between tags, then stop and wait for its answer:\n"
            '<tool_call>\n{"name": "tool name", "arguments": {"argument": "value"}}\n</tool_call>')
