"""A multi-turn verifiers environment, written as verifiers (v1) environments are (like its color_codeword example):
the taskset's Env drives the conversation, answering each guess with "higher" or "lower" until the model finds the
number or runs out of turns; the reward is 1 for finding it, with a metric for the turns it took. Trained by
recipes/verifiers-guess.yaml: rollout.agent: verifiers:verifiers/vf_guess_number.py
"""

import random
import re

import verifiers.v1 as vf

SYSTEM = "Guess the secret number. Answer with one number; you will hear whether it is higher or lower."


class GuessData(vf.TaskData):
    answer: int
    max_turns: int = 4


def last_number(text: str | None) -> int | None:
    found = re.findall(r"-?\d+", text or "")
    return int(found[-1]) if found else None


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(last_number(trace.last_reply) == self.data.answer)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessEnv(vf.SingleAgentEnv):
    """One user turn after each guess, the scripted half of the game."""

    async def run(self, task: GuessTask, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            for _ in range(task.data.max_turns - 1):
                guess = last_number(segment.last_reply)
                if segment.terminated or guess == task.data.answer:
                    break
                hint = "Answer with a number." if guess is None else (
                    "Higher." if guess < task.data.answer else "Lower.")
                segment = await interaction.turn(hint)


class GuessConfig(vf.TasksetConfig):
    size: int = 32
    low: int = 1
    high: int = 10


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> list[GuessTask]:
        rng = random.Random(0)
        c = self.config
        return [GuessTask(GuessData(idx=i, prompt=f"The number is from {c.low} to {c.high}. Your guess?",
                                    system_prompt=SYSTEM, answer=rng.randint(c.low, c.high)), c.task)
                for i in range(c.size)]


__all__ = ["GuessTaskset", "GuessEnv"]
