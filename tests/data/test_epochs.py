"""train.epochs (issue 38, TRL's num_train_epochs): a run's steps from its data's rows."""

import json

import pytest

from grpo_cli.data.epochs import with_epoch_steps
from grpo_cli.errors import RecipeError
from grpo_cli.recipe.files import load_recipe


def test_epochs_are_steps_of_the_datas_rows_and_max_steps_wins():
    r = with_epoch_steps(load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=null", "train.epochs=1.5",
                                                              "data.generator_kwargs.size=7"]))
    assert r.train.max_steps == 6  # ceil(1.5 x 7 rows / 2 prompts a step)
    assert with_epoch_steps(r) is r  # once set, kept
    limited = load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=null", "train.epochs=1", "data.limit=5"])
    assert with_epoch_steps(limited).train.max_steps == 3  # data.limit's rows
    both = load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=2", "train.epochs=10"])
    assert with_epoch_steps(both).train.max_steps == 2  # as TRL: max_steps, when set, wins


def test_no_step_count_and_epochs_of_a_stream_are_refused(tmp_path):
    with pytest.raises(RecipeError, match="train.max_steps is not set: give the training steps, or train.epochs"):
        load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=null"])
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": "1 + 1", "answer": "2"}) + "\n" for _ in range(4)))
    stream = load_recipe("recipes/ci-tiny.yaml", ["train.max_steps=null", "train.epochs=1", "data.generator=null",
                                                  f"data.files={tmp_path / 'rows.jsonl'}", "data.streaming=true"])
    with pytest.raises(RecipeError, match="train.epochs: data.streaming"):
        with_epoch_steps(stream)
