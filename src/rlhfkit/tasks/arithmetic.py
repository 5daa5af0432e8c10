"""The built-in ``arithmetic`` task: one-step arithmetic word problems with a checked final answer, for GRPO with
the maths verifier (``reward.functions=[{fn: math_answer}]``).

"Mia has 3 shells and finds 4 more. How many shells does Mia have now?" -> ``answer: "7"``. Numbers are drawn from
``low``..``high``; the operations are addition, subtraction (never below zero) and multiplication (``ops``).

* ``sft.jsonl``: demonstrations of mixed quality, ``\\boxed{n}`` (``demo``), right for ``correct_fraction``
  (default 35 %) of them and off by 1 to 3 otherwise: a tiny model learns the form and a rough guess;
* ``prompts.jsonl`` / ``eval_prompts.jsonl`` (held out, another seed): ``prompt`` and ``answer``, the column the
  maths verifier reads;
* the gold metric (:meth:`ArithmeticTask.gold`) recomputes the value from the prompt and checks the completion's
  final answer with the maths verifier, so ``rlhfkit eval --task arithmetic`` needs no answer column.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from ..rewards.maths import answers_equal, extract_answer
from .base import DataFile

NAMES = ("Mia", "Tom", "Ana", "Leo", "Sam", "Ivy", "Max", "Zoe")
THINGS = ("apples", "shells", "coins", "books", "stamps", "pens", "cards", "eggs")
TEMPLATES = {
    "add": "{name} has {a} {things} and finds {b} more. How many {things} does {name} have now?",
    "sub": "{name} has {a} {things} and gives away {b}. How many {things} does {name} have left?",
    "mul": "{name} has {a} boxes with {b} {things} in each. How many {things} does {name} have?",
}
PLAIN = {"add": "What is {a} plus {b}?", "sub": "What is {a} minus {b}?", "mul": "What is {a} times {b}?"}
_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
_PATTERNS = [(op, re.compile(re.escape(t).replace(r"\{name\}", r"(?P<name>\w+)", 1).replace(r"\{name\}", r"\w+")
                             .replace(r"\{a\}", r"(?P<a>\d+)").replace(r"\{b\}", r"(?P<b>\d+)")
                             .replace(r"\{things\}", r"\w+")))
             for templates in (TEMPLATES, PLAIN) for op, t in templates.items()]


def solve(prompt: str) -> int | None:
    """The value the prompt asks for (None when it is not one of the task's problems)."""
    for op, pattern in _PATTERNS:
        m = pattern.search(prompt)
        if m:
            return _OPS[op](int(m.group("a")), int(m.group("b")))
    return None


@dataclass(frozen=True)
class ArithmeticTask:
    name: str = "arithmetic"
    low: int = 1
    high: int = 9
    ops: tuple[str, ...] = ("add", "sub", "mul")
    correct_fraction: float = 0.35
    demo: str = "\\boxed{{{}}}"  # the demonstrations' answer, formatted with the value
    words: bool = True  # word problems; False: "What is 3 plus 4?" (fixed positions, for tiny models)

    FILES: ClassVar[dict[str, DataFile]] = {
        "sft.jsonl": DataFile("sft_records", False, "demonstrations '\\boxed{n}' (35 % right, the rest off by 1 "
                              "to 3)", "rlhfkit sft"),
        "prompts.jsonl": DataFile("prompt_records", False, "word problems: prompt, answer",
                                  "rlhfkit grpo / rloo / ppo with reward.functions=[{fn: math_answer}]"),
        "eval_prompts.jsonl": DataFile("prompt_records", True, "held-out word problems (another seed)",
                                       "data.eval of the online recipes; rlhfkit eval --task arithmetic"),
    }

    def problem(self, rng: random.Random) -> tuple[str, int]:
        op = rng.choice(self.ops)
        a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
        if op == "sub" and b > a:
            a, b = b, a
        prompt = (TEMPLATES if self.words else PLAIN)[op].format(name=rng.choice(NAMES), things=rng.choice(THINGS),
                                                                  a=a, b=b)
        return prompt, _OPS[op](a, b)

    def prompt_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-prompts-{seed}")
        return [{"prompt": p, "answer": str(v)} for p, v in (self.problem(rng) for _ in range(n))]

    def sft_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-sft-{seed}")
        out = []
        for _ in range(n):
            prompt, value = self.problem(rng)
            if rng.random() >= self.correct_fraction:  # a wrong guess, never negative
                value = rng.choice([v for v in range(value - 3, value + 4) if v >= 0 and v != value])
            out.append({"prompt": prompt, "completion": self.demo.format(value)})
        return out

    @staticmethod
    def gold(prompt: str, completion: str) -> float:
        """1.0 when the completion's final answer (maths verifier's extraction) is the problem's value."""
        value = solve(prompt)
        got = extract_answer(completion)
        if value is None or got is None:
            return 0.0
        return float(bool(answers_equal(got, str(value))))


TASK = ArithmeticTask()
