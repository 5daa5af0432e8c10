"""Chat-template rendering and assistant masks, on the tiny tokenizer's ChatML template and on other templates."""

import pytest

from rlhfkit.data import render_completion_ids, render_conversation, render_prompt_ids
from rlhfkit.models.tokenizer import load_tokenizer

SYS = {"role": "system", "content": "be nice"}
Q1 = {"role": "user", "content": "question1"}
A1 = {"role": "assistant", "content": "answer1"}
Q2 = {"role": "user", "content": "question2"}
A2 = {"role": "assistant", "content": "answer2"}

# Llama-2 style: BOS written by the template, no generation prompt, " content" + EOS for the assistant.
LLAMA_STYLE = (
    "{{ '<unk>' }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
# A template with no end-of-turn marker at all: rlhfkit appends EOS after the final assistant turn.
PLAIN = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def with_template(template):
    t = load_tokenizer("tiny")
    t.chat_template = template
    return t


def trained_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_single_turn_mask(tok):
    ids, mask = render_conversation(tok, [Q1, A1])
    assert tok.decode(ids) == "<|im_start|>user\nquestion1<|im_end|>\n<|im_start|>assistant\nanswer1<|im_end|>\n"
    assert trained_text(tok, ids, mask) == "answer1<|im_end|>"
    assert mask[-1] == 0  # the newline after <|im_end|> is layout, not trained
    assert ids[mask.index(1) + len("answer1")] == tok.eos_token_id


def test_multi_turn_mask(tok):
    ids, mask = render_conversation(tok, [SYS, Q1, A1, Q2, A2])
    assert trained_text(tok, ids, mask) == "answer1<|im_end|>answer2<|im_end|>"
    # exactly two contiguous trained runs
    runs = sum(1 for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1]))
    assert runs == 2


def test_prompt_ids_match_conversation_prefix(tok):
    prompt = render_prompt_ids(tok, [SYS, Q1])
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    ids, mask = render_conversation(tok, [SYS, Q1, A1])
    assert ids[: len(prompt)] == prompt and mask.index(1) == len(prompt)
    no_gen = render_prompt_ids(tok, [SYS, Q1], add_generation_prompt=False)
    assert tok.decode(no_gen).endswith("question1<|im_end|>\n")


def test_completion_ids_consistent_with_conversation(tok):
    p, c = render_completion_ids(tok, [Q1, A1, Q2], [A2])
    ids, mask = render_conversation(tok, [Q1, A1, Q2, A2])
    assert p + c == ids[: len(p) + len(c)]
    assert tok.decode(c) == "answer2<|im_end|>"
    assert p == render_prompt_ids(tok, [Q1, A1, Q2])


def test_llama_style_template_with_bos():
    t = with_template(LLAMA_STYLE)
    ids, mask = render_conversation(t, [SYS, Q1, A1, Q2, A2])
    assert t.decode(ids).startswith("<unk><<SYS>>")
    assert t.decode(ids).count("<unk>") == 1  # BOS written once by the template, not added again
    # no generation prompt: the model itself produces the space before its answer
    assert trained_text(t, ids, mask) == " answer1<|im_end|> answer2<|im_end|>"
    p, c = render_completion_ids(t, [Q1], [A1])
    assert t.decode(p) == "<unk>[INST] question1 [/INST]" and t.decode(c) == " answer1<|im_end|>"


def test_template_without_end_marker_gets_eos():
    t = with_template(PLAIN)
    ids, mask = render_conversation(t, [Q1, A1])
    assert trained_text(t, ids, mask) == "answer1<|im_end|>"
    assert t.decode(ids) == "user: question1\nassistant: answer1<|im_end|>\n"


def test_gemma_like_template_with_role_renaming():
    t = with_template(
        "{% for m in messages %}<|im_start|>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        "{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>model\n{% endif %}"
    )
    ids, mask = render_conversation(t, [Q1, A1, Q2, A2])
    assert trained_text(t, ids, mask) == "answer1<|im_end|>answer2<|im_end|>"


def test_plain_strings_raw_as_trl_tokenises_them():
    # TRL 1.16, standard format: tok(prompt) and tok(prompt + completion + eos), no chat template; the view leaves the
    # tokenizer's own template alone (the model is saved with it)
    from rlhfkit.data.chat import plain_view

    tok = load_tokenizer("tiny")
    view = plain_view(tok)
    prompt, answer = "The sky is", " blue."
    p_ids = render_prompt_ids(view, [{"role": "user", "content": prompt}])
    assert p_ids == tok(prompt)["input_ids"]
    full = tok(prompt + answer + tok.eos_token)["input_ids"]
    got_p, got_c = render_completion_ids(view, [{"role": "user", "content": prompt}],
                                         [{"role": "assistant", "content": answer}])
    assert got_p + got_c == full and got_c[-1] == tok.eos_token_id
    ids, mask = render_conversation(view, [{"role": "user", "content": prompt},
                                           {"role": "assistant", "content": answer}])
    assert ids == full and sum(mask) == len(got_c)  # the completion (and its EOS) trained, the prompt not
    templated = render_prompt_ids(tok, [{"role": "user", "content": prompt}])
    assert templated != p_ids and tok.chat_template and view.chat_template != tok.chat_template
