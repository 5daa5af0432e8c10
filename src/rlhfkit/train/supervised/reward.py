"""Reward-model training: Bradley–Terry loss on preference pairs, scored at each sequence's last real token.

The model is an ``AutoModelForSequenceClassification`` with one label, initialised from a causal-LM checkpoint.
Chosen and rejected go through one concatenated forward. Reported: eval accuracy, mean chosen / rejected scores and
their margin (the numbers DeepSpeed-Chat users look for). The saved directory loads with
``AutoModelForSequenceClassification.from_pretrained``.
"""

from __future__ import annotations

import torch

from ...algos import bradley_terry_loss
from ...data import PreferenceCollator, require_field
from ...models.heads import sequence_scores
from ...models.loading import describe, load_scalar_model, load_tokenizer_for, save_model
from ...track.progress import held_out
from ..lifecycle.run import run_recipe
from ..shared.batches import gather_rows, load_records, tokenize
from .loop import SupervisedJob, train_supervised


def pair_scores(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of chosen rows [B] and rejected rows [B] from one forward over the [2B, L] batch."""
    scores = sequence_scores(model, batch["input_ids"], batch["attention_mask"]).float()
    half = scores.shape[0] // 2
    return scores[:half], scores[half:]


def make_rm_forward(cfg):
    def rm_forward(model, batch: dict):
        chosen, rejected = pair_scores(model, batch)
        loss, stats = bradley_terry_loss(chosen, rejected, margin=batch.get("margin"), center_coef=cfg.rm.center_coef)
        return loss, {"accuracy": stats["accuracy"], **reward_stats(chosen.detach(), rejected.detach())}

    return rm_forward


@torch.no_grad()
def rm_eval(accelerator, model, batches: list[dict]) -> dict:
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    for batch in batches:
        c, r = pair_scores(model, batch)
        chosen.append(c)
        rejected.append(r)
    model.train(was_training)
    # every process's pairs once (processes may hold different numbers of eval batches, or none)
    local = torch.stack([torch.cat(chosen), torch.cat(rejected)], dim=1) if chosen else \
        torch.zeros(0, 2, device=accelerator.device)
    both = gather_rows(accelerator, local.float())
    c, r = both[:, 0], both[:, 1]
    loss, stats = bradley_terry_loss(c, r)
    return {"loss": loss.item(), "accuracy": stats["accuracy"].item(), "chosen_mean": c.mean().item(),
            "rejected_mean": r.mean().item(), **{k: float(v) for k, v in reward_stats(c, r).items()}}


def reward_stats(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's RewardTrainer statistics of a batch of pairs: the mean chosen - rejected margin, and the mean, lowest
    and highest score over both sides."""
    both = torch.cat([chosen, rejected])
    return {"margin_mean": (chosen - rejected).mean(), "mean_reward": both.mean(), "min_reward": both.min(),
            "max_reward": both.max()}


class MarginCollator(PreferenceCollator):
    def __init__(self, pad_id: int, margins: bool):
        super().__init__(pad_id)
        self.margins = margins

    def __call__(self, examples):
        batch = super().__call__(examples)
        if self.margins:
            batch["margin"] = torch.tensor([float(e.get("margin", 0.0)) for e in examples])
        return batch


def run_rm(cfg) -> dict:
    # 1. data records first (a mistake in them is the error reported, before a finished run or changed settings
    #    are), then the run directory (locked), accelerator, seed; a finished run is not trained again
    return run_recipe(cfg, _train_rm, prepare=lambda c: load_records(c, "preference"))


def _train_rm(cfg, run, records) -> dict:
    # 2. the tokenizer of the base model and the reward model = its backbone + a 1-output head
    train_recs, eval_recs = records
    if cfg.rm.margin_field:  # every pair needs its margin: answered before any weights load
        require_field(train_recs + eval_recs, cfg.rm.margin_field, "rm.margin_field")
    tok = load_tokenizer_for(cfg.model)
    model = load_scalar_model(cfg.model.name, cfg.model, tokenizer=tok, device=run.device, seed=cfg.train.seed)
    run.print(f"[rm] reward model from {cfg.model.name}: {describe(model)}")
    # 3. data: pairs -> prompt / chosen / rejected ids (ending at the end-of-turn token, where the score is read)
    train = tokenize(run, train_recs, "preference", tok, cfg, "train")
    evals = tokenize(run, eval_recs, "preference", tok, cfg, "eval")
    margin_field = cfg.rm.margin_field
    if margin_field:
        for items, recs in ((train, train_recs), (evals, eval_recs)):
            _attach_margins(items, recs, margin_field)
    # 4. the loop
    job = SupervisedJob(
        name="rm", model=model, tokenizer=tok, train_items=train,
        collate=MarginCollator(tok.pad_token_id, bool(margin_field)), loss_fn=make_rm_forward(cfg),
        eval_items=evals, eval_fn=lambda m, b: rm_eval(run.accelerator, m, b), show=("loss", "accuracy"),
        on_save=lambda m, d: save_model(m, tok, d),
    )
    metrics = train_supervised(run, job)
    if "eval/accuracy" in metrics:
        accuracy = held_out(metrics["eval/accuracy"], len(evals), "pair")
        run.print(f"[rm] done: saved to {run.run_dir}; held-out accuracy {accuracy}, "
                  f"chosen {metrics['eval/chosen_mean']:.3f} vs rejected {metrics['eval/rejected_mean']:.3f}")
    return metrics


def _attach_margins(items: list[dict], records: list[dict], field: str) -> None:
    from ...errors import DataError

    if len(items) != len(records):
        raise DataError("margins cannot be matched to dropped records", where="rm.margin_field",
                        fix="set data.overflow=truncate when using margins")
    for item, rec in zip(items, records):  # every record has the field (require_field, before the model loads)
        item["margin"] = float(rec[field])
