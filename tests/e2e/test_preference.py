"""End-to-end: offline preference recipes (DPO, KTO, SimPO, ORPO, IPO, cDPO) from the session's SFT model on the
built-in task with the tiny model.

Measured values (CPU, seed 42; SFT gold 0.375) are in the comments; thresholds leave a wide margin under them.
"""

from __future__ import annotations

import pytest

from rlhfkit.config import build_config
from rlhfkit.train.supervised import preference as P


def build(recipe: str, overrides: list[str]):
    return build_config(recipe, {}, overrides)


def _overrides(task_data, sft_dir, out, train="preference.jsonl", *extra) -> list[str]:
    return [f"model.name={sft_dir}", f"data.train={task_data / train}",
            f"data.eval={task_data / 'eval_preference.jsonl'}", f"output_dir={out}", "data.max_length=64",
            "train.batch_size=32", "track.report=false", *extra]


def _train(recipe, overrides) -> tuple[dict, list[dict]]:
    metrics = P.run_preference(build(recipe, overrides))
    out = next(o.split("=", 1)[1] for o in overrides if o.startswith("output_dir="))
    from rlhfkit.track.metrics import read_run_metrics

    return metrics, read_run_metrics(out)  # rlhfkit's names (metrics.jsonl holds TRL's: rewards/chosen, eval_loss)


def _first_eval(lines: list[dict], key: str) -> float:
    return next(x[key] for x in lines if key in x)


@pytest.fixture(scope="module")
def sft_gold(gold_of, sft_dir) -> float:
    return gold_of(sft_dir)  # measured 0.375


@pytest.mark.cluster  # one of the longest checks (~10 s): make test-cluster, which CI runs
def test_dpo_raises_heldout_accuracy_and_gold(task_data, sft_dir, gold_of, sft_gold, tmp_path):
    out = tmp_path / "dpo"
    metrics, lines = _train("dpo", _overrides(task_data, sft_dir, out, "preference.jsonl", "optim.lr=1e-3",
                                              "track.report=true"))
    # at the start policy = reference: every implicit reward is 0, no pair is ranked right
    assert _first_eval(lines, "eval/rewards/accuracies") < 0.1
    assert metrics["eval/rewards/accuracies"] > 0.8  # measured 0.955
    assert metrics["eval/rewards/margins"] > 1.0  # measured 2.50
    assert metrics["eval/rewards/chosen"] > metrics["eval/rewards/rejected"]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                "logps/rejected", "logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy"):  # TRL 1.16's
        assert f"train/{key}" in metrics and f"eval/{key}" in metrics
    assert 0 <= metrics["train/mean_token_accuracy"] <= 1 and metrics["train/entropy"] > 0
    assert len(list(out.glob(P.CACHE_GLOB))) == 1
    assert (out / "model.safetensors").is_file() and (out / "report.html").is_file()
    # gold is sampled accuracy on 200 held-out prompts: its own noise is about 0.035 (binomial at 0.55), and a
    # rounding-level change upstream (fused AdamW: the same updates to float32 rounding) moves the SFT model and
    # with it DPO's outcome: measured over train seeds 42, 1-4, +0.115..+0.165 from the fused SFT model (0.39),
    # +0.175..+0.265 from the per-tensor one (0.375). The bar: a gain beyond twice that noise
    assert gold_of(out) > sft_gold + 0.07


def test_kto_on_unpaired_data_improves_gold(task_data, sft_dir, gold_of, sft_gold, tmp_path):
    out = tmp_path / "kto"
    metrics, lines = _train("kto", _overrides(task_data, sft_dir, out, "unpaired.jsonl", "optim.lr=1e-3"))
    assert "train/kl" in metrics and "eval/kl" in metrics
    assert {"train/logits/chosen", "train/logits/rejected", "train/entropy"} <= set(metrics)  # TRL 1.16's KTO names
    assert "train/mean_token_accuracy" not in metrics  # TRL's KTO logs none
    # held-out pairs: the desirable answer's implicit reward beats the undesirable one's
    assert metrics["eval/rewards/accuracies"] > 0.8  # measured 0.94
    assert gold_of(out) > sft_gold + 0.15  # measured 0.74 vs 0.375


