"""Reward-model scoring of policy responses, re-tokenising when the reward model reads another tokenizer.

Two paths give the same number for the same text:

* **same tokenizer** (same vocabulary and chat template as the policy) and policy ids given: the policy's
  prompt + response ids (response cut after its EOS) are scored as they are — no decode / re-encode round trip;
* **otherwise**: the conversation ``prompt_messages + [assistant: response_text]`` is rendered with the REWARD
  tokenizer's chat template (text), tokenised with ``add_special_tokens=False`` and scored.

A rendered conversation is scored at its end-of-turn token: whitespace-only tokens the template puts after the
last turn (ChatML's ``"\\n"`` after ``<|im_end|>``) are dropped, so the text path reads the same last token as a
policy response that ended with EOS. (A response cut at the length limit has no EOS in the id path but gets the
template's end-of-turn in the text path; such responses usually get the missing-EOS penalty anyway.) Over-long
inputs are truncated from the left (the response end is kept).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

from ..data.chat import render_prompt_ids
from ..models.heads import sequence_scores, unwrap
from ..rollout.engine import eval_mode, model_device


def same_tokenizer(a, b) -> bool:
    """True when ``a`` and ``b`` turn the same conversation into the same ids: same vocabulary (token -> id), same
    chat template and, for fast tokenizers, the same model / normalizer / pre-tokenizer."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return False
    if a.get_vocab() != b.get_vocab():
        return False
    ja, jb = _backend_json(a), _backend_json(b)
    if ja is not None and jb is not None:
        keys = ("model", "normalizer", "pre_tokenizer")
        if any(ja.get(k) != jb.get(k) for k in keys):
            return False
    return True


def _backend_json(tok) -> dict | None:
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    try:
        return json.loads(backend.to_str())
    except Exception:
        return None


def max_input_length(model, tokenizer) -> int | None:
    """The reward model's input limit: the smaller of the tokenizer's ``model_max_length`` (when set) and the
    config's ``max_position_embeddings``; ``None`` when neither is known."""
    limits = []
    tl = getattr(tokenizer, "model_max_length", None)
    if isinstance(tl, int) and 0 < tl < 10**8:
        limits.append(tl)
    config = getattr(unwrap(model), "config", None)
    mp = getattr(config, "max_position_embeddings", None) if config is not None else None
    if isinstance(mp, int) and mp > 0:
        limits.append(mp)
    return min(limits) if limits else None


def conversation_ids(tokenizer, messages: list[dict], max_length: int | None = None) -> list[int]:
    """Ids of a full conversation (ending with the turn to score) for a reward model: the chat template as text,
    tokenised without added special tokens, trailing whitespace-only tokens dropped, left-truncated."""
    ids = render_prompt_ids(tokenizer, messages, add_generation_prompt=False)
    while len(ids) > 1 and not tokenizer.decode(ids[-1:], skip_special_tokens=False).strip():
        ids.pop()
    if max_length is not None and len(ids) > max_length:
        ids = ids[-max_length:]
    return ids


class RewardModelScorer:
    """Scores responses with a 1-label sequence-classification reward model (score at the last real token)."""

    def __init__(
        self, model, tokenizer, policy_tokenizer=None, batch_size: int = 16, device=None, max_length=None
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.policy_tokenizer = policy_tokenizer
        self.batch_size = int(batch_size)
        self.device = torch.device(device) if device is not None else None
        self.max_length = max_length if max_length is not None else max_input_length(model, tokenizer)
        self.same_tokenizer = same_tokenizer(tokenizer, policy_tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0

    # ── public ──────────────────────────────────────────────────────────────────────────────────────────────

    def score(
        self,
        prompt_messages: Sequence[list[dict]],
        responses_text: Sequence[str],
        policy_sequences: torch.Tensor | None = None,
        policy_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Reward of each (prompt, response) -> [B] float32 on CPU.

        With the same tokenizer as the policy and ``policy_sequences`` [B, T] (prompt + response ids, responses
        already cut after EOS) with ``policy_attention_mask``, those ids are scored directly; otherwise the text
        is rendered and tokenised with the reward model's own tokenizer (see module docstring).
        """
        if len(prompt_messages) != len(responses_text):
            raise ValueError(f"got {len(prompt_messages)} prompts and {len(responses_text)} responses")
        if self.same_tokenizer and policy_sequences is not None:
            if policy_attention_mask is None:
                raise ValueError(
                    "policy_sequences need policy_attention_mask (padding is found by mask only)"
                )
            if policy_sequences.shape[0] != len(responses_text):
                raise ValueError(
                    f"{policy_sequences.shape[0]} policy sequences for {len(responses_text)} responses"
                )
            rows = self.ids_from_policy(policy_sequences, policy_attention_mask)
        else:
            rows = [
                conversation_ids(
                    self.tokenizer, list(m) + [{"role": "assistant", "content": r}], self.max_length
                )
                for m, r in zip(prompt_messages, responses_text)
            ]
        return self.score_ids(rows)

    def score_texts(self, messages_list: Sequence[list[dict]]) -> torch.Tensor:
        """Reward of full conversations (each ending with the assistant turn to score) -> [B] float32 on CPU."""
        return self.score_ids(
            [conversation_ids(self.tokenizer, list(m), self.max_length) for m in messages_list]
        )

    def ids_from_policy(self, sequences: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """The real (mask 1) ids of each row, left-truncated to the reward model's limit."""
        rows = []
        for ids, mask in zip(sequences.cpu().tolist(), attention_mask.cpu().tolist()):
            row = [i for i, m in zip(ids, mask) if m]
            if self.max_length is not None and len(row) > self.max_length:
                row = row[-self.max_length :]
            rows.append(row)
        return rows

    @torch.no_grad()
    def score_ids(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Score unpadded id lists in right-padded micro-batches of ``batch_size`` -> [B] float32 on CPU."""
        if any(len(r) == 0 for r in rows):
            raise ValueError("cannot score an empty sequence")
        device = self.device or model_device(self.model)
        out: list[torch.Tensor] = []
        with eval_mode(self.model):
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                width = max(len(r) for r in chunk)
                ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, r in enumerate(chunk):
                    ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
                    mask[i, : len(r)] = 1
                scores = sequence_scores(self.model, ids.to(device), mask.to(device))
                out.append(scores.float().cpu())
        return torch.cat(out) if out else torch.zeros(0)
