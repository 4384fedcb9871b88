"""A single-turn verifiers taskset, written as verifiers (v1) tasksets are (its `reverse_text` example, with local
words instead of a hub dataset): reverse a word; the reward is the similarity of the answer to the reversal, and a
metric tracks exact matches. Trained by recipes/verifiers-reverse.yaml: rollout.agent: verifiers:verifiers/vf_reverse_letters.py
"""

import random
from difflib import SequenceMatcher

import verifiers.v1 as vf

SYSTEM = "Reverse the word character by character. Answer with the reversed word only."
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class ReverseData(vf.TaskData):
    answer: str
    """The word, reversed."""


class ReverseTask(vf.Task[ReverseData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        return SequenceMatcher(None, (trace.last_reply or "").strip(), self.data.answer).ratio()

    @vf.metric
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)


class ReverseConfig(vf.TasksetConfig):
    size: int = 64
    seed: int = 0


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self) -> list[ReverseTask]:
        rng = random.Random(self.config.seed)
        words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6))) for _ in range(self.config.size)]
        return [ReverseTask(ReverseData(idx=i, prompt=w, system_prompt=SYSTEM, answer=w[::-1]), self.config.task)
                for i, w in enumerate(words)]


__all__ = ["ReverseTaskset"]
