"""Rendering conversations with the tokenizer's chat template, and finding the assistant's tokens in them.

The assistant mask is computed for **any** chat template, without knowing its markup:

1. render the whole conversation as text (``apply_chat_template(..., tokenize=False)``) and tokenise it once
   with ``add_special_tokens=False`` (the template writes any BOS itself; adding one would double it);
2. for the *i*-th message, if it is an assistant turn, render ``messages[:i]`` with the generation prompt: the
   text up to there is everything the model is given before it starts answering, so the answer starts at its
   length; render ``messages[:i+1]`` without it: the answer (content + end-of-turn marker) ends where that text
   ends, less trailing whitespace (the ``"\\n"`` after ``<|im_end|>`` is layout, not something to predict);
3. map these character spans to tokens with the tokenizer's offsets (or, for a tokenizer without offsets, by
   tokenising the text prefixes).

When a template renders a prefix differently from the full conversation (some reasoning templates do), the
answer is found by searching its content after the previous turn. If the token right after an answer is an
end-of-turn token the span missed, it is included; if the conversation ends with an assistant turn whose span
holds no end-of-turn token at all (a template with no end marker), EOS is appended, so the model learns to stop.

``assistant_mask`` is 1 exactly on the tokens of each assistant turn's content and its end-of-turn token; 0 on
system / user turns, role headers and separators.
"""

from __future__ import annotations

from ..errors import DataError, ModelError
from .formats import message_text
from .media import Media, expand, require_processor

# end-of-turn markers of common templates; only those the tokenizer knows are used (besides its EOS)
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>", "<|endoftext|>", "<|eot|>")


def render_chat(tok, messages: list[dict], add_generation_prompt: bool) -> str:
    """The chat template applied to one conversation, as text (``tokenize=False``)."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    if isinstance(text, (list, tuple)) and len(text) == 1 and isinstance(text[0], str):
        text = text[0]  # some versions return a list for batched input
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


_render = render_chat


PROBE = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
TEMPLATE_FIX = "fix the template, or set model.chat_template to a file (or Jinja text) that renders"


def template_failure(exc: Exception, raised: bool = True) -> str | None:
    """What went wrong inside a Jinja chat template, in words, or None when ``exc`` is not a template error:
    a syntax error (with its template line), an operation the sandbox refuses, an undefined variable, or an
    exception the template raised itself (``raise_exception``; None for that one unless ``raised``)."""
    try:
        from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
    except ImportError:  # pragma: no cover - transformers depends on jinja2
        return None
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    if isinstance(exc, TemplateSyntaxError):
        return f"syntax error at template line {exc.lineno}: {text}"
    if isinstance(exc, SecurityError):
        return f"the Jinja sandbox refused an unsafe operation: {text}"
    if isinstance(exc, UndefinedError):
        return f"undefined variable: {text}"
    if isinstance(exc, TemplateError) and raised:
        return f"the template raised an error: {text}"
    return None


def check_chat_template(tok, origin: str) -> None:
    """Render a two-turn conversation (user, assistant; then the user turn with the generation prompt) before any
    data line is read: a template that fails on it is broken, and the error names the template (``origin``: its
    file, or the key that set it) and what failed, never a data line. Remembers ``origin`` on ``tok`` for the
    per-record errors of :func:`_render_or_raise`."""
    tok.rlhfkit_template_origin = origin
    for messages, gen in ((PROBE, False), (PROBE[:1], True)):
        try:
            _render(tok, messages, gen)
        except Exception as exc:
            failure = template_failure(exc) or f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            raise ModelError(f"the chat template does not render a plain user / assistant conversation: {failure}",
                             where=origin, fix=TEMPLATE_FIX) from None


def _try_render(tok, messages: list[dict], add_generation_prompt: bool) -> str | None:
    try:
        return _render(tok, messages, add_generation_prompt)
    except Exception:  # a template may reject a prefix (e.g. an empty conversation)
        return None


def _render_or_raise(tok, messages: list[dict], add_generation_prompt: bool, where: str) -> str:
    try:
        return _render(tok, messages, add_generation_prompt)
    except Exception as exc:
        failure = template_failure(exc, raised=False)  # a template's own raise_exception is about the record
        origin = getattr(tok, "rlhfkit_template_origin", None)
        if failure and origin:  # the template's fault, not the
            raise ModelError(f"the chat template failed ({failure}) on the record at {where}", where=origin,
                             fix=TEMPLATE_FIX) from None  # record's: its syntax, sandbox or an undefined name
        raise DataError(
            f"the chat template rejected the conversation: {str(exc).splitlines()[0] if str(exc) else exc!r}",
            where=where, fix="check the message roles against what the model's chat template supports "
                             "(some templates allow no system turn or need strict user/assistant alternation)",
        ) from None


def end_of_turn_ids(tok) -> set[int]:
    """Token ids that end an assistant turn: the tokenizer's EOS and the known end-of-turn markers it has."""
    vocab = tok.get_vocab()
    ids = {vocab[t] for t in _END_OF_TURN if t in vocab}
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


