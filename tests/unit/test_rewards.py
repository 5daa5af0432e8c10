"""Rewards: loading functions by spec, built-in rule rewards (hand values), combining with weights and None, and the
reward-model scorer (ids path == text path; re-tokenisation for a reward model with another tokenizer)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from rlhfkit.errors import RewardError
from rlhfkit.models.heads import sequence_scores
from rlhfkit.models.tiny import CHARS, SPECIAL_TOKENS, TINY_DEFAULTS, tiny_llama_config
from rlhfkit.models.tokenizer import load_tokenizer
from rlhfkit.rewards import (
    CombinedRewards,
    RewardFunctionSpec,
    RewardModelScorer,
    conversation_ids,
    exact_match,
    format_match,
    length_target,
    load_reward_function,
    regex_match,
    rules,
    same_tokenizer,
)
from rlhfkit.rollout import left_pad
from rlhfkit.track import NO_PHASES, PhaseTimer

HERE = Path(__file__).resolve().parent
FNS_FILE = HERE / "reward_fns_for_tests.py"


# ───────────────────────────────────────────── loading ─────────────────────────────────────────────


def test_load_builtin_and_module_forms(monkeypatch):
    assert load_reward_function("exact_match") is rules.exact_match
    assert load_reward_function("rlhfkit.rewards.rules:exact_match") is rules.exact_match
    assert load_reward_function("rlhfkit.rewards.rules:format") is rules.format_match
    assert load_reward_function("format") is rules.format_match
    monkeypatch.syspath_prepend(str(HERE))
    fn = load_reward_function("reward_fns_for_tests:contains_yes")
    assert fn([""], ["oh yes"]) == [1.0]


def test_load_file_form(tmp_path):
    fn = load_reward_function(f"{FNS_FILE}:contains_yes")
    assert fn(["", ""], ["yes", "no"]) == [1.0, 0.0]
    assert load_reward_function(f"{FNS_FILE}:contains_yes") is fn  # loaded once
    (tmp_path / "helper_mod_xyz.py").write_text("BONUS = 2.0\n")
    (tmp_path / "user_rewards.py").write_text(
        "from helper_mod_xyz import BONUS\n\ndef r(prompts, completions, **f):\n    return [BONUS] * len(completions)\n"
    )
    assert load_reward_function(f"{tmp_path / 'user_rewards.py'}:r")([""], ["x"]) == [
        2.0
    ]  # imports neighbours


@pytest.mark.parametrize(
    "spec, reason",
    [
        ("no_such_pkg_xyz.mod:fn", "module 'no_such_pkg_xyz.mod' not found"),
        ("rlhfkit.rewards.no_such_module:fn", "not found"),
        ("rlhfkit.rewards.rules:exact_mach", "has no attribute 'exact_mach'"),
        ("rlhfkit.rewards.rules:RULES", "not a function"),
        (f"{FNS_FILE}:NOT_CALLABLE", "not a function"),
        ("missing/dir/rewards.py:fn", "not found"),
        ("exact_mach", "did you mean 'exact_match'"),
        ("rlhfkit.rewards.rules:", "module:function"),
    ],
)
def test_load_errors_name_the_spec(spec, reason):
    with pytest.raises(RewardError) as info:
        load_reward_function(spec)
    msg = str(info.value)
    assert repr(spec) in msg and reason in msg, msg
    assert info.value.fix


def test_load_errors_inside_user_files(tmp_path):
    (tmp_path / "broken.py").write_text("def r(:\n")
    with pytest.raises(RewardError, match="SyntaxError at .*broken.py:1"):
        load_reward_function(f"{tmp_path / 'broken.py'}:r")
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep_xyz\n")
    with pytest.raises(RewardError, match="importing .* failed .*not_installed_dep_xyz"):
        load_reward_function(f"{tmp_path / 'needs_dep.py'}:r")
    with pytest.raises(RewardError, match="did you mean 'exact_match'"):
        load_reward_function("rlhfkit.rewards.rules:exact_mach")


# ───────────────────────────────────────────── rules ─────────────────────────────────────────────


def test_exact_match():
    completions = [" 42 \n", "42", "Foo", "x"]
    answers = ["42", "41", "foo", None]
    assert exact_match([""] * 4, completions, answer=answers) == [1.0, 0.0, 0.0, None]
    assert exact_match([""] * 4, completions, answer=answers, lowercase=True) == [1.0, 0.0, 1.0, None]
    assert exact_match([""] * 4, completions, answer=answers, normalize=False) == [0.0, 0.0, 0.0, None]
    assert exact_match([""], ["7"], field="gold", gold=[7]) == [1.0]  # other field name, non-str values
    with pytest.raises(RewardError, match="'answer'.*fields: question"):
        exact_match([""], ["7"], question=["q"])


def test_regex_match():
    completions = ["so #### 42\n", "#### 41", "no answer", "The answer: Paris."]
    assert regex_match([""] * 4, completions, answer=["42", "42", "42", "paris"]) == [1.0, 0.0, 0.0, 0.0]
    got = regex_match(
        [""] * 4, completions, answer=["x", "x", "x", "paris"], pattern=r"answer: (\w+)", lowercase=True
    )
    assert got == [0.0, 0.0, 0.0, 1.0]
    assert regex_match([""], ["abc 12"], answer=["12"], pattern=r"\d+") == [1.0]  # no group: whole match
    with pytest.raises(RewardError, match="bad regular expression"):
        regex_match([""], ["x"], answer=["x"], pattern="(")


def test_format_and_length_target():
    completions = [
        "<think>a\nb</think>\n<answer>7</answer>",
        "<answer>7</answer>",
        "  <think></think><answer></answer> ",
    ]
    assert format_match([""] * 3, completions) == [1.0, 0.0, 1.0]
    assert format_match([""] * 2, ["123", "123a"], pattern=r"\d+") == [1.0, 0.0]
    # -|len - target| / target with target 4: "abcd" 0, "ab" -0.5, "abcdefgh" -1, "" -1
    assert length_target([""] * 4, ["abcd", "ab", "abcdefgh", ""], target=4) == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(RewardError, match="target"):
        length_target([""], ["x"])


# ───────────────────────────────────────────── combining ─────────────────────────────────────────────


def test_combined_weights_none_and_metrics():
    combo = CombinedRewards(
        [
            RewardFunctionSpec("exact_match", weight=2.0),
            RewardFunctionSpec(f"{FNS_FILE}:half_none", weight=0.5, name="half"),
            {"fn": "length_target", "weight": 1.0, "kwargs": {"target": 2}},
        ]
    )
    assert combo.names == ["exact_match", "half", "length_target"]
    prompts = ["p0", "p1", "p2", "p3"]
    completions = ["ab", "ab", "abcd", "ab"]
    rows = [{"answer": "ab"}, {"answer": "zz"}, {"answer": None}, {"answer": "ab", "extra": 1}]
    total, per_fn, metrics, valid = combo(prompts, completions, rows)
    # exact: [1, 0, None, 1]; half: [None, 1, None, 1]; length (target 2): [0, 0, -1, 0]
    # total = 2*exact + 0.5*half + length = [2, 0.5, -1, 2.5]
    assert total.dtype == torch.float32
    assert total.tolist() == [2.0, 0.5, -1.0, 2.5]
    assert per_fn["exact_match"][:2].tolist() == [1.0, 0.0] and math.isnan(per_fn["exact_match"][2])
    assert torch.isnan(per_fn["half"]).tolist() == [True, False, True, False]
    assert metrics["rewards/exact_match/mean"] == pytest.approx(2 / 3)
    assert metrics["rewards/half/mean"] == 1.0
    assert metrics["rewards/length_target/mean"] == pytest.approx(-0.25)
    assert metrics["rewards/none_frac"] == 0.0 and metrics["rewards/dropped"] == 0.0
    assert valid.tolist() == [True] * 4


def test_combined_all_none_sample_is_dropped():
    combo = CombinedRewards([f"{FNS_FILE}:half_none", RewardFunctionSpec("exact_match", weight=3.0)])
    total, per_fn, metrics, valid = combo(["a", "b"], ["x", "y"], [{"answer": None}, {"answer": "y"}])
    assert total.tolist() == [0.0, 4.0]  # row 0: no function had a value -> dropped, total 0
    assert valid.tolist() == [False, True]
    assert metrics["rewards/none_frac"] == 0.5 and metrics["rewards/dropped"] == 1.0
    assert "rewards/half_none/mean" in metrics and metrics["rewards/exact_match/mean"] == 1.0


def test_combined_nan_inf_none_samples_dropped_not_propagated():
    # some_bad: [1, nan, inf, None, -inf, 2]; exact_match (weight 2) scores every sample: a NaN / inf from one
    # function drops the sample even when another has a value; a None from one function skips only that function
    combo = CombinedRewards([f"{FNS_FILE}:some_bad", RewardFunctionSpec("exact_match", weight=2.0)])
    out = combo(["p"] * 6, ["a", "a", "a", "a", "a", "b"], [{"answer": "a"}] * 6)
    assert out.valid.tolist() == [True, False, False, True, False, True]
    # totals: 1 + 2 = 3; dropped -> 0; None + 2 = 2; 2 + 2 * 0 = 2
    assert out.total.tolist() == [3.0, 0.0, 0.0, 2.0, 0.0, 2.0]
    assert torch.isfinite(out.total).all()
    assert out.metrics["rewards/dropped"] == 3.0 and out.metrics["rewards/none_frac"] == 0.0
    assert out.metrics["rewards/some_bad/mean"] == 1.5  # over the valid samples with a value: (1 + 2) / 2
    assert out.metrics["rewards/exact_match/mean"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("name", ["returns_none", "returns_nan"])
def test_combined_no_valid_sample_is_one_line_error(name):
    spec = f"{FNS_FILE}:{name}"
    with pytest.raises(RewardError) as info:
        CombinedRewards([spec])(["p"] * 4, ["c"] * 4, [{}] * 4, step=7)
    text = str(info.value)
    assert "\n" not in text and "at step 7" in text and spec in text
    assert ("None x 4" if name == "returns_none" else "nan x 4") in text


def test_combined_function_that_raises_names_function_and_step():
    from rlhfkit.rewards import RewardFunctionError

    spec = f"{FNS_FILE}:raises_on_b"
    combo = CombinedRewards([spec])
    assert combo(["p"], ["a"], [{}]).total.tolist() == [1.0]
    # one sample that raises costs that sample (the call is made again sample by sample), counted
    out = combo(["p", "q", "r"], ["a", "b", "c"], [{}] * 3, step=3)
    assert out.valid.tolist() == [True, False, True] and out.metrics["rewards/raises_on_b/errors"] == 1.0
    with pytest.raises(RewardFunctionError) as info:  # every sample: a bug, one line
        combo(["p", "q"], ["b", "b"], [{}, {}], step=3)
    text = str(info.value)
    assert isinstance(info.value, RewardError)  # a UserError: the CLI prints one line, exit 2
    assert f"reward function {spec} raised ZeroDivisionError: no b allowed at step 3" in text
    assert "\n" not in text


@pytest.mark.parametrize("name, message", [("one_short", "returned 3 values for 4 completions"),
                                           ("returns_text", "returned a str ('good') at index 0"),
                                           ("returns_scalar", "returned a float (1.0), not a list")])
def test_probe_checks_structure_before_weights_load(name, message):
    spec = f"{FNS_FILE}:{name}"
    with pytest.raises(RewardError) as info:
        CombinedRewards([spec]).probe(["p"] * 4, [{}] * 4)
    assert f"function {spec} {message}" in str(info.value) and "placeholder" in str(info.value)


def test_probe_tolerates_exceptions_and_none_on_placeholders():
    # a function may fail or abstain on an empty completion: only the first real rollout judges that
    combo = CombinedRewards([f"{FNS_FILE}:raises_on_b", f"{FNS_FILE}:returns_none", "exact_match"])
    combo.probe(["p", "q"], [{"answer": "x"}, {"answer": "y"}], completions=["a", "b"])
    combo.probe(["p"], [{"answer": "x"}])


def test_combined_fields_kwargs_and_duplicates():
    # a function without **fields gets only the columns it names; config kwargs win over same-named columns
    @dataclass
    class Cfg:  # duck-typed like rlhfkit.config.RewardFunction
        fn: str
        weight: float = 1.0
        name: str | None = None
        kwargs: dict = field(default_factory=dict)

    combo = CombinedRewards(
        [
            Cfg(f"{FNS_FILE}:only_answer"),
            Cfg(f"{FNS_FILE}:echo_pattern", kwargs={"pattern": "from-config"}),
            Cfg(f"{FNS_FILE}:echo_pattern"),
        ]
    )
    assert combo.names == ["only_answer", "echo_pattern", "echo_pattern_2"]
    rows = [{"answer": "abc", "pattern": "from-data", "other": 0}]
    per_fn = combo(["p"], ["c"], rows).per_function
    assert per_fn["only_answer"].tolist() == [3.0]
    assert per_fn["echo_pattern"].tolist() == [1.0]  # kwargs pattern, not the column
    assert per_fn["echo_pattern_2"].tolist() == [0.0]  # no kwargs: the column is passed
    with pytest.raises(RewardError, match="two reward functions are named 'x'"):
        CombinedRewards([RewardFunctionSpec("exact_match", name="x"), RewardFunctionSpec("format", name="x")])
    with pytest.raises(RewardError, match="cannot load reward function 'nope_xyz:fn'"):
        CombinedRewards(["nope_xyz:fn"])


@pytest.mark.parametrize(
    "name, message",
    [
        ("one_short", "returned 3 values for 4 completions"),
        ("returns_text", "returned a str ('good') at index 0"),
        ("returns_scalar", "returned a float (1.0), not a list"),
    ],
)
def test_combined_validates_returns(name, message):
    spec = f"{FNS_FILE}:{name}"
    combo = CombinedRewards([spec])
    with pytest.raises(RewardError) as info:
        combo(["p"] * 4, ["c"] * 4, [{}] * 4, step=2)
    assert f"function {spec} {message} at step 2" in str(info.value)


# ───────────────────────────────────────────── reward model ─────────────────────────────────────────────


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def permuted_tok(tmp_path_factory):
    """The tiny tokenizer with its characters in another order (same specials, same chat template)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = list(CHARS)
    random.Random(0).shuffle(chars)
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=TINY_DEFAULTS["context"],
        clean_up_tokenization_spaces=False,
    )
    out = tmp_path_factory.mktemp("permuted-tok")
    fast.save_pretrained(out)
    return load_tokenizer(str(out))


