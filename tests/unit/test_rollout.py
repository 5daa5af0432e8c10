"""Rollout engines: responses end at the first EOS / stop string, masks and padding after it, reproducibility,
batch invariance of left padding, and the model's training flags restored -- the same assertions for ``hf`` (the
reference), ``static`` (uncompiled here; tests/unit/test_rollout_static.py compares the two token for token) and
``continuous`` (tests/unit/test_rollout_continuous.py).

Most tests use a *rigged* tiny Llama: one-hot embeddings, the decoder layer's outputs zeroed, and an untied LM head
holding a transition table, so the greedy next token depends only on the current token ("a" -> "b" -> "c" -> EOS).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from rlhfkit.errors import ConfigError
from rlhfkit.models.tiny import tiny_llama_config
from rlhfkit.models.tokenizer import load_tokenizer
from rlhfkit.rollout import (
    ENGINES,
    Engine,
    HFEngine,
    Rollout,
    SamplingParams,
    build_engine,
    check_engine,
    decode_responses,
    encode_chat_prompts,
    finalize_responses,
    generate_text,
    strip_parallel_wrappers,
)

EOS, PAD, UNK = 2, 0, 3
ENGINE_KW = {"hf": {}, "static": {"compile": False, "sync_every": 2}, "continuous": {"sync_every": 2}}


@pytest.fixture(params=["hf", "static", "continuous"])
def engine_name(request):
    return request.param


def make(name: str, tok=None, *, eos=(EOS,), pad=PAD, stop=(), batch_size=None) -> Engine:
    return ENGINES[name](tok, eos_token_ids=list(eos), pad_token_id=pad, stop_strings=stop, batch_size=batch_size,
                         **ENGINE_KW[name])


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def rigged_model(tok, chain: dict[str, str], *, scale: float = 10.0, noise: float = 0.0, seed: int = 0):
    """A Llama whose next token is ``chain[current token]`` (token strings; "EOS" / "UNK" for ids 2 / 3);
    tokens not in ``chain`` go to "z". ``noise`` adds random logits (for sampling tests)."""
    torch.manual_seed(seed)
    cfg = tiny_llama_config("tiny:hidden=128,layers=1,heads=4,kv_heads=4,intermediate=16,context=128", tok)
    cfg.tie_word_embeddings = False
    model = LlamaForCausalLM(cfg)
    vocab = tok.get_vocab()
    name = {"EOS": EOS, "UNK": UNK}
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(len(tok), cfg.hidden_size))  # one-hot
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(len(tok), cfg.hidden_size)
        for i in range(len(tok)):
            head[vocab["z"], i] = scale
        for src, dst in chain.items():
            s, d = name.get(src, vocab.get(src)), name.get(dst, vocab.get(dst))
            head[:, s] = 0.0
            head[d, s] = scale
        head += noise * torch.randn_like(head)
        model.lm_head.weight.copy_(head)
    return model


CHAIN = {
    "a": "b", "b": "c", "c": "EOS",  # "...a" -> "bc<EOS>"
    "p": "q", "q": "r", "r": "s", "s": "t", "t": "EOS",  # "...p" -> "qrst<EOS>"
    "x": "y", "y": "x",  # "...x" -> "yxyx..." never ends
    "m": "n", "n": "UNK",  # "...m" -> "n<unk>": ends only when <unk> (3) is an EOS id
}  # fmt: skip


@pytest.fixture(scope="module")
def chain_model(tok):
    return rigged_model(tok, CHAIN)


def greedy(model, prompts, name="hf", *, tok=None, eos=(EOS,), pad=PAD, stop=(), batch_size=None, **params):
    params.setdefault("max_new_tokens", 8)
    engine = make(name, tok, eos=eos, pad=pad, stop=stop, batch_size=batch_size)
    return engine.generate(model, prompts, SamplingParams(greedy=True, **params))


def test_masks_end_at_first_eos(tok, chain_model, engine_name):
    r = greedy(chain_model, [ids(tok, "hi a"), ids(tok, "p"), ids(tok, "x")], engine_name, max_new_tokens=8)
    # row 0: "bc<EOS>" (3 tokens), row 1: "qrst<EOS>" (5), row 2: "yxyxyxyx" (cut at 8, never ended)
    assert r.lengths.tolist() == [3, 5, 8]
    assert r.ended.tolist() == [True, True, False]
    assert r.response_ids.shape == (3, 8)
    expected_mask = torch.tensor([[1] * 3 + [0] * 5, [1] * 5 + [0] * 3, [1] * 8])
    assert torch.equal(r.response_mask, expected_mask)
    assert r.response_ids[0, :3].tolist() == ids(tok, "bc") + [EOS]
    assert r.response_ids[1, :5].tolist() == ids(tok, "qrst") + [EOS]
    assert (r.response_ids[r.response_mask == 0] == PAD).all()
    assert torch.equal(r.lengths, r.response_mask.sum(-1))
    # prompts are left-padded
    assert r.prompt_mask.tolist()[1] == [0, 0, 0, 1]
    assert r.prompt_ids[1, :3].tolist() == [PAD] * 3
    assert decode_responses(tok, r) == ["bc", "qrst", "yxyxyxyx"]


def test_pad_equal_to_eos_and_several_eos_ids(tok, chain_model, engine_name):
    # pad == EOS: the end is still the first EOS (not "the first pad"), the EOS itself is kept and masked 1
    r = greedy(chain_model, [ids(tok, "a"), ids(tok, "x")], engine_name, pad=EOS, max_new_tokens=6)
    assert r.lengths.tolist() == [3, 6]
    assert r.response_mask[0].tolist() == [1, 1, 1, 0, 0, 0]
    # "<unk>" (3) is not an EOS: the m-row runs to the limit ...
    r = greedy(chain_model, [ids(tok, "m"), ids(tok, "a")], engine_name, max_new_tokens=6)
    assert r.lengths.tolist() == [6, 3] and r.ended.tolist() == [False, True]
    # ... unless it is one of the eos ids: each row stops at its own EOS
    r = greedy(chain_model, [ids(tok, "m"), ids(tok, "a")], engine_name, eos=[EOS, UNK], max_new_tokens=6)
    assert r.lengths.tolist() == [2, 3] and r.ended.tolist() == [True, True]
    assert r.response_ids.shape[1] == 3  # columns that are padding in every row are dropped


def test_not_forced_to_max_length_and_min_new_tokens(tok, chain_model, engine_name):
    r = greedy(chain_model, [ids(tok, "a")], engine_name, max_new_tokens=50)
    assert r.lengths.tolist() == [3] and r.response_ids.shape[1] == 3
    r = greedy(chain_model, [ids(tok, "a")], engine_name, max_new_tokens=10, min_new_tokens=5)
    # EOS is suppressed for the first 5 tokens, so the response cannot end before its 6th token
    assert r.lengths.item() >= 6 or not r.ended.item()


def test_stop_strings_cut_after_completing_token(tok, chain_model, engine_name):
    prompts = [ids(tok, "x"), ids(tok, "p"), ids(tok, "a")]
    calls = []
    handle = chain_model.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        r = greedy(chain_model, prompts, engine_name, tok=tok, max_new_tokens=10, stop=["xyx", "rs"])
    finally:
        handle.remove()
    if engine_name == "hf":  # (the static engine runs the layers itself: no module hook sees its steps)
        assert len(calls) == 4  # generation stopped early, once every row had ended (not at max_new_tokens)
    # "yxyx...": "xyx" completes at the 4th token; "qrst<EOS>": "rs" completes at the 3rd; "bc<EOS>": EOS first
    assert r.lengths.tolist() == [4, 3, 3]
    assert r.ended.tolist() == [True, True, True]
    assert decode_responses(tok, r) == ["yxyx", "qrs", "bc"]
    assert (r.response_ids[r.response_mask == 0] == PAD).all()
    with pytest.raises(ValueError, match="tokenizer"):
        greedy(chain_model, prompts, engine_name, stop=["x"])


def test_finalize_responses_pure():
    raw = torch.tensor([[5, 6, 2, 7, 2], [5, 5, 5, 5, 5], [2, 9, 9, 9, 9], [4, 3, 2, 2, 2]])
    out_ids, mask, ended, lengths = finalize_responses(raw, eos_token_ids=[2, 3], pad_token_id=0)
    assert lengths.tolist() == [3, 5, 1, 2]
    assert ended.tolist() == [True, False, True, True]
    assert out_ids.tolist() == [[5, 6, 2, 0, 0], [5, 5, 5, 5, 5], [2, 0, 0, 0, 0], [4, 3, 0, 0, 0]]
    assert mask.sum().item() == 11


def test_greedy_is_deterministic_and_batch_invariant(tok, engine_name):
    torch.manual_seed(0)
    cfg = tiny_llama_config("tiny:hidden=32,layers=2,heads=2,kv_heads=2,intermediate=64,context=128", tok)
    cfg.initializer_range = 0.3  # a random model whose greedy output depends on the whole prompt
    model = LlamaForCausalLM(cfg)
    prompts = [ids(tok, "hello there, friend"), ids(tok, "x"), ids(tok, "abc def"), ids(tok, "12345")]
    batch = greedy(model, prompts, engine_name, max_new_tokens=10)
    again = greedy(model, prompts, engine_name, max_new_tokens=10)
    assert torch.equal(batch.response_ids, again.response_ids)
    assert len({tuple(r) for r in batch.response_ids.tolist()}) > 1  # not a degenerate constant model
    for i, p in enumerate(prompts):
        alone = greedy(model, [p], engine_name, max_new_tokens=10)
        n = alone.lengths.item()
        assert batch.lengths[i].item() == n
        assert batch.response_ids[i, :n].tolist() == alone.response_ids[0, :n].tolist()
    done: list[int] = []  # what a progress display is told: rows finished, per micro-batch
    micro = make(engine_name, batch_size=3).generate(model, prompts, SamplingParams(greedy=True, max_new_tokens=10),
                                                     on_rows=done.append)
    assert torch.equal(micro.response_ids, batch.response_ids) and sum(done) == 4
    assert done == [3, 1] or engine_name == "continuous"  # (continuous: 3 slots, told as requests end)
    assert torch.equal(micro.prompt_ids, batch.prompt_ids)
    # temperature 0 means greedy
    t0 = make(engine_name).generate(model, prompts, SamplingParams(max_new_tokens=10, temperature=0.0))
    assert torch.equal(t0.response_ids, batch.response_ids)


def test_sampling_seeded_and_lengths_vary(tok, engine_name):
    # random transitions plus a bias towards EOS: sampled responses end at different lengths
    # hidden states are one-hot * sqrt(128) ~ 11.3, so logits ~ N(0, 1.1) and EOS gets +3 (~10% per step)
    model = rigged_model(tok, {}, scale=0.0, noise=0.1, seed=1)
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.27
    prompts = [ids(tok, "abc")] * 10
    eng = make(engine_name)
    params = SamplingParams(max_new_tokens=16)
    a = eng.generate(model, prompts, params, seed=123)
    state = torch.get_rng_state()
    b = eng.generate(model, prompts, params, seed=123)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    c = eng.generate(model, prompts, params, seed=124)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.lengths, b.lengths)
    assert not torch.equal(a.response_ids[:, :4], c.response_ids[:, :4])
    assert len(set(a.lengths.tolist())) > 2, a.lengths  # lengths vary: responses end at their own EOS
    assert a.ended.any()
    assert torch.equal(a.lengths, a.response_mask.sum(-1))
    eos_pos = a.response_ids == EOS
    assert (eos_pos.sum(-1) == a.ended.long()).all()  # at most one EOS kept per row, only in ended rows
    torch.manual_seed(5)
    d1 = eng.generate(model, prompts[:2], params)  # no seed: one drawn from the global RNG
    torch.manual_seed(5)
    d2 = eng.generate(model, prompts[:2], params)
    assert torch.equal(d1.response_ids, d2.response_ids)


def test_training_mode_restored_and_wrappers(tok, chain_model, engine_name):
    chain_model.train()
    chain_model.model.layers[0].mlp.eval()  # per-module flags survive, not just the top one
    seen = {}

    def hook(mod, _inp):
        seen["training"] = mod.training

    # (the rotary module is called by both engines: the static engine builds its RoPE tables with it)
    handle = chain_model.model.rotary_emb.register_forward_pre_hook(hook)
    try:
        r = greedy(torch.nn.DataParallel(chain_model), [ids(tok, "a")], engine_name)  # .module wrappers stripped
    finally:
        handle.remove()
    assert r.response_ids[0, :3].tolist() == ids(tok, "bc") + [EOS]
    assert seen["training"] is False  # generated in eval mode
    assert chain_model.training and chain_model.model.training
    assert not chain_model.model.layers[0].mlp.training
    chain_model.eval()
    greedy(chain_model, [ids(tok, "a")], engine_name)
    assert not chain_model.training


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls a deprecated transformers helper
def test_peft_wrapper_is_kept(tok, chain_model, engine_name):
    from peft import LoraConfig, get_peft_model

    base = rigged_model(tok, CHAIN)
    lora = get_peft_model(base, LoraConfig(r=2, target_modules=["lm_head"], init_lora_weights=False))
    assert strip_parallel_wrappers(torch.nn.DataParallel(lora)) is lora
    # non-zero LoRA weights on the head change the output: generation must go through the adapter
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 20.0)
    with_lora = greedy(lora, [ids(tok, "a")], engine_name)
    with lora.disable_adapter():
        without = greedy(lora, [ids(tok, "a")], engine_name)
    assert without.response_ids[0, :3].tolist() == ids(tok, "bc") + [EOS]
    assert not torch.equal(with_lora.response_ids, without.response_ids)


def test_rollout_helpers():
    r = Rollout(
        prompt_ids=torch.tensor([[0, 5], [6, 7]]),
        prompt_mask=torch.tensor([[0, 1], [1, 1]]),
        response_ids=torch.tensor([[8, 2, 0], [9, 9, 9]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]),
        ended=torch.tensor([True, False]),
        lengths=torch.tensor([2, 3]),
    )
    assert r.sequences.tolist() == [[0, 5, 8, 2, 0], [6, 7, 9, 9, 9]]
    assert r.attention_mask.tolist() == [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert len(r) == 2 and r.prompt_length == 2
    sub = r.index_select(torch.tensor([1]))
    assert sub.lengths.tolist() == [3] and sub.response_ids.shape == (1, 3)
    assert r[torch.tensor([False, True])].ended.tolist() == [False]
    assert r[0].lengths.tolist() == [2] and r[-1].lengths.tolist() == [3] and len(r[0:2]) == 2
    assert r.to("cpu").prompt_ids.device.type == "cpu"
    both = Rollout.concat([r[0], Rollout(*(t[:, :1] if t.dim() == 2 else t for t in (
        torch.tensor([[4]]), torch.tensor([[1]]), torch.tensor([[2]]), torch.tensor([[1]]),
        torch.tensor([True]), torch.tensor([1]))))], pad_token_id=0)  # fmt: skip
    assert both.prompt_ids.tolist() == [[0, 5], [0, 4]] and both.prompt_mask.tolist() == [[0, 1], [0, 1]]
    assert both.response_ids.tolist() == [[8, 2, 0], [2, 0, 0]]


def test_registry_and_generate_text(tok, chain_model):
    assert {"hf", "static", "continuous", "auto"} <= set(ENGINES)
    assert all(issubclass(cls, Engine) for cls in ENGINES.values())
    with pytest.raises(ConfigError, match="did you mean 'hf'"):
        check_engine("hff")
    with pytest.raises(ConfigError, match="did you mean 'sync_every'"):
        check_engine("static", {"sync_evry": 4})
    check_engine("hf", {"cache_implementation": "static"})
    # the ChatML generation prompt ends with "assistant\n"; the chain continues "\n" -> "a" -> "b" -> "c" -> EOS
    prompt = encode_chat_prompts(tok, [[{"role": "user", "content": "hi"}]])[0]
    assert tok.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    chain = dict(CHAIN, **{"\n": "a"})
    model = rigged_model(tok, chain)
    for name in ENGINES:
        out = generate_text(make(name, tok) if name != "auto" else ENGINES["auto"](tok, eos_token_ids=[EOS],
                                                                                    pad_token_id=PAD),
                            model, tok, [[{"role": "user", "content": "hi"}]] * 2, SamplingParams(greedy=True))
        assert out == ["abc", "abc"], name  # EOS (a special token) dropped in the text


def test_build_engine_from_the_generation_section(tok):
    from types import SimpleNamespace

    gen = SimpleNamespace(engine="static", engine_kwargs={"sync_every": 3}, stop_strings=["</a>"], batch_size=4)
    eng = build_engine(gen, tok)
    assert isinstance(eng, ENGINES["static"]) and eng.sync_every == 3 and eng.batch_size == 4
    assert eng.stop_strings == ("</a>",) and eng.eos_token_ids == [EOS] and eng.pad_token_id == PAD
    assert isinstance(build_engine(SimpleNamespace(engine="hf", engine_kwargs={}, stop_strings=[], batch_size=None),
                                   tok, eos_token_ids=[EOS, UNK]), HFEngine)
    with pytest.raises(ConfigError, match="generation.engine_kwargs.cuda_graph"):
        build_engine(SimpleNamespace(engine="static", engine_kwargs={"cuda_graph": True}, stop_strings=[],
                                     batch_size=None), tok)


@pytest.mark.parametrize("name", ["hf", "static"])
def test_a_rollout_reports_its_tokens_while_it_runs(tok, chain_model, name):
    # one micro-batch of 3 prompts, 17 new tokens at most: "a" ends after 3 tokens, "p" after 5, "x" never. The
    # engine tells where it is at its own host checks (static: every sync_every=2 tokens, with the rows ended; hf:
    # every 8 tokens, the ended rows unknown without a sync) -- the live line moves inside a long micro-batch
    heard = []
    engine = make(name, eos=(EOS,))
    engine.generate(chain_model, [ids(tok, w) for w in ("a", "p", "x")], SamplingParams(greedy=True, max_new_tokens=17),
                    on_progress=lambda t, n, ended: heard.append((t, n, ended)))
    assert heard and all(n == 17 for _, n, _ in heard)
    steps = [t for t, _, _ in heard]
    assert steps == sorted(steps) and steps[-1] >= 8
    if name == "static":
        ended = [e for _, _, e in heard]
        assert ended[0] == 0 and max(ended) == 2  # "a" and "p" end; "x" runs to the limit
    else:
        assert all(e is None for _, _, e in heard)
    assert engine.on_progress is None  # only during the call
