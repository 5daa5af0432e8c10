"""The built-in ``quickstart`` task: "shout" a random word.

The user says ``shout: zebra``; the ideal answer is the word in capitals, ``ZEBRA``. Words come from a fixed
list of 32 animals (3 to 5 letters). The gold metric is exact-answer
accuracy of *sampled* answers (temperature 1, the policy as a distribution), computed by a program.

The data mimics the InstructGPT story at toy scale:

* **SFT demonstrations are of mixed quality**: only ``good_fraction`` (default 40 %) of them shout; the rest echo the
  word in lower case. A model trained on them learns to copy the word and to shout about 40 % of the time, so its
  gold metric sits clearly above the untrained model's (0) and clearly below perfect.
* **Preference pairs** always prefer the exact capitalised answer; the rejected answer is the lower-case echo (half
  the pairs), or a capitalised answer with one letter wrong, or one letter missing / added. A reward model learns
  "capitals are better" quickly and "exact copy is better" more slowly.
* **RL** (PPO with that reward model, GRPO / RLOO with the exact-match reward function, DPO / KTO on the pairs) moves
  the policy towards shouting, which the gold metric measures.

Responses have different lengths (3 to 5 letters + EOS), so a trainer that forces generation to the maximum length
or ignores EOS visibly fails here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from .base import DataFile

LETTERS = "abcdefghijklmnopqrstuvwxyz"
# A fixed vocabulary keeps the task learnable from scratch in seconds: a 90k-parameter model memorises the
# spellings quickly, while copying arbitrary strings needs induction heads that take far longer to form on a CPU.
WORDS = (
    "cat dog bird fish horse tiger lion mouse snake eagle whale shark zebra camel panda koala "
    "otter moose llama bison sheep goat duck frog bear wolf fox owl bee ant crab seal"
).split()


@dataclass(frozen=True)
class ShoutTask:
    name: str = "quickstart"
    good_fraction: float = 0.4

    FILES: ClassVar[dict[str, DataFile]] = {
        "sft.jsonl": DataFile("sft_records", False, "SFT demonstrations as messages (40% shout the word, the rest "
                              "echo it)", "rlhfkit sft"),
        "preference.jsonl": DataFile("preference_records", False, "preference pairs: prompt, chosen, rejected",
                                     "rlhfkit rm / dpo / ipo / simpo / orpo"),
        "prompts.jsonl": DataFile("prompt_records", False, "prompts with the reference answer: prompt, answer",
                                  "rlhfkit ppo / grpo / rloo / reinforce (answer feeds reward functions)"),
        "unpaired.jsonl": DataFile("unpaired_records", False, "single completions labelled good / bad: prompt, "
                                   "completion, label", "rlhfkit kto"),
        "eval_prompts.jsonl": DataFile("prompt_records", True, "held-out prompts (another seed)",
                                       "rlhfkit eval --data ... --task quickstart"),
        "eval_preference.jsonl": DataFile("preference_records", True, "held-out preference pairs (another seed)",
                                          "data.eval of rm / dpo / ..."),
    }

    # ── records ──────────────────────────────────────────────────────────────────────────────────────────────
    @staticmethod
    def word(rng: random.Random) -> str:
        return rng.choice(WORDS)

    @staticmethod
    def prompt(word: str) -> str:
        return f"shout: {word}"

    @staticmethod
    def answer(word: str) -> str:
        return word.upper()

    def _corrupt(self, word: str, rng: random.Random) -> str:
        up = word.upper()
        kind = rng.random()
        if kind < 0.5:
            return word  # lower-case echo
        if kind < 0.75:
            i = rng.randrange(len(up))
            other = rng.choice([c for c in LETTERS.upper() if c != up[i]])
            return up[:i] + other + up[i + 1:]
        if kind < 0.875 and len(up) > 1:
            i = rng.randrange(len(up))
            return up[:i] + up[i + 1:]
        return up + rng.choice(LETTERS.upper())

    def sft_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-sft-{seed}")
        out = []
        for _ in range(n):
            w = self.word(rng)
            completion = self.answer(w) if rng.random() < self.good_fraction else w
            out.append({"messages": [{"role": "user", "content": self.prompt(w)},
                                     {"role": "assistant", "content": completion}]})
        return out

    def preference_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-pref-{seed}")
        out = []
        for _ in range(n):
            w = self.word(rng)
            out.append({"prompt": self.prompt(w), "chosen": self.answer(w), "rejected": self._corrupt(w, rng)})
        return out

    def prompt_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-prompt-{seed}")
        out = []
        for _ in range(n):
            w = self.word(rng)
            out.append({"prompt": self.prompt(w), "answer": self.answer(w)})
        return out

    def unpaired_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-unpaired-{seed}")
        out = []
        for _ in range(n):
            w = self.word(rng)
            good = rng.random() < 0.5
            completion = self.answer(w) if good else self._corrupt(w, rng)
            out.append({"prompt": self.prompt(w), "completion": completion, "label": good})
        return out

    # ── gold metric ──────────────────────────────────────────────────────────────────────────────────────────
    @staticmethod
    def gold(prompt: str, completion: str) -> float:
        """1.0 when the completion is exactly the capitalised word of the prompt."""
        word = prompt.rsplit("shout:", 1)[-1].strip()
        return float(completion.strip() == word.upper() and word != "")


TASK = ShoutTask()


def reward(prompts: list[str], completions: list[str], **fields) -> list[float]:
    """Reward function for online RL on the built-in task (``rlhfkit.tasks.quickstart:reward``): the gold metric."""
    return [TASK.gold(_text(p), c) for p, c in zip(prompts, completions)]


def _text(prompt) -> str:
    if isinstance(prompt, list):  # messages
        return " ".join(m["content"] for m in prompt if m.get("role") == "user")
    return str(prompt)
