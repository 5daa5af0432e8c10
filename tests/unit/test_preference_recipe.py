"""The preference recipe's pieces on a tiny random model and hand-built pairs: sequence log-probs, the reference cache
(same loss as on the fly, reused, recomputed when the data changes), the LoRA reference (adapter disabled = base)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.config import build_config, parse_override
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.supervised import preference as P

TINY = "tiny:hidden=32,layers=1,heads=2,kv_heads=2,intermediate=64"

# token ids of the character-level tokenizer (4..99 are characters): prompts of different lengths
PAIRS = [
    {"prompt_ids": [1, 10, 11, 12], "chosen_ids": [40, 41, 2], "rejected_ids": [50, 2]},
    {"prompt_ids": [1, 13, 14, 15, 16, 17], "chosen_ids": [42, 43, 44, 2], "rejected_ids": [51, 52, 53, 54, 2]},
    {"prompt_ids": [1, 18, 19], "chosen_ids": [45, 2], "rejected_ids": [55, 56, 2]},
]


def build(recipe: str, overrides: list[str]):
    """build_config with the overrides given as a mapping: dotted overrides on keys that RECIPE_DEFAULTS sets (algo.*,
    KTO's data.*) are written into RECIPE_DEFAULTS itself by config.build_config and would leak into later tests."""
    tree: dict = {}
    for item in overrides:
        keys, value = parse_override(item)
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return build_config(recipe, tree)


def _pairs():
    return [dict(p) for p in PAIRS]


def _cfg(tmp_path, *extra):
    return build("dpo", [f"model.name={TINY}", f"output_dir={tmp_path}", "train.batch_size=3", "track.report=false",
                         *extra])


def _perturb(model, seed: int = 0, scale: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g))


