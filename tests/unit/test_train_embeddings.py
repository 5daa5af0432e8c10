"""``model.train_embeddings=false``: the token embeddings and the LM head get no gradient and stay as loaded through an
optimizer step (tied: one tensor; untied: both), every other weight is trained; under LoRA it changes nothing."""

from __future__ import annotations

import torch

from rlhfkit.config import ModelConfig
from rlhfkit.config.parse import build_config
from rlhfkit.config.schema import LoraConfig
from rlhfkit.models.loading import freeze_embeddings, load_causal_lm
from rlhfkit.train.lifecycle.optim import build_optimizer


def _step(model, lr=1e-2):
    """One AdamW step on a next-token loss over a fixed batch; returns the parameters before it."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model.parameters(), build_config("grpo").optim, lr=lr)
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return before


def _changed(model, before) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}


def test_the_key_parses_and_defaults_to_training_them():
    assert build_config("grpo").model.train_embeddings is True
    assert build_config("grpo", {}, ["model.train_embeddings=false"]).model.train_embeddings is False


def test_tied_embeddings_stay_and_the_rest_trains():
    model, _ = load_causal_lm(ModelConfig(name="tiny", train_embeddings=False))
    emb = model.get_input_embeddings().weight
    assert emb is model.get_output_embeddings().weight  # tied: one tensor
    assert not emb.requires_grad
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == total - emb.numel() > 0
    before = _step(model)
    changed = _changed(model, before)
    assert not any("embed" in n for n in changed)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == changed  # every other weight moved


def test_by_default_the_embeddings_train():
    model, _ = load_causal_lm(ModelConfig(name="tiny"))
    assert model.get_input_embeddings().weight.requires_grad
    assert any("embed" in n for n in _changed(model, _step(model)))


def test_untied_head_and_embeddings_both_frozen():
    model, _ = load_causal_lm(ModelConfig(name="tiny"))
    model.config.tie_word_embeddings = False
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone() + 0.01)  # its own tensor now
    emb = model.get_input_embeddings().weight
    assert head.weight is not emb
    assert freeze_embeddings(model) == emb.numel() + head.weight.numel()
    before = _step(model)
    changed = _changed(model, before)
    assert "lm_head.weight" not in changed and not any("embed" in n for n in changed)
    assert changed  # the body still trains


def test_under_lora_only_adapters_train_either_way():
    lora = LoraConfig(enabled=True, r=4, alpha=8)
    on, _ = load_causal_lm(ModelConfig(name="tiny", lora=lora, train_embeddings=False))
    off, _ = load_causal_lm(ModelConfig(name="tiny", lora=lora))
    names = {n for n, p in on.named_parameters() if p.requires_grad}
    assert names == {n for n, p in off.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n for n in names)


def test_plan_counts_them_held_but_not_trained():
    from rlhfkit.models.memory import read_architecture
    from rlhfkit.plan import plan

    arch = read_architecture("tiny")

    def step(recipe, *over):
        p = plan(build_config(recipe, {}, ["model.name=tiny", *over]), world=1, checks=False)
        return {ph.name: ph for ph in p.phases}["train step"].items

    on, off = step("grpo"), step("grpo", "model.train_embeddings=false")
    assert on["policy weights"] == off["policy weights"] == arch.params() * 4
    assert on["policy gradients"] - off["policy gradients"] == arch.embedding_params() * 4
    assert on["policy optimizer (AdamW)"] - off["policy optimizer (AdamW)"] == arch.embedding_params() * 2 * 4
    on, off = step("ppo"), step("ppo", "model.train_embeddings=false")  # the critic: no LM head, its embeddings
    critic = next(k for k in on if k.endswith("gradients") and not k.startswith("policy"))
    assert on[critic] - off[critic] == arch.vocab * arch.hidden * 4


def test_a_critic_or_reward_model_keeps_its_token_embeddings_and_trains_its_score_head():
    # the scalar models load through the same path (rm, and ppo's critic from model_named(cfg.model, ...)): no LM head,
    # so only the token embeddings are frozen
    from rlhfkit.models.loading import load_scalar_model, load_tokenizer_for

    mcfg = ModelConfig(name="tiny", train_embeddings=False)
    model = load_scalar_model("tiny", mcfg, tokenizer=load_tokenizer_for(mcfg))
    assert model.get_output_embeddings() is None and not model.get_input_embeddings().weight.requires_grad
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "score.weight" in trained and not any("embed" in n for n in trained)
