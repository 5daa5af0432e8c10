"""The built-in ``calculator`` environment: arithmetic questions the model may answer by calling a calculator tool.

Tool calls are parsed from the model's text in the Hermes / Qwen chat-template format,
``<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 41"}}</tool_call>``; the tool's result comes
back as a ``tool`` message. A turn without a tool call is the final answer: reward ``answer_reward`` when it
contains the right number (computed by the program from the row's ``expression``, or from the question), else 0.
The episode's first successful tool call earns ``tool_reward`` (a per-turn reward; later calls earn nothing more,
so a policy cannot farm the reward by calling again and again until ``env.max_turns``). ``metrics()`` reports tool
calls, their success, and correctness.

Expressions are evaluated by walking Python's ``ast`` (numbers, ``+ - * / // % **``, parentheses, unary minus; no names
and no calls), so nothing a model writes is executed.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def safe_eval(expression: str) -> float:
    """Value of an arithmetic expression (ValueError for anything else, or a power over 64 / huge numbers)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value,
                                                                                                      bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(b) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](a, b)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        value = ev(ast.parse(str(expression).strip(), mode="eval"))
    except (SyntaxError, ZeroDivisionError, OverflowError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    if abs(value) > 1e15:
        raise ValueError("result too large")
    return value


def parse_tool_calls(text: str) -> list[dict]:
    """Every ``<tool_call>{json}</tool_call>`` of ``text`` as {"name", "arguments"} (arguments a dict, or the raw
    string); a call whose body is not JSON comes back as {"name": None, "arguments": body} (a failed call)."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            calls.append({"name": None, "arguments": body})
            continue
        if not isinstance(obj, dict):
            calls.append({"name": None, "arguments": body})
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append({"name": obj.get("name"), "arguments": args})
    return calls


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


SYSTEM_PROMPT = ('You can use a calculator. To call it, write <tool_call>{"name": "calculator", "arguments": '
                 '{"expression": "..."}}</tool_call> and wait for its result; then give the answer as a number.')


class CalculatorEnv:
    """Arithmetic with a calculator tool (see the module doc). kwargs: tool_reward, answer_reward, system_prompt
    (put first when the conversation has no system turn; "" = none)."""

    def __init__(self, tool_reward: float = 0.2, answer_reward: float = 1.0, system_prompt: str = SYSTEM_PROMPT):
        self.tool_reward, self.answer_reward = float(tool_reward), float(answer_reward)
        self.system_prompt = system_prompt
        self.answer: float | None = None
        self.calls = self.successes = 0
        self.correct = False

    def reset(self, row: dict) -> list[dict]:
        messages = row["prompt"] if isinstance(row.get("prompt"), list) else [{"role": "user",
                                                                                "content": str(row["prompt"])}]
        expression = row.get("expression") or expression_in(messages[-1]["content"])
        self.answer = safe_eval(expression)
        if self.system_prompt and messages[0].get("role") != "system":
            return [{"role": "system", "content": self.system_prompt}, *messages]
        return list(messages)

    def step(self, messages: list[dict], completion: str) -> tuple[list[dict], float, bool]:
        calls = parse_tool_calls(completion)
        if not calls:
            numbers = NUMBER.findall(completion)
            self.correct = bool(numbers) and abs(float(numbers[-1]) - self.answer) < 1e-6
            return [], self.answer_reward if self.correct else 0.0, True
        out, reward = [], 0.0
        for call in calls:
            self.calls += 1
            args = call["arguments"]
            expr = args.get("expression") if isinstance(args, dict) else args
            if call["name"] != "calculator" or not isinstance(expr, (str, int, float)):
                out.append({"role": "tool", "content": "error: call calculator with {\"expression\": \"...\"}"})
                continue
            try:
                value = safe_eval(str(expr))
            except ValueError as exc:
                out.append({"role": "tool", "content": f"error: {exc}"})
                continue
            self.successes += 1
            if self.successes == 1:
                reward += self.tool_reward
            out.append({"role": "tool", "content": format_number(value)})
        return out, reward, False

    def metrics(self) -> dict[str, float]:
        return {"tool_calls": float(self.calls), "tool_call_success": float(self.successes > 0),
                "correct": float(self.correct)}


def expression_in(question: str) -> str:
    m = re.search(r"([-\d\s().+*/%]+[-\d)])\s*\??\s*$", question)
    if not m:
        raise ValueError(f"no arithmetic expression in {question!r}; give the row an 'expression' field")
    return m.group(1).strip()


def make_arithmetic_prompts(n: int, seed: int = 0, low: int = 10, high: int = 99) -> list[dict]:
    """Prompt records for the calculator task: {"prompt": "What is 37 * 41?", "expression": "37 * 41"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice("+-*")
        expression = f"{a} {op} {b}"
        rows.append({"prompt": f"What is {expression}?", "expression": expression})
    return rows