def _encode(tok, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError, KeyError):  # tokenizers without offsets
        return list(tok(text, add_special_tokens=False)["input_ids"]), None


def _char_spans(tok, messages: list[dict], full: str, where: str) -> list[tuple[int, int, int]]:
    """``[(message_index, char_start, char_end), ...]`` of every assistant turn in ``full``."""
    spans = []
    prev_end = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        content = message_text(m["content"])
        before = _try_render(tok, messages[:i], True) if i > 0 else _try_render(tok, [], True)
        if before is not None and full.startswith(before) and len(before) >= prev_end:
            start = len(before)
        else:  # the template renders this prefix differently: find the content itself
            start = full.find(content, prev_end)
            if start < 0 and content.strip():
                start = full.find(content.strip(), prev_end)
            if start < 0:
                raise DataError(
                    f"cannot find assistant turn {i} in the rendered conversation", where=where,
                    fix="use a chat template that renders message content verbatim",
                )
        through = _try_render(tok, messages[: i + 1], False)
        if through is not None and full.startswith(through) and len(through.rstrip()) > start:
            end = len(through.rstrip())
        else:
            pos = full.find(content, start)
            end = pos + len(content) if pos >= 0 else start + len(content.strip())
        spans.append((i, start, end))
        prev_end = end
    return spans


def _token_range(offsets, ids, tok, full: str, start: int, end: int) -> tuple[int, int]:
    """Tokens ``[a, b)`` whose first character lies in ``[start, end)``."""
    if offsets is not None:
        a = next((k for k, (s, _) in enumerate(offsets) if s >= start), len(ids))
        b = next((k for k, (s, _) in enumerate(offsets) if s >= end), len(ids))
        return a, max(a, b)
    a = len(tok(full[:start], add_special_tokens=False)["input_ids"])
    b = len(tok(full[:end], add_special_tokens=False)["input_ids"])
    return a, max(a, b)


def _conversation(tok, messages: list[dict], where: str, images: list | None = None
                  ) -> tuple[list[int], list[tuple[int, int, int]], Media | None]:
    """``(input_ids, [(message_index, token_start, token_end), ...], media)`` for the assistant turns; with
    ``images``, the ids are the processor's (each image's tokens in place of its placeholder) and ``media`` their
    :class:`~.media.Media` (None without images)."""
    if images:
        require_processor(tok, images, where)
    full = _render_or_raise(tok, messages, False, where)
    media = None
    if images:
        ids, offsets, media = expand(tok, full, images, where)
    else:
        ids, offsets = _encode(tok, full)
    ends = end_of_turn_ids(tok)
    turns = []
    for i, start, end in _char_spans(tok, messages, full, where):
        a, b = _token_range(offsets, ids, tok, full, start, end)
        if b < len(ids) and (b == a or ids[b - 1] not in ends) and ids[b] in ends:
            b += 1  # the template put the end-of-turn token outside the span we measured
        turns.append((i, a, b))
    if turns and messages[-1]["role"] == "assistant" and turns[-1][0] == len(messages) - 1:
        i, a, b = turns[-1]
        if tok.eos_token_id is not None and not any(t in ends for t in ids[a:b]):
            ids = ids[:b] + [int(tok.eos_token_id)] + ids[b:]  # the template has no end marker: teach EOS
            turns[-1] = (i, a, b + 1)
    return ids, turns, media


# ---------------------------------------------------------------------------------------------------------------
# public


def plain_view(tok):
    """A view of ``tok`` whose chat template writes each message's content as it is, an assistant turn followed by
    EOS, and the BOS first when the tokenizer adds one to plain text: TRL's handling of standard-format (plain
    string) data, ``tok(prompt)`` and ``tok(prompt + completion + eos)``, through the same rendering every recipe
    uses (assistant masks, prompt / completion split). The tokenizer itself is untouched (the model's saved
    tokenizer keeps its own template)."""
    import copy
    import json

    view = copy.copy(tok)
    ids = tok("a")["input_ids"]
    bos = tok.bos_token if tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id] else ""
    eos = tok.eos_token or ""
    view.chat_template = (f"{{{{ {json.dumps(bos)} }}}}{{% for m in messages %}}{{{{ m['content'] }}}}"
                          f"{{% if m['role'] == 'assistant' %}}{{{{ {json.dumps(eos)} }}}}{{% endif %}}{{% endfor %}}")
    view.rlhfkit_template_origin = "data.plain_text=raw"
    return view


