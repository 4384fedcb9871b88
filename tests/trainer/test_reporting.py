"""What a step reports: the console's step line."""

from grpo_cli.trainer.reporting import format_step_line


def test_step_line_shows_rewards_and_eval():
    line = format_step_line(3, 10, {"reward": 0.5, "rewards/accuracy/mean": 0.25, "eval/accuracy": 0.75, "time/step": 2.0})
    assert line == "step 3/10 | reward 0.500 | s/step 2.0 | eval acc 0.750 | accuracy 0.250"
