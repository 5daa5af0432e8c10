"""End-to-end: SFT and reward-model training on the built-in task with the tiny model."""

from __future__ import annotations

import json

import torch

from rlhfkit.track.metrics import read_run_metrics


def test_sft_lowers_eval_loss_and_raises_gold(sft_run, gold_of, eval_prompts):
    out, metrics = sft_run
    lines = read_run_metrics(out)  # rlhfkit's names (metrics.jsonl holds TRL's: eval_loss)
    first_eval = next(x["eval/loss"] for x in lines if "eval/loss" in x)
    # the untrained model is near uniform over 100 tokens: ln(100) = 4.6 per token
    assert first_eval > 3.0
    assert metrics["eval/loss"] < 0.5 * first_eval
    for split in ("train", "eval"):  # TRL 1.16's SFT metrics (entropy at most ln 100, the vocabulary)
        assert 0 < metrics[f"{split}/entropy"] < 4.7 and 0 <= metrics[f"{split}/mean_token_accuracy"] <= 1
    untrained = gold_of("tiny:hidden=64,layers=2,intermediate=128")
    sft = gold_of(out)
    # demonstrations shout 40% of the time: SFT should land well above 0 and well below 1
    assert untrained < 0.05
    assert 0.15 < sft < 0.8, sft


def test_sft_output_loads_with_plain_transformers(sft_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(sft_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_dir)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "shout: cat"}], add_generation_prompt=True,
                                  tokenize=False)
    enc = tok(ids, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=10, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip().lower() == "cat"  # it answers in the template it was trained with


def test_rm_reaches_held_out_accuracy(rm_run):
    out, metrics = rm_run
    assert metrics["eval/accuracy"] >= 0.8
    assert metrics["eval/chosen_mean"] > metrics["eval/rejected_mean"]


def test_rm_output_loads_as_sequence_classifier(rm_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlhfkit.models.heads import sequence_scores

    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir)
    assert model.config.num_labels == 1

    def score(answer):
        text = tok.apply_chat_template([{"role": "user", "content": "shout: zebra"},
                                        {"role": "assistant", "content": answer}], tokenize=False).rstrip("\n")
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            return sequence_scores(model, enc["input_ids"], enc["attention_mask"]).item()

    assert score("ZEBRA") > score("zebra")


def test_rm_margin_field_reaches_the_loss(task_data, tmp_path, monkeypatch):
    """rm.margin_field: each pair's margin (Llama 2) travels from the record to the Bradley-Terry loss."""
    from rlhfkit.config import build_config
    from rlhfkit.train.supervised import reward

    rows = [json.loads(x) for x in (task_data / "preference.jsonl").read_text().splitlines()[:64]]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({**r, "gap": float(i % 3)}) + "\n" for i, r in enumerate(rows)))
    seen = []
    real = reward.bradley_terry_loss

    def spy(chosen, rejected, margin=None, center_coef=0.0):
        seen.append(margin)
        return real(chosen, rejected, margin=margin, center_coef=center_coef)

    monkeypatch.setattr(reward, "bradley_terry_loss", spy)
    cfg = build_config("rm", {}, [f"data.train={path}", f"output_dir={tmp_path / 'rm'}",
                                  "model.name=tiny:hidden=32,layers=1", "rm.margin_field=gap", "train.batch_size=8",
                                  "train.max_steps=2", "data.eval_fraction=0", "track.report=false",
                                  "data.max_length=64"])
    reward.run_rm(cfg)
    margins = [m for m in seen if m is not None]
    assert margins and all(set(m.tolist()) <= {0.0, 1.0, 2.0} for m in margins)
