"""Multi-turn episodes: the model's turns and the environment's messages as one token sequence per episode.

Turn by turn, every live episode's token ids so far are the prompt of its next generation (one batched engine call
per turn). The model's generated ids are kept verbatim — nothing the model wrote is ever re-tokenised; only the new
environment messages are tokenised, as the text the chat template adds after the assistant's turn (its end-of-turn
marker is the model's own stop token; the rest — a newline, the tool header, the tool's content, the next assistant
header — is the environment's). The result is one :class:`~rlhfkit.rollout.types.Rollout` whose
``response_mask`` covers the whole episode after the first prompt (everything the model attends to) and whose
``action_mask`` is 1 on the model's own tokens only: losses, KL, values and advantages use the action mask.

Limits: ``max_turns`` assistant turns, ``max_total_tokens`` tokens after the first prompt; a turn cut by the token
limit ends the episode (``ended`` False, like a response cut at ``max_new_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..data.chat import render_chat, render_prompt_ids
from ..rollout.engine import left_pad
from ..rollout.types import Rollout
from .base import EnvError, call_env, check_step_result, make_environment


@dataclass
class Episode:
    env: object
    messages: list[dict]
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # after the prompt: model and environment tokens
    action: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)  # index in ``ids`` of each turn's last model token (-1: none)
    done: bool = False
    ended: bool = True
    n_first: int = 0  # messages returned by reset(): messages[n_first:] are the episode's turns


def _env_suffix_ids(tok, messages: list[dict], new_messages: list[dict]) -> list[int]:
    """Token ids of what the chat template writes after the assistant's last turn's end marker: the new
    messages and the next assistant header (the text is the difference of two renderings; only it is tokenised)."""
    before = render_chat(tok, messages, add_generation_prompt=False).rstrip()
    after = render_chat(tok, messages + new_messages, add_generation_prompt=True)
    if not after.startswith(before):
        raise EnvError("the chat template renders the conversation differently once tool messages are added",
                       where="env", fix="use a chat template that appends turns without rewriting earlier ones")
    return [int(i) for i in tok(after[len(before):], add_special_tokens=False)["input_ids"]]


def run_episodes(engine, model, tok, env_cls, env_kwargs: dict, spec: str, rows: list[dict], *, sampling_kwargs: dict,
                 eos_token_ids: list[int], pad_token_id: int, seed: int, max_turns: int,
                 max_total_tokens: int) -> tuple[Rollout, list[Episode]]:
    """Play one episode per row; returns the episodes as one Rollout (with ``action_mask``) and the episodes."""
    episodes = []
    for row in rows:
        env = make_environment(env_cls, env_kwargs, spec)
        messages = call_env(spec, "reset", env.reset, row)
        if not isinstance(messages, list) or not messages:
            raise EnvError(f"environment {spec!r}: reset() must return a non-empty list of messages", where="env.name",
                           fix="return [{'role': 'user', 'content': ...}, ...] from reset()")
        episodes.append(Episode(env, list(messages), render_prompt_ids(tok, messages, add_generation_prompt=True),
                                n_first=len(messages)))
    max_new = sampling_kwargs["max_new_tokens"]
    for turn in range(max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        budget = max(max_total_tokens - len(e.ids) for e in live)
        kwargs = {**sampling_kwargs, "max_new_tokens": max(1, min(max_new, budget))}
        out = engine.generate(model, [e.prompt_ids + e.ids for e in live], **kwargs, eos_token_ids=eos_token_ids,
                              pad_token_id=pad_token_id, tokenizer=tok, seed=seed + 7919 * turn)
        # one host copy per turn, not one per episode and field
        lengths, ended, ids = out.lengths.tolist(), out.ended.tolist(), out.response_ids.tolist()
        lps = out.logprobs.tolist() if out.logprobs is not None else None
        for i, e in enumerate(live):
            n = int(lengths[i])
            n_fit = min(n, max_total_tokens - len(e.ids))
            comp = ids[i][:n_fit]
            e.ids += comp
            e.turn_ends.append(len(e.ids) - 1 if comp else -1)
            e.action += [1] * len(comp)
            e.logprobs += lps[i][:n_fit] if lps is not None else [0.0] * len(comp)
            text = tok.decode(comp, skip_special_tokens=True)
            assistant = {"role": "assistant", "content": text}
            result = call_env(spec, "step", e.env.step, list(e.messages), text)
            new, reward, done = check_step_result(spec, result)
            e.turn_rewards.append(reward)
            e.messages.append(assistant)
            if n_fit < n or not ended[i]:
                e.done, e.ended = True, False  # cut by a token limit
                continue
            if done or turn == max_turns - 1 or not new:
                e.done = True
                continue
            suffix = _env_suffix_ids(tok, e.messages, new)
            e.messages.extend(new)
            if len(e.ids) + len(suffix) >= max_total_tokens:
                e.done, e.ended = True, False
                continue
            e.ids += suffix
            e.action += [0] * len(suffix)
            e.logprobs += [0.0] * len(suffix)
    return to_rollout(episodes, pad_token_id), episodes


def to_rollout(episodes: list[Episode], pad_token_id: int) -> Rollout:
    prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in episodes], pad_token_id)
    R = max(1, max(len(e.ids) for e in episodes))
    B = len(episodes)
    ids = torch.full((B, R), pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.long)
    action = torch.zeros((B, R), dtype=torch.long)
    lp = torch.zeros((B, R), dtype=torch.float32)
    for b, e in enumerate(episodes):
        n = len(e.ids)
        ids[b, :n] = torch.tensor(e.ids, dtype=torch.long)
        mask[b, :n] = 1
        action[b, :n] = torch.tensor(e.action, dtype=torch.long)
        lp[b, :n] = torch.tensor(e.logprobs, dtype=torch.float32)
    return Rollout(prompt_ids, prompt_mask, ids, mask, torch.tensor([e.ended for e in episodes]),
                   mask.sum(-1), logprobs=lp, action_mask=action)


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Means over the episodes: each key of the environments' ``metrics()`` (0 where an episode lacks it), turns,
    per-turn reward and episode reward (the sum of its turns' rewards). Logged as ``env/*`` in training and
    reported by ``rlhfkit eval --env``."""
    n = len(episodes)
    per = [e.env.metrics() if callable(getattr(e.env, "metrics", None)) else {} for e in episodes]
    out = {key: sum(float(m.get(key, 0.0)) for m in per) / n for key in sorted(set().union(*per))}
    out["turns_mean"] = sum(len(e.turn_rewards) for e in episodes) / n
    out["turn_reward_mean"] = sum(sum(e.turn_rewards) / max(1, len(e.turn_rewards)) for e in episodes) / n
    out["episode_reward_mean"] = sum(sum(e.turn_rewards) for e in episodes) / n
    return out


def turn_reward_tensor(episodes: list[Episode], width: int) -> torch.Tensor:
    """[B, width] float: each turn's reward on its last model token (turns without a token are dropped)."""
    out = torch.zeros((len(episodes), width), dtype=torch.float32)
    for b, e in enumerate(episodes):
        for end, reward in zip(e.turn_ends, e.turn_rewards):
            if end >= 0:
                out[b, end] += reward
    return out
