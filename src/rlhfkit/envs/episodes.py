"""Multi-turn episodes: the model's turns and the environment's messages as one token sequence per episode.

Turn by turn, every live episode's token ids so far are the prompt of its next generation (one batched engine call
per turn). The model's generated ids are kept verbatim — nothing the model wrote is ever re-tokenised; only the new
environment messages are tokenised, as the text the chat template adds after the assistant's turn (its end-of-turn
marker is the model's own stop token; the rest — a newline, the tool header, the tool's content, the next assistant
header — is the environment's). The result is one :class:`~rlhfkit.rollout.types.Rollout` whose
``response_mask`` covers the whole episode after the first prompt (everything the model attends to) and whose
``action_mask`` is 1 on the model's own tokens only: losses, KL, values and advantages use the action mask.

The environments run in worker processes under a time limit and everything they return is checked
(:mod:`rlhfkit.envs.host`). Limits: ``max_turns`` assistant turns, ``max_total_tokens`` tokens after the first
prompt; a turn cut by the token limit ends the episode (``ended`` False, like a response cut at
``max_new_tokens``). The work follows the limit, not the environment's output: an observation (or a reset prompt)
whose text is longer than the limit could hold even at the tokenizer's longest token (:func:`max_token_chars`
characters a token) is judged over-long without being rendered or tokenised (a server answering 10 MB observations
costs nothing more than a short one), and the episodes it ends are counted (``env/overlong``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..data.chat import render_chat, render_prompt_ids
from ..rollout.engine import Engine, left_pad
from ..rollout.sampling import SamplingParams
from ..rollout.types import Rollout
from .base import EnvError
from .host import EnvCalls


@dataclass
class Episode:
    eid: int  # the environment object's id on its worker (see envs.host.EnvCalls)
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
    failed: str = ""  # why the episode is dropped (a timeout, a dead worker, a NaN reward, an over-long observation)
    metrics: dict = field(default_factory=dict)

    def drop(self, why: str) -> None:
        self.failed, self.done = self.failed or why, True

    @property
    def reward(self) -> float:
        """The episode's return (the sum of its turns' rewards); NaN for a dropped episode."""
        return math.nan if self.failed else sum(self.turn_rewards)


def _env_suffix_ids(tok, messages: list[dict], new_messages: list[dict]) -> list[int]:
    """Token ids of what the chat template writes after the assistant's last turn's end marker: the new
    messages and the next assistant header (the text is the difference of two renderings; only it is tokenised)."""
    before = render_chat(tok, messages, add_generation_prompt=False).rstrip()
    after = render_chat(tok, messages + new_messages, add_generation_prompt=True)
    if not after.startswith(before):
        raise EnvError("the chat template renders the conversation differently once tool messages are added",
                       where="env", fix="use a chat template that appends turns without rewriting earlier ones")
    return [int(i) for i in tok(after[len(before):], add_special_tokens=False)["input_ids"]]


_TOKEN_CHARS: dict[int, int] = {}


def max_token_chars(tok) -> int:
    """The most characters one token of ``tok`` stands for (an upper bound: the longest token string of its
    vocabulary, which byte-level and WordPiece spellings only lengthen): a text of more than ``n * max_token_chars``
    characters is more than ``n`` tokens, whatever it tokenises to."""
    if id(tok) not in _TOKEN_CHARS:
        _TOKEN_CHARS[id(tok)] = max((len(t) for t in tok.get_vocab()), default=1) or 1
    return _TOKEN_CHARS[id(tok)]


def _chars(messages: list[dict]) -> int:
    return sum(len(m.get("content") or "") for m in messages if isinstance(m, dict))


def _overlong(envs: EnvCalls, e: Episode, overflow: str, method: str, step: int | None, what: str,
              knob: str) -> bool:
    """An over-long prompt or observation under ``data.overflow``: one line (error), the episode dropped (drop,
    returns True) or cut (truncate, returns False); counted (``env/overlong``) and said once either way."""
    if overflow == "error":
        raise envs.fail(method, step, f"returned {what}", f"shorten it, raise {knob} or set data.overflow=truncate "
                        "(or drop)")
    envs.counts["overlong"] = envs.counts.get("overlong", 0) + 1
    envs.say_once("overlong", f"[env] warning: {envs.name}: {method}() returned {what} (data.overflow={overflow}: "
                              f"the episode is {'dropped' if overflow == 'drop' else 'cut there'}); counted in "
                              "env/overlong (said once)")
    if overflow == "drop":
        e.drop("overlong")
    return overflow == "drop"


def _start(envs: EnvCalls, tok, rows: list[dict], step: int | None, prompt_limit: int | None,
           overflow: str) -> list[Episode]:
    """One environment per row, reset: its messages checked, its prompt held to ``prompt_limit`` tokens by the
    ``overflow`` rule of data prompts (truncate from the left, drop the episode, or stop with one line)."""
    items = [(i, ()) for i in range(len(rows))]
    made = envs.calls("new", items, step)
    firsts = envs.calls("reset", [(i, (row,)) for i, row in enumerate(rows)], step)
    episodes = []
    for i, (m, first) in enumerate(zip(made, firsts)):
        if isinstance(m, Exception) or isinstance(first, Exception):
            e = Episode(i, [], [])
            e.drop("failed")
            episodes.append(e)
            continue
        messages = envs.check_messages(first, "reset", step, empty_ok=False)
        chars, room = _chars(messages), None if prompt_limit is None else prompt_limit * max_token_chars(tok)
        if room is not None and chars > room:  # more than the limit can hold: only its end is rendered and read
            e = Episode(i, messages, [], n_first=len(messages))
            if _overlong(envs, e, overflow, "reset", step, f"a prompt of {chars} characters, more than the limit of "
                         f"{prompt_limit} tokens can hold", "data.max_prompt_length"):
                episodes.append(e)
                continue
            text = render_chat(tok, messages, add_generation_prompt=True)[-room:]
            e.prompt_ids = [int(t) for t in tok(text, add_special_tokens=False)["input_ids"]][-prompt_limit:]
            episodes.append(e)
            continue
        ids = render_prompt_ids(tok, messages, add_generation_prompt=True)
        e = Episode(i, messages, ids, n_first=len(messages))
        if prompt_limit is not None and len(ids) > prompt_limit:
            _overlong(envs, e, overflow, "reset", step, f"a prompt of {len(ids)} tokens, more than the limit of "
                      f"{prompt_limit}", "data.max_prompt_length")
            e.prompt_ids = ids[len(ids) - prompt_limit:]
        episodes.append(e)
    return episodes


def run_episodes(engine: Engine, model, tok, envs: EnvCalls, rows: list[dict], *, params: SamplingParams, seed: int,
                 max_turns: int, max_total_tokens: int, step: int | None = None, prompt_limit: int | None = None,
                 overflow: str = "truncate") -> tuple[Rollout, list[Episode]]:
    """Play one episode per row with the run's ``engine`` (its EOS ids, pad id and stop strings end each turn;
    ``params.max_new_tokens`` bounds each turn) and the environments of ``envs`` (each call under its time limit,
    everything returned checked: :mod:`rlhfkit.envs.host`); returns the episodes as one Rollout (with
    ``action_mask``) and the episodes. A dropped episode (``failed``) keeps its tokens so far; its ``reward`` is
    NaN. ``step`` names the rollout step in messages; ``prompt_limit`` / ``overflow`` hold reset()'s prompts and
    every observation (at most ``max_total_tokens``) to the data prompts' rule."""
    episodes = _start(envs, tok, rows, step, prompt_limit, overflow)
    for turn in range(max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        budget = max(max_total_tokens - len(e.ids) for e in live)
        max_new = max(1, min(params.max_new_tokens, budget))
        turn_params = params.replace(max_new_tokens=max_new, min_new_tokens=min(params.min_new_tokens, max_new))
        out = engine.generate(model, [e.prompt_ids + e.ids for e in live], turn_params, seed=seed + 7919 * turn)
        # one host copy per turn, not one per episode and field
        lengths, ended, ids = out.lengths.tolist(), out.ended.tolist(), out.response_ids.tolist()
        lps = out.logprobs.tolist()  # every engine's generate() returns the sampling log-probs
        texts, cut = [], []
        for i, e in enumerate(live):
            n = int(lengths[i])
            n_fit = min(n, max_total_tokens - len(e.ids))
            comp = ids[i][:n_fit]
            e.ids += comp
            e.turn_ends.append(len(e.ids) - 1 if comp else -1)
            e.action += [1] * len(comp)
            e.logprobs += lps[i][:n_fit]
            texts.append(tok.decode(comp, skip_special_tokens=True))
            cut.append(n_fit < n or not ended[i])
        results = envs.calls("step", [(e.eid, (list(e.messages), t)) for e, t in zip(live, texts)], step)
        for e, text, was_cut, result in zip(live, texts, cut, results):
            e.messages.append({"role": "assistant", "content": text})
            if isinstance(result, Exception):
                e.drop("failed")
                continue
            new, reward, done = envs.check_step(result, step)
            e.turn_rewards.append(reward)
            if not math.isfinite(reward):
                e.drop("reward")
                continue
            if was_cut:
                e.done, e.ended = True, False  # cut by a token limit
                continue
            if done or turn == max_turns - 1 or not new:
                e.done = True
                continue
            chars = _chars(new)
            if chars > max_total_tokens * max_token_chars(tok):  # more than an episode holds: never tokenised
                if not _overlong(envs, e, overflow, "step", step, f"messages of {chars} characters, more than "
                                 f"env.max_total_tokens={max_total_tokens} tokens can hold", "env.max_total_tokens"):
                    e.done, e.ended = True, False  # truncate: cut here, as when the episode's tokens run out
                continue
            suffix = _env_suffix_ids(tok, e.messages, new)
            if len(suffix) > max_total_tokens and _overlong(  # an observation longer than a whole episode
                    envs, e, overflow, "step", step, f"messages of {len(suffix)} tokens, more than "
                    f"env.max_total_tokens={max_total_tokens}", "env.max_total_tokens"):
                continue
            e.messages.extend(new)
            if len(e.ids) + len(suffix) >= max_total_tokens:
                e.done, e.ended = True, False
                continue
            e.ids += suffix
            e.action += [0] * len(suffix)
            e.logprobs += [0.0] * len(suffix)
    kept = [e for e in episodes if not e.failed]
    for e, m in zip(kept, envs.calls("metrics", [(e.eid, ()) for e in kept], step)):
        if isinstance(m, Exception):
            e.drop("failed")
        else:
            e.metrics = envs.check_metrics(m, step)
    envs.drop([e.eid for e in episodes])
    return to_rollout(episodes, engine.pad_token_id), episodes


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


def episode_metrics(episodes: list[Episode], counts: dict | None = None) -> dict[str, float]:
    """Means over the episodes kept: each key of the environments' ``metrics()`` (0 where an episode lacks it or
    reports a non-finite value), turns, per-turn reward and episode reward (the sum of its turns' rewards); ``dropped``:
    episodes dropped (timeouts, dead workers, NaN rewards, over-long observations), plus ``counts`` (timed-out and
    failed calls). Logged as ``env/*`` in training and reported by ``rlhfkit eval --env``."""
    kept = [e for e in episodes if not e.failed]
    n = max(1, len(kept))
    out = {}
    for key in sorted(set().union(*(e.metrics for e in kept))):
        values = [e.metrics.get(key, 0.0) for e in kept]
        out[key] = sum(v for v in values if math.isfinite(v)) / n
    out["turns_mean"] = sum(len(e.turn_rewards) for e in kept) / n
    out["turn_reward_mean"] = sum(sum(e.turn_rewards) / max(1, len(e.turn_rewards)) for e in kept) / n
    out["episode_reward_mean"] = sum(e.reward for e in kept) / n
    out["dropped"] = float(len(episodes) - len(kept))
    out["nonfinite_rewards"] = float(sum(e.failed == "reward" for e in episodes))  # episodes dropped for NaN / inf
    out.update({key: float(v) for key, v in (counts or {}).items()})
    return out


def turn_reward_tensor(episodes: list[Episode], width: int) -> torch.Tensor:
    """[B, width] float: each turn's reward on its last model token (turns without a token are dropped)."""
    out = torch.zeros((len(episodes), width), dtype=torch.float32)
    for b, e in enumerate(episodes):
        for end, reward in zip(e.turn_ends, e.turn_rewards):
            if end >= 0 and not e.failed:  # a dropped episode's rewards (NaN among them) reach no tensor
                out[b, end] += reward
    return out