def random_rm(tok, seed=0):
    torch.manual_seed(seed)
    cfg = tiny_llama_config("tiny:hidden=32,layers=1,heads=2,kv_heads=2,intermediate=32", tok)
    cfg.num_labels = 1
    cfg.initializer_range = 0.3
    return AutoModelForSequenceClassification.from_config(cfg)


def counting_rm(tok, char="a"):
    """A reward model whose score grows with the fraction of ``char`` tokens in the text: every token embeds to
    e0 (``char`` to e0 + e1), attention is uniform (q = k = 0), its value reads e1 and writes 4 * fraction to e2,
    and the score head reads e2 at the last token."""
    model = random_rm(tok)
    base = model.model
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        norms = [m for layer in base.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
        for norm in [base.norm] + norms:
            norm.weight.fill_(1.0)
        base.embed_tokens.weight[:, 0] = 1.0
        base.embed_tokens.weight[tok.convert_tokens_to_ids(char), 1] = 1.0
        attn = base.layers[0].self_attn
        attn.v_proj.weight[0, 1] = 1.0
        attn.o_proj.weight[2, 0] = 1.0
        model.score.weight[0, 2] = 1.0
    return model


def msgs(text):
    return [{"role": "user", "content": text}]


def test_same_tokenizer(tok, permuted_tok):
    assert same_tokenizer(tok, tok)
    assert same_tokenizer(tok, load_tokenizer("tiny"))
    assert not same_tokenizer(tok, permuted_tok)
    assert not same_tokenizer(tok, None)
    other = load_tokenizer("tiny")
    other.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert not same_tokenizer(tok, other)


def test_conversation_ids_end_at_end_of_turn(tok):
    full = msgs("hi") + [{"role": "assistant", "content": "yo"}]
    ids = conversation_ids(tok, full)
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>"
    assert conversation_ids(tok, full, max_length=5) == ids[-5:]  # left-truncated: the end is kept


def policy_batch(tok, prompts, responses):
    """(sequences, attention_mask) like a Rollout's: left-padded chat prompts + responses ending with EOS,
    right-padded with a junk id (masked) to check that only the mask decides."""
    prompt_ids = [
        tok.apply_chat_template(msgs(p), add_generation_prompt=True, tokenize=False) for p in prompts
    ]
    prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in prompt_ids]
    p_ids, p_mask = left_pad(prompt_ids, tok.pad_token_id)
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    width = max(len(r) for r in resp) + 2
    r_ids = torch.full((len(resp), width), 50, dtype=torch.long)
    r_mask = torch.zeros((len(resp), width), dtype=torch.long)
    for i, r in enumerate(resp):
        r_ids[i, : len(r)] = torch.tensor(r)
        r_mask[i, : len(r)] = 1
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)