def _slow_logps(model, prompt, completion) -> float:
    """log p(completion | prompt) one token at a time, from full logits (the slow reference)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    return sum(float(logp[len(prompt) + i - 1, t]) for i, t in enumerate(completion))


def test_sequence_logps_sum_completion_tokens_only(tmp_path):
    model, tok = load_causal_lm(_cfg(tmp_path).model, trainable=False)
    batch = P.PairCollator(tok.pad_token_id)(_pairs())
    sums, counts = P.sequence_logps(model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"],
                                    batch["start"])
    expected = [_slow_logps(model, p["prompt_ids"], p[side]) for side in ("chosen_ids", "rejected_ids")
                for p in PAIRS]
    torch.testing.assert_close(sums.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-4, rtol=1e-5)
    assert counts.tolist() == [3, 4, 2, 2, 5, 3]  # chosen rows, then rejected rows
    assert batch["start"] == 2  # the shortest prompt has 3 tokens: logits from its last token on


def _dpo_losses(tmp_path, reference: str):
    """(loss, stats) of one DPO step of a perturbed policy, reference = the unperturbed initial model."""
    cfg = _cfg(tmp_path / reference, f"algo.reference={reference}")
    run = start_run(cfg)
    model, tok = load_causal_lm(cfg.model, seed=cfg.train.seed)
    collate = P.PairCollator(tok.pad_token_id)
    items = _pairs()
    if reference == "precompute":
        P.precompute_reference(run, cfg, model, tok, collate, items, [])
        ref = P.Reference(run.accelerator)
    else:
        ref = P.open_reference(run, cfg, tok)
    _perturb(model)
    model.eval()
    return P.make_forward(run, cfg, ref)(model, collate(items)), items


def test_precomputed_reference_gives_the_on_the_fly_loss(tmp_path):
    (loss_cached, stats_cached), items = _dpo_losses(tmp_path, "precompute")
    (loss_live, stats_live), _ = _dpo_losses(tmp_path, "on_the_fly")
    assert all("ref_logps" in e for e in items)
    # the policy moved away from the reference: the loss is no longer log 2
    assert abs(loss_live.item() - 0.693147) > 1e-3
    torch.testing.assert_close(loss_cached, loss_live, atol=1e-5, rtol=1e-5)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"):
        torch.testing.assert_close(stats_cached[key], stats_live[key], atol=1e-5, rtol=1e-5)


def test_reference_cache_reused_then_recomputed_when_data_changes(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    run = start_run(cfg)
    model, tok = load_causal_lm(cfg.model, seed=cfg.train.seed)
    collate = P.PairCollator(tok.pad_token_id)
    loads = []
    real_load = P.load_causal_lm
    monkeypatch.setattr(P, "load_causal_lm", lambda *a, **k: loads.append(1) or real_load(*a, **k))

    first = _pairs()
    assert P.precompute_reference(run, cfg, model, tok, collate, first[:2], first[2:]) is True
    (cache,) = tmp_path.glob(P.CACHE_GLOB)
    before = cache.read_bytes()
    assert len(loads) == 1
    # a resumed run: same reference, same data -> read from the cache, no reference model loaded
    again = _pairs()
    assert P.precompute_reference(run, cfg, model, tok, collate, again[:2], again[2:]) is False
    assert len(loads) == 1
    assert [e["ref_logps"] for e in again] == [e["ref_logps"] for e in first]
    # the data changed (one rejected answer) -> recomputed
    changed = _pairs()
    changed[0]["rejected_ids"] = [60, 61, 2]
    assert P.precompute_reference(run, cfg, model, tok, collate, changed[:2], changed[2:]) is True
    assert len(loads) == 2
    assert changed[0]["ref_logps"][1] != first[0]["ref_logps"][1]
    assert changed[1]["ref_logps"] == first[1]["ref_logps"]
    # ... into a file of its own: the earlier run's cache is untouched (a run that then fails changes nothing)
    assert cache.read_bytes() == before and len(list(tmp_path.glob(P.CACHE_GLOB))) == 2
    # another reference model -> recomputed too
    other = _cfg(tmp_path, "ref_model=tiny:hidden=32,layers=1,heads=2,kv_heads=2,intermediate=32")
    assert P.precompute_reference(run, other, model, tok, collate, _pairs()[:2], _pairs()[2:]) is True


def test_lora_reference_is_the_base_model(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0.0")
    run = start_run(cfg)
    policy, tok = load_causal_lm(cfg.model, seed=cfg.train.seed)
    base, _ = load_causal_lm(_cfg(tmp_path).model, seed=cfg.train.seed, trainable=False)
    _perturb(policy)  # LoRA B is zero at init: move the adapter so it changes the outputs
    monkeypatch.setattr(P, "load_causal_lm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded a copy")))
    ref = P.open_reference(run, cfg, tok)  # no second copy under LoRA
    assert ref.copy is None

    batch = P.PairCollator(tok.pad_token_id)(_pairs())
    args = (batch["input_ids"], batch["attention_mask"], batch["completion_mask"], batch["start"])
    ref_logps = ref.sequence(policy, *args)
    base_logps, _ = P.sequence_logps(base, *args)
    policy_logps, _ = P.sequence_logps(policy, *args)
    torch.testing.assert_close(ref_logps, base_logps, atol=1e-5, rtol=1e-5)
    assert (policy_logps - base_logps).abs().max() > 1e-3  # the adapter is live again after the reference forward
    assert policy.training  # and the policy is back in train mode


def test_kto_items_from_pairs_and_fixed_kl_partners():
    items = P.unpair_items(_pairs())
    assert [e["label"] for e in items] == [True, False] * 3 and [e["pair"] for e in items] == [0, 0, 1, 1, 2, 2]
    P.assign_kl_partners(items, seed=0, max_length=8)
    completions = [e["completion_ids"] for e in items]
    for e in items:
        # another example's completion, cut to fit max_length after this prompt
        assert len(e["prompt_ids"]) + len(e["kl_completion_ids"]) <= 8
        assert any(c[: len(e["kl_completion_ids"])] == e["kl_completion_ids"] for c in completions)
    batch = P.KTOCollator(0)(items)
    assert batch["kl_input_ids"].shape[0] == batch["input_ids"].shape[0] == 6
    assert batch["label"].tolist() == [True, False] * 3


def test_kto_paired_accuracy_and_objective_stats():
    # pairs 0 and 1: chosen reward beats rejected in pair 0 only; the unpaired example (-1) is ignored
    rewards = torch.tensor([1.0, -1.0, 0.0, 2.0, 5.0])
    labels = torch.tensor([True, False, True, False, True])
    pair = torch.tensor([0, 0, 1, 1, -1])
    assert P._paired_accuracy(rewards, labels, pair).item() == 0.5

    cfg = build_config("kto")
    logps = torch.tensor([-1.0, -5.0, -2.0, -6.0])
    ref = torch.tensor([-2.0, -4.0, -2.0, -6.0])  # r = [1, -1, 0, 0]
    labels = torch.tensor([True, False, True, False])
    # mismatched pairs: pi - ref = [0.5, -0.1, 0.2, 0.2] -> z0 = 0.2
    kl_logps, kl_ref = torch.tensor([-3.5, -4.1, -3.8, -3.8]), torch.full((4,), -4.0)
    loss, stats = P.kto_objective(cfg.algo, logps, ref, labels, kl_logps, kl_ref)
    assert stats["kl"].item() == pytest.approx(0.2)
    # right side of z0: r=1 desirable (yes), r=-1 undesirable (yes), r=0 desirable (no), r=0 undesirable (yes)
    assert stats["rewards/accuracies"].item() == 0.75
    assert abs(stats["rewards/margins"].item() - (0.05 - (-0.05))) < 1e-6  # beta 0.1 * mean r per class
    assert stats["logps/chosen"].item() == -1.5 and stats["logps/rejected"].item() == -5.5


def test_token_metrics_hand_values():
    """TRL 1.16's DPO / KTO token metrics from per-row sums: token-weighted means over the chosen / rejected rows."""
    rows = {"mean_logits": torch.tensor([6.0, 2.0, -3.0, 1.0]), "top1": torch.tensor([2.0, 1.0, 0.0, 3.0]),
            "entropy": torch.tensor([3.0, 1.0, 2.0, 2.0])}
    tokens = torch.tensor([3.0, 1.0, 2.0, 4.0])
    chosen = torch.tensor([True, True, False, False])
    m = P.token_metrics(rows, tokens, chosen, accuracy=True)
    assert m["logits/chosen"].item() == pytest.approx(8 / 4) and m["logits/rejected"].item() == pytest.approx(-2 / 6)
    assert m["entropy"].item() == pytest.approx(8 / 10) and m["mean_token_accuracy"].item() == pytest.approx(3 / 4)
    no_rejected = P.token_metrics({k: v for k, v in rows.items() if k != "entropy"}, tokens, torch.ones(4, dtype=bool),
                                  accuracy=False)
    assert no_rejected["logits/rejected"].item() == 0 and set(no_rejected) == {"logits/chosen", "logits/rejected"}


