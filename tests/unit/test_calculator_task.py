"""The built-in calculator task: its demonstrations are what the calculator environment accepts and rewards, the
guesses are never right, and SFT trains only on the assistant's tokens (that an episode's tokens are exactly the
tokens SFT trained on is tested in test_envs.py)."""

from __future__ import annotations

import json

import pytest

from rlhfkit.config import ModelConfig
from rlhfkit.data.formats import normalize_record
from rlhfkit.data.tokenize import tokenize_sft
from rlhfkit.envs import parse_tool_calls, safe_eval
from rlhfkit.models.loading import load_tokenizer_for
from rlhfkit.tasks import get_task, make_task_data
from rlhfkit.tasks.calculator import CalculatorTask

TASK = get_task("calculator")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer_for(ModelConfig(name="tiny"))


def test_demonstrations_call_the_tool_right_or_guess_wrong():
    rows = TASK.sft_records(400, seed=3)
    tool = [r for r in rows if len(r["messages"]) == 4]
    assert 0.2 < len(tool) / len(rows) < 0.4  # tool_fraction 0.3
    for r in rows:
        user, *rest = r["messages"]
        assert user["role"] == "user" and user["content"].startswith("What is ")
        value = safe_eval(user["content"][len("What is "):-1])
        if len(rest) == 3:  # call -> tool result -> answer, all agreeing with the program's value
            call, result, answer = rest
            (parsed,) = parse_tool_calls(call["content"])
            assert parsed["name"] == "calculator" and safe_eval(parsed["arguments"]["expression"]) == value
            assert result == {"role": "tool", "content": answer["content"]} and float(answer["content"]) == value
        else:
            (guess,) = rest
            assert guess["role"] == "assistant" and float(guess["content"]) != value
            assert TASK.gold(user["content"], guess["content"]) == 0.0
    assert TASK.gold("What is 12 * 3?", "it is 36") == 1.0 and TASK.gold("What is 12 * 3?", "no idea") == 0.0


def test_files_seeds_and_a_system_prompt_variant(tmp_path):
    written = make_task_data("calculator", tmp_path, n=20, n_eval=7, seed=1)
    assert sorted(written) == ["eval_prompts.jsonl", "prompts.jsonl", "sft.jsonl"]
    train = [json.loads(x) for x in written["prompts.jsonl"].read_text().splitlines()]
    held = [json.loads(x) for x in written["eval_prompts.jsonl"].read_text().splitlines()]
    assert len(train) == 20 and len(held) == 7 and train[:7] != held
    assert all(float(r["answer"]) == safe_eval(r["expression"]) for r in train + held)
    with_system = CalculatorTask(system_prompt="use the tool").sft_records(3)
    assert all(r["messages"][0] == {"role": "system", "content": "use the tool"} for r in with_system)


def test_sft_trains_on_the_assistant_turns_only(tok):
    record = next(r for r in TASK.sft_records(50) if len(r["messages"]) == 4)
    item = tokenize_sft(normalize_record(record, "sft"), tok, 400)
    ids, labels = item["input_ids"], item["labels"]
    trained = tok.decode([i for i, lab in zip(ids, labels) if lab != -100])
    call, result, answer = record["messages"][1:]
    assert trained == call["content"] + "<|im_end|>" + answer["content"] + "<|im_end|>"
    assert "tool" not in trained.replace("tool_call", "")  # the tool's message is context, never a target