def _count_loads_and_forwards(monkeypatch) -> dict:
    """Count models loaded by the recipe and forward calls of each."""
    calls = {"loads": 0, "forwards": 0}
    real = P.load_causal_lm

    def counting(*args, **kwargs):
        calls["loads"] += 1
        model, tok = real(*args, **kwargs)
        model.register_forward_hook(lambda *_: calls.__setitem__("forwards", calls["forwards"] + 1))
        return model, tok

    monkeypatch.setattr(P, "load_causal_lm", counting)
    return calls


@pytest.mark.parametrize("recipe,lr,gain", [
    ("simpo", "1e-4", 0.15),  # measured gold 0.73 vs 0.375, eval accuracy 1.0 (at lr 1e-3: 0.315, see simpo.yaml)
    ("orpo", "1e-3", 0.3),  # measured gold 0.98 vs 0.375, eval accuracy 1.0
])
def test_reference_free_losses_run_no_reference_model(recipe, lr, gain, task_data, sft_dir, gold_of, sft_gold,
                                                      tmp_path, monkeypatch):
    out = tmp_path / recipe
    calls = _count_loads_and_forwards(monkeypatch)
    metrics, lines = _train(recipe, _overrides(task_data, sft_dir, out, "preference.jsonl", f"optim.lr={lr}"))
    # one model (the policy), one forward per micro-batch and per eval batch (7 of 32 pairs, at step 0 and at the end)
    updates = max(x["step"] for x in lines)
    assert calls == {"loads": 1, "forwards": updates + 2 * 7}
    assert not list(out.glob(P.CACHE_GLOB))
    assert metrics["eval/rewards/accuracies"] > _first_eval(lines, "eval/rewards/accuracies") + 0.2  # 0.545 -> 1.0
    assert metrics["eval/rewards/accuracies"] > 0.9
    assert gold_of(out) > sft_gold + gain


@pytest.mark.parametrize("recipe,extra", [
    # a frozen reference copy run every step; measured: eval loss 25.0 -> 10.26, accuracy 0.895
    ("ipo", ["algo.reference=on_the_fly", "optim.lr=1e-3"]),
    # LoRA (10x the lr), reference = adapter disabled; measured: eval loss 0.693 -> 0.499, accuracy 0.81,
    # train loss (mean of 5) 0.672 -> 0.528
    ("dpo", ["algo.loss=cdpo", "model.lora.enabled=true", "model.lora.r=8", "optim.lr=5e-3"]),
])
def test_ipo_and_cdpo_losses_decrease(recipe, extra, task_data, sft_dir, tmp_path):
    out = tmp_path / recipe
    metrics, lines = _train(recipe, _overrides(task_data, sft_dir, out, "preference.jsonl", "train.max_steps=20",
                                               "data.limit=640", *extra))
    losses = [x["train/loss"] for x in lines if "train/loss" in x]
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    assert metrics["eval/loss"] < 0.85 * _first_eval(lines, "eval/loss")
    assert metrics["eval/rewards/accuracies"] > 0.6


def test_resumed_run_reuses_the_reference_cache_and_repeats_the_losses(task_data, sft_dir, tmp_path, monkeypatch):
    out = tmp_path / "dpo-resume"
    args = _overrides(task_data, sft_dir, out, "preference.jsonl", "optim.lr=1e-3", "train.max_steps=6",
                      "train.save_every=3", "data.limit=320")
    _, lines = _train("dpo", args)
    first = [x["train/loss"] for x in lines if "train/loss" in x]
    assert (out / "checkpoint-3").is_dir()
    (out / "finished.json").unlink()  # as if killed before the end (a finished run is not trained again)
    # run again in the same directory: resumes at update 3, reads the cached reference log-probs (no copy loaded)
    calls = _count_loads_and_forwards(monkeypatch)
    _, lines = _train("dpo", args)
    assert calls["loads"] == 1
    again = [x["train/loss"] for x in lines if "train/loss" in x]
    assert again == pytest.approx(first, abs=1e-6)