def render_prompt_ids(tok, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template (with the assistant header when asked): the one
    way prompts are rendered for training, generation, evaluation and reward models. The text is tokenised with
    ``add_special_tokens=False`` (the template writes every special token itself, so no BOS is doubled)."""
    text = _render_or_raise(tok, messages, add_generation_prompt, "prompt")
    return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]


def render_prompt_media(tok, messages: list[dict], images: list | None, *, where: str = "prompt",
                        add_generation_prompt: bool = True) -> tuple[list[int], Media | None]:
    """``(ids, media)`` of a prompt with its images: :func:`render_prompt_ids` rendered the same way, the images
    expanded by the processor (:func:`~.media.expand`); ``media`` None without images."""
    if not images:
        return render_prompt_ids(tok, messages, add_generation_prompt), None
    require_processor(tok, images, where)
    text = _render_or_raise(tok, messages, add_generation_prompt, where)
    ids, _, media = expand(tok, text, images, where)
    return ids, media


def encode_chat_prompts(tok, messages_list) -> list[list[int]]:
    """Prompt ids for generation: each conversation rendered with the generation prompt."""
    return [render_prompt_ids(tok, m, add_generation_prompt=True) for m in messages_list]


def stop_token_ids(tok, generation_config=None) -> list[int]:
    """What ends a reply — the one definition used by generation, masks and rewards: the tokenizer's EOS, the
    model's generation-config EOS ids, and ``<|im_end|>`` when the tokenizer has it."""
    ids: list[int] = []
    if tok.eos_token_id is not None:
        ids.append(int(tok.eos_token_id))
    gen_eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if isinstance(gen_eos, int):
        ids.append(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        ids.extend(int(i) for i in gen_eos)
    im_end = tok.get_vocab().get("<|im_end|>")
    if im_end is not None:
        ids.append(int(im_end))
    return sorted(set(ids))


def render_conversation(tok, messages: list[dict], *, where: str = "conversation") -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of a whole conversation; the mask is 1 on assistant content + end token."""
    ids, mask, _ = render_conversation_media(tok, messages, None, where=where)
    return ids, mask


def render_conversation_media(tok, messages: list[dict], images: list | None, *, where: str = "conversation"
                              ) -> tuple[list[int], list[int], Media | None]:
    """:func:`render_conversation` of a conversation with its images: ``(ids, assistant_mask, media)`` (the image
    tokens, in user turns, are never in the mask)."""
    ids, turns, media = _conversation(tok, messages, where, images)
    mask = [0] * len(ids)
    for _, a, b in turns:
        mask[a:b] = [1] * (b - a)
    return ids, mask, media


def render_completion_ids(
    tok, prompt_messages: list[dict], completion_messages: list[dict], *, where: str = "conversation"
) -> tuple[list[int], list[int]]:
    """``(prompt_ids, completion_ids)`` for a prompt and its assistant reply (DPO / KTO / reward models).

    Both come from one rendering of the whole conversation, so ``prompt_ids + completion_ids`` is exactly its
    token prefix (the same tokens :func:`render_conversation` gives): ``prompt_ids`` ends with the assistant
    header, ``completion_ids`` is the reply through its end-of-turn token (without the trailing newline). With
    several completion turns, everything from the first one's start to the last one's end is the completion.
    """
    prompt, completion, _ = render_completion_media(tok, prompt_messages, completion_messages, None, where=where)
    return prompt, completion


def render_completion_media(tok, prompt_messages: list[dict], completion_messages: list[dict], images: list | None,
                            *, where: str = "conversation") -> tuple[list[int], list[int], Media | None]:
    """:func:`render_completion_ids` with the prompt's images: ``(prompt_ids, completion_ids, media)``."""
    messages = list(prompt_messages) + list(completion_messages)
    ids, turns, media = _conversation(tok, messages, where, images)
    mine = [(a, b) for i, a, b in turns if i >= len(prompt_messages)]
    if not mine:
        raise DataError("the completion has no assistant turn", where=where,
                        fix="give the assistant's reply as the completion")
    return ids[: mine[0][0]], ids[mine[0][0]: mine[-1][1]], media
