"""Supervised fine-tuning: next-token loss on assistant / completion tokens (all tokens as an option), optional
packing, eval loss and perplexity; writes a model directory every later stage reads."""

from __future__ import annotations

import math

import torch

from ...algos import sft_loss
from ...data import IGNORE_INDEX, SFTCollator, pack_sequences
from ...models.loading import describe, load_causal_lm, save_model
from ..lifecycle.run import run_recipe
from ..shared.batches import load_records, tokenize
from ..shared.forward import completion_stats
from .loop import SupervisedJob, train_supervised


def sft_forward(model, batch: dict) -> tuple[torch.Tensor, dict]:
    """Mean NLL over the trained tokens of the micro-batch (labels != -100), and the fraction of them that are the
    model's most likely token (TRL's ``mean_token_accuracy``), and the mean entropy of the next-token distribution over
    them (TRL's ``entropy``; not when Liger's kernel computes the head)."""
    labels = batch["labels"][:, 1:]
    mask = (labels != IGNORE_INDEX).long()
    st = completion_stats(model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                          position_ids=batch.get("position_ids"), argmax=True, entropy="metric",
                          media=batch.get("media"))  # untrained tokens: not computed
    loss, _ = sft_loss(st.logprobs, mask)
    tokens = mask.sum().clamp(min=1)
    out = {"mean_token_accuracy": ((st.argmax == labels) & mask.bool()).sum().float() / tokens}
    if st.entropy is not None:
        out["entropy"] = (st.entropy * mask).sum() / tokens
    return loss, out


@torch.no_grad()
def sft_eval(accelerator, model, batches: list[dict]) -> dict:
    """Token-level mean loss over every eval token of every process, its perplexity, and TRL's
    ``mean_token_accuracy`` and ``entropy`` over the same tokens (the entropy not under Liger's kernel)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, device=accelerator.device)  # nll, tokens, top-1 hits, entropy
    has_entropy = True
    for batch in batches:
        labels = batch["labels"][:, 1:]
        mask = (labels != IGNORE_INDEX).float()
        st = completion_stats(model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                              position_ids=batch.get("position_ids"), argmax=True, entropy="metric",
                              media=batch.get("media"))
        has_entropy = has_entropy and st.entropy is not None
        ent = (st.entropy.float() * mask).sum() if st.entropy is not None else mask.new_zeros(())
        sums += torch.stack([-(st.logprobs.float() * mask).sum(), mask.sum(), ((st.argmax == labels) * mask).sum(),
                             ent])
    model.train(was_training)
    nll, count, hits, ent = accelerator.reduce(sums, "sum").unbind(0)
    count = count.clamp(min=1)
    loss = (nll / count).item()
    out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "mean_token_accuracy": (hits / count).item()}
    return {**out, "entropy": (ent / count).item()} if has_entropy else out


def run_sft(cfg) -> dict:
    """Train, evaluate and save; returns the final metrics (``eval/loss``, ``eval/ppl``, ``train/loss``, …)."""
    # 1. data records first (a mistake in them is the error reported, before a finished run or changed settings
    #    are; it costs seconds, not a model load), then the run directory (locked), accelerator, seed; a finished
    #    run is not trained again
    return run_recipe(cfg, _train_sft, prepare=lambda c: load_records(c, "sft"))


def _train_sft(cfg, run, records) -> dict:
    # 2. model and tokenizer (the tokenizer carries the chat template every later stage uses)
    train_recs, eval_recs = records
    model, tok = load_causal_lm(cfg.model, device=run.device, seed=cfg.train.seed)
    run.print(f"[sft] model {cfg.model.name}: {describe(model)}")
    # 3. data: records -> token ids with label masks (packed when asked)
    completion_only = cfg.data.completion_only_loss
    train = tokenize(run, train_recs, "sft", tok, cfg, "train", completion_only)
    evals = tokenize(run, eval_recs, "sft", tok, cfg, "eval", completion_only)
    if cfg.data.packing:
        train = pack_sequences(train, cfg.data.max_length)
        run.print(f"[data] packed into {len(train)} rows of {cfg.data.max_length} tokens")
    # 4. the loop
    job = SupervisedJob(
        name="sft", model=model, tokenizer=tok, train_items=train, collate=SFTCollator(tok.pad_token_id),
        loss_fn=sft_forward, eval_items=evals,
        eval_fn=lambda m, b: sft_eval(run.accelerator, m, b),
        show=("loss", "lr"), on_save=lambda m, d: save_model(m, tok, d),
        health={"vocab_size": getattr(model.config, "vocab_size", None)},  # train/loss: per-token cross-entropy
    )
    metrics = train_supervised(run, job)
    run.print(f"[sft] done: model saved to {run.run_dir}"
              + (f"; eval loss {metrics['eval/loss']:.4f} (ppl {metrics['eval/ppl']:.2f})"
                 if "eval/loss" in metrics else ""))
    return metrics