def test_sequence_logps_fill_the_token_metrics_sums(tmp_path):
    """``into``: per-row sums over the completion tokens of the mean logit, the top-1 hits and the entropy, against a
    plain forward's every logit."""
    model, _ = load_causal_lm(_cfg(tmp_path).model, trainable=False)
    _perturb(model)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 5, 6, 10, 11, 0]])
    att = (ids != 0).long()
    comp = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0]])
    rows: dict = {}
    with torch.no_grad():
        summed, count = P.sequence_logps(model, ids, att, comp, start=1, into=rows)
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    m = comp[:, 1:].float()
    logp = torch.log_softmax(logits, -1)
    torch.testing.assert_close(rows["mean_logits"], (logits.mean(-1) * m).sum(-1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows["top1"], ((logits.argmax(-1) == ids[:, 1:]).float() * m).sum(-1))
    torch.testing.assert_close(rows["entropy"], (-(logp.exp() * logp).sum(-1) * m).sum(-1), atol=1e-4, rtol=1e-4)
    assert count.tolist() == [3.0, 2.0]


def test_evaluation_token_metrics_equal_the_training_forwards(tmp_path):
    """The held-out evaluation, over batches split otherwise, gives the training forward's TRL token metrics of the
    whole batch (token-weighted, not a mean of batch means)."""
    cfg = _cfg(tmp_path / "ev", "algo.reference=on_the_fly")
    run = start_run(cfg)
    model, tok = load_causal_lm(cfg.model, seed=cfg.train.seed)
    collate = P.PairCollator(tok.pad_token_id)
    ref = P.open_reference(run, cfg, tok)
    _perturb(model)
    model.eval()
    _, whole = P.make_forward(run, cfg, ref)(model, collate(_pairs()))
    got = P.evaluate(run, cfg, ref, model, [collate(_pairs()[:1]), collate(_pairs()[1:])])
    for key in ("logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy", "rewards/chosen"):
        assert got[key] == pytest.approx(float(whole[key]), abs=1e-5), key
