"""Reward functions written as TRL's GRPO documentation writes them ("Using a custom reward function", examples 1-5
of docs/source/grpo_trainer.md, TRL 1.x), kept verbatim apart from the names of the duplicates, so that the tests
hold rlhfkit to TRL's calling convention as its users read it. Imported by module name (workers import it too)."""

import asyncio
import re


# Example 1: reward longer completions (the docs spell the ids `completions_ids`)
def reward_func(completions_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completions_ids]


# Example 1.1: based on the number of characters
def reward_func_chars(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]


# Example 2: a specific format (conversational)
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


# Example 3: based on a reference (standard format, a `ground_truth` column)
def reward_func_reference(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


# Example 4: multi-task, None for the tasks a function does not judge
def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):  # noqa: B007 - as the docs write it
        if t == "math":
            # Calculate math-specific reward
            correct = "4" in completion  # the docs' check_math_solution(prompt, completion), made concrete
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards


# Example 5: asynchronous
async def async_reward_func(prompts, completions, **kwargs):
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]


def curriculum(completions, trainer_state, **kwargs):
    """trainer_state, as TRL passes it: the fraction of the run done, for every completion."""
    return [trainer_state.global_step / trainer_state.max_steps for _ in completions]


# Example 6: logging extra columns and metrics (log_extra / log_metric, passed by the trainer)
def reward_with_logs(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
    extracted = [c.split()[-1] if c.split() else None for c in completions]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]
    if log_extra:
        log_extra("golden_answer", list(ground_truth))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])
    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))
    return rewards


def batch_sizes(completions, **kwargs):
    """How many completions each call got (a group-aware reward sees its whole groups)."""
    return [float(len(completions))] * len(completions)


def group_rank(prompts, completions, **fields):
    """rlhfkit's convention: for each completion, the size of its prompt's group as this call saw it."""
    return [float(sum(q == p for q in prompts)) for p in prompts]
