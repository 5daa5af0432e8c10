"""The built-in ``calculator`` task: two-number arithmetic that a model answers best by calling a calculator tool.

It pairs with the built-in ``calculator`` environment (:mod:`rlhfkit.envs.calculator`), and tells the usual story
of tool-use RL at toy scale:

* **SFT demonstrations are of mixed quality**: ``tool_fraction`` (default 30 %) of them call the calculator in the
  Hermes format, ``<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 41"}}</tool_call>``, read the
  ``tool`` message with the result and answer with it; the rest answer at once with a guess, wrong as mental
  arithmetic often is. A model trained on them writes a tool call about that often, not always well-formed.
* **RL with the environment** (``env.name=calculator``, ``env.kwargs={system_prompt: ''}`` like the demonstrations,
  see :attr:`CalculatorTask.system_prompt`) rewards an episode's first successful call and a right answer, so
  calling the tool becomes more frequent and more often well-formed: ``env/tool_call_success`` rises.

A tiny model must first learn the call format from demonstrations: a 90k-parameter character-level model never
writes an 85-character ``<tool_call>{json}</tool_call>`` by chance, and no amount of RL finds a reward it never
sees. The gold metric (:meth:`CalculatorTask.gold`) is single-turn: the answer's last number is the right value.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import ClassVar

from ..envs.calculator import NUMBER, expression_in, format_number, make_arithmetic_prompts, safe_eval
from .base import DataFile


def tool_call(expression: str) -> str:
    """The calculator call a demonstration writes (the Hermes / Qwen tool-call format)."""
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


@dataclass(frozen=True)
class CalculatorTask:
    name: str = "calculator"
    tool_fraction: float = 0.3
    low: int = 10
    high: int = 99
    # No system turn by default: the tool's description (envs.calculator.SYSTEM_PROMPT) would more than double every
    # sequence of a task meant to run in seconds. Run the environment the same way: env.kwargs={system_prompt: ''}.
    # CalculatorTask(system_prompt=SYSTEM_PROMPT) writes demonstrations that match the environment's default.
    system_prompt: str = ""

    FILES: ClassVar[dict[str, DataFile]] = {
        "sft.jsonl": DataFile("sft_records", False, "tool-use demonstrations as messages (tool_fraction of them, "
                              "30% by default, call the calculator and answer with its result; the rest guess)",
                              "rlhfkit sft"),
        "prompts.jsonl": DataFile("prompt_records", False, "arithmetic questions: prompt, expression, answer",
                                  "rlhfkit grpo / ppo / rloo / reinforce with env.name=calculator"),
        "eval_prompts.jsonl": DataFile("prompt_records", True, "held-out questions (another seed)",
                                       "data.eval of the online recipes; rlhfkit eval --task calculator"),
    }

    def sft_records(self, n: int, seed: int = 0) -> list[dict]:
        rng = random.Random(f"{self.name}-sft-{seed}")
        out = []
        for row in self.prompt_records(n, seed=seed + 500_000):  # other questions than prompts.jsonl
            value = safe_eval(row["expression"])
            question = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            question.append({"role": "user", "content": row["prompt"]})
            if rng.random() < self.tool_fraction:
                messages = [*question, {"role": "assistant", "content": tool_call(row["expression"])},
                            {"role": "tool", "content": row["answer"]}, {"role": "assistant", "content": row["answer"]}]
            else:  # a guess: off by 1 to 20 % (at least 1), never right
                off = max(1, int(abs(value) * rng.uniform(0.01, 0.2)))
                guess = format_number(value + rng.choice((-1, 1)) * off)
                messages = [*question, {"role": "assistant", "content": guess}]
            out.append({"messages": messages})
        return out

    def prompt_records(self, n: int, seed: int = 0) -> list[dict]:
        rows = make_arithmetic_prompts(n, seed=seed, low=self.low, high=self.high)
        return [{**row, "answer": format_number(safe_eval(row["expression"]))} for row in rows]

    @staticmethod
    def gold(prompt: str, completion: str) -> float:
        """1.0 when the completion's last number is the value of the prompt's expression (no tool: single turn)."""
        numbers = NUMBER.findall(completion)
        try:
            value = safe_eval(expression_in(prompt))
        except ValueError:
            return 0.0
        return float(bool(numbers) and abs(float(numbers[-1]) - value) < 1e-6)


TASK = CalculatorTask()