def test_same_tokenizer_ids_path_equals_text_path(tok):
    rm = random_rm(tok)
    prompts, responses = ["hello there", "x", "what is 2+2?"], ["hi!", "a much longer answer", "4"]
    seqs, mask = policy_batch(tok, prompts, responses)
    scorer = RewardModelScorer(rm, tok, tok, batch_size=2)
    assert scorer.same_tokenizer
    from_ids = scorer.score([msgs(p) for p in prompts], ["ignored"] * 3, seqs, mask)  # ids path: texts unused
    from_text = scorer.score([msgs(p) for p in prompts], responses)
    full = [msgs(p) + [{"role": "assistant", "content": r}] for p, r in zip(prompts, responses)]
    assert from_ids.shape == (3,) and from_ids.dtype == torch.float32
    torch.testing.assert_close(from_ids, from_text, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scorer.score_texts(full), from_text, atol=1e-5, rtol=1e-5)
    assert len(set(from_text.tolist())) == 3
    rm.train()
    scorer.score([msgs(p) for p in prompts], responses)
    assert rm.training  # scored in eval mode, flags restored


def test_retokenises_for_a_reward_model_with_another_tokenizer(tok, permuted_tok):
    rm = counting_rm(permuted_tok, "a")
    scorer = RewardModelScorer(rm, permuted_tok, tok, batch_size=2)
    assert not scorer.same_tokenizer
    prompts, responses = ["say it", "say it", "say it"], ["aaaa", "abab", "bbbb"]
    seqs, mask = policy_batch(tok, prompts, responses)
    scores = scorer.score([msgs(p) for p in prompts], responses, seqs, mask)  # policy ids must be ignored
    # the reward of the TEXT: more "a" -> higher
    assert scores[0] > scores[1] > scores[2], scores
    # identical to scoring the reward-tokenised text by hand, one conversation at a time
    for p, r, s in zip(prompts, responses, scores):
        text = permuted_tok.apply_chat_template(
            msgs(p) + [{"role": "assistant", "content": r}], tokenize=False
        )
        assert text.endswith("<|im_end|>\n")
        ids = permuted_tok(text[: -len("\n")], add_special_tokens=False)["input_ids"]
        direct = sequence_scores(rm, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        torch.testing.assert_close(s, direct[0], atol=1e-5, rtol=1e-5)
    # feeding the policy's ids to this reward model reads other characters: a different (wrong) reward
    naive = sequence_scores(rm, seqs, mask)
    assert tok.convert_tokens_to_ids("a") != permuted_tok.convert_tokens_to_ids("a")
    assert not torch.allclose(naive, scores, atol=1e-3)


def test_scorer_truncates_from_the_left(tok):
    rm = random_rm(tok)
    scorer = RewardModelScorer(rm, tok, tok, max_length=12)
    long_prompt = "z" * 100
    full = msgs(long_prompt) + [{"role": "assistant", "content": "ok"}]
    ids = conversation_ids(tok, full)[-12:]
    direct = sequence_scores(rm, torch.tensor([ids]), torch.ones(1, 12, dtype=torch.long))
    torch.testing.assert_close(scorer.score([msgs(long_prompt)], ["ok"]), direct, atol=1e-5, rtol=1e-5)
    assert RewardModelScorer(rm, tok, tok).max_length == TINY_DEFAULTS["context"]


# ───────────────────────────────────────────── the online loop drops invalid samples ─────────────────────────────


def test_online_score_drops_samples_without_finite_reward(tok):
    # step 3 of the online loop on a stub trainer: some_bad gives [1, nan, inf, None, -inf, 2] and exact_match
    # (answer "a") [1, 1, 1, 1, 1, 0] -> valid [T, F, F, T, F, T], raw totals [2, 0, 0, 1, 0, 2]. Dropped samples
    # get score 0 and an empty mask; the running normaliser sees only the 3 valid ones
    from types import MethodType, SimpleNamespace

    from rlhfkit.algos import RunningMoments
    from rlhfkit.config import build_config
    from rlhfkit.train.online.experience import Experience
    from rlhfkit.train.online.learner import Learner
    from rlhfkit.train.online.producer import Producer

    cfg = build_config("ppo", {}, ["reward.missing_eos_penalty=0", "reward.clip=null"])
    trainer = SimpleNamespace(tok=tok, scorer=None, phases=NO_PHASES, timer=PhaseTimer(), device=torch.device("cpu"),
                              cfg=cfg, max_steps=10,
                              moments=RunningMoments(), acc=SimpleNamespace(gather=lambda x: x),
                              functions=CombinedRewards([f"{FNS_FILE}:some_bad", "exact_match"]))
    trainer.shape_scores = MethodType(Learner.shape_scores, trainer)
    ids = [tok("a", add_special_tokens=False).input_ids[0], tok("b", add_special_tokens=False).input_ids[0]]
    response_ids = torch.tensor([[ids[0]]] * 5 + [[ids[1]]])
    rollout = SimpleNamespace(response_ids=response_ids, response_mask=torch.ones(6, 1, dtype=torch.bool),
                              ended=torch.ones(6, dtype=torch.bool), sequences=response_ids,
                              attention_mask=torch.ones(6, 1, dtype=torch.long),
                              lengths=torch.ones(6, dtype=torch.long))
    rows = [{"prompt": [{"role": "user", "content": "say a"}], "answer": "a"}] * 6
    exp = Experience(rollout=rollout, rows=rows, position_ids=None, action=torch.ones(6, 1))
    Producer.score(trainer, exp, step=1, allow_all_dropped=False)  # steps 3 and 3b: the producer's, the learner's
    exp.scores = trainer.shape_scores(exp.raw_scores, rollout.ended, rollout.lengths, exp.valid)
    assert exp.texts == ["a"] * 5 + ["b"]
    assert exp.raw_scores.tolist() == [2.0, 0.0, 0.0, 1.0, 0.0, 2.0]
    assert exp.mask.squeeze(-1).tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert exp.reward_metrics["rewards/dropped"] == 3.0
    # normalised over the valid [2, 1, 2]: mean 5/3, population var 2/9
    assert trainer.moments.count == 3 and trainer.moments.mean == pytest.approx(5 / 3)
    want = [(x - 5 / 3) / math.sqrt(2 / 9) if v else 0.0 for x, v in zip([2, 0, 0, 1, 0, 2], [1, 0, 0, 1, 0, 1])]
    assert exp.scores.tolist() == pytest.approx(want, rel=1e-5)


def test_kwargs_checked_against_the_signature_at_construction():
    # only_answer(prompts, completions, answer): "answr" is no parameter of it -> one line with a did-you-mean;
    # functions taking **fields (the built-in rules) accept any name
    with pytest.raises(RewardError, match="has no parameter 'answr'.*did you mean 'answer'"):
        CombinedRewards([{"fn": f"{FNS_FILE}:only_answer", "kwargs": {"answr": "x"}}])
    CombinedRewards([{"fn": f"{FNS_FILE}:only_answer", "kwargs": {"answer": ["x"]}}])
    CombinedRewards([{"fn": "length_target", "kwargs": {"target": 3, "anything": 1}}])


def test_probe_passes_on_a_rule_complaint():
    # length_target without its target raises RewardError itself: the probe answers it before weights load
    with pytest.raises(RewardError, match="target"):
        CombinedRewards(["length_target"]).probe(["p"], [{}])


def test_online_score_drops_nonfinite_reward_model_scores(tok):
    # a reward model that scores [1, nan, inf, 3]: samples 1 and 2 are dropped, the model's mean is over the rest
    from types import MethodType, SimpleNamespace

    from rlhfkit.algos import RunningMoments
    from rlhfkit.config import build_config
    from rlhfkit.train.online.experience import Experience
    from rlhfkit.train.online.learner import Learner
    from rlhfkit.train.online.producer import Producer

    cfg = build_config("grpo", {}, ["reward.missing_eos_penalty=0"])
    scorer = SimpleNamespace(model=None, score=lambda *a: torch.tensor([1.0, math.nan, math.inf, 3.0]))
    trainer = SimpleNamespace(tok=tok, scorer=scorer, phases=NO_PHASES, timer=PhaseTimer(), functions=None,
                              device=torch.device("cpu"),
                              cfg=cfg, moments=RunningMoments(), acc=SimpleNamespace(gather=lambda x: x))
    trainer.shape_scores = MethodType(Learner.shape_scores, trainer)
    ids = torch.tensor([[tok("a", add_special_tokens=False).input_ids[0]]] * 4)
    rollout = SimpleNamespace(response_ids=ids, response_mask=torch.ones(4, 1, dtype=torch.bool),
                              ended=torch.ones(4, dtype=torch.bool), sequences=ids,
                              attention_mask=torch.ones(4, 1, dtype=torch.long),
                              lengths=torch.ones(4, dtype=torch.long))
    exp = Experience(rollout=rollout, rows=[{"prompt": [{"role": "user", "content": "x"}]}] * 4, position_ids=None,
                     action=torch.ones(4, 1))
    Producer.score(trainer, exp, step=1, allow_all_dropped=False)  # steps 3 and 3b: the producer's, the learner's
    exp.scores = trainer.shape_scores(exp.raw_scores, rollout.ended, rollout.lengths, exp.valid)
    assert exp.raw_scores.tolist() == [1.0, 0.0, 0.0, 3.0] and exp.scores.tolist() == [1.0, 0.0, 0.0, 3.0]
    assert exp.mask.squeeze(-1).tolist() == [1.0, 0.0, 0.0, 1.0]
    assert exp.reward_metrics["rewards/dropped"] == 2.0 and exp.reward_metrics["rewards/model/mean"] == 2.0


def test_bools_count_as_numbers_and_signature_is_checked_at_construction():
    # [c == "a" for c in completions] is a common reward: True / False are 1.0 / 0.0
    assert CombinedRewards([f"{FNS_FILE}:returns_bool"])(["p"] * 2, ["a", "b"], [{}] * 2).total.tolist() == [1.0, 1.0]
    with pytest.raises(RewardError, match=r"takes \(texts\), not \(prompts, completions, \*\*fields\)"):
        CombinedRewards([f"{FNS_FILE}:one_unnamed"])
    # a function of completions alone is TRL's convention (rewards/trl_style.py): called with completions only
    assert CombinedRewards([f"{FNS_FILE}:one_argument"])(["p"] * 2, ["a", "b"], [{}] * 2).valid.all()
