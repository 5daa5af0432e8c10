"""Offline preference optimisation: DPO, IPO, conservative DPO, SimPO, ORPO on preference pairs, and KTO on
unpaired (or split) examples — one recipe on the supervised loop, the loss picked by ``algo.loss``.

A step: one forward of the policy over the concatenated ``[2B, L]`` batch (chosen rows then rejected rows) gives
each completion's log-probability summed over its completion tokens (SimPO / ORPO divide by the token count);
the reference log-probabilities come with the batch (``algo.reference=precompute``) or from a no-grad forward
(``on_the_fly``); the loss of :data:`~rlhfkit.algos.PREFERENCE_LOSSES` turns them into a scalar and the TRL metrics
(``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``,
``logps/rejected``; KTO also ``kl``).

The reference model is the policy with its LoRA adapter disabled under ``model.lora.enabled`` (no second copy),
else a frozen copy of ``ref_model`` (default: ``model.name``). Precomputed log-probabilities are cached in
``run_dir/reference_logps-<key>.pt`` under a hash of the reference model and the tokenised data, so a resumed run reads
them and a changed setup recomputes them. SimPO and ORPO use no reference model at all.

Departures, on purpose:

* KTO's mismatched pairs (prompt *i* with the completion of another example, for the reference point
  z0 = max(0, mean(pi - ref))) are fixed once at data preparation from a seeded permutation — as TRL does — rather
  than re-drawn inside each batch, so their reference log-probs can be precomputed as well. z0 is averaged over
  the global batch (gathered across processes), as in the paper.
* KTO accepts preference pairs: each pair becomes one desirable and one undesirable example (split after
  tokenisation, so the pair is remembered); held-out pairs then give the paired accuracy r_chosen > r_rejected.
  On unpaired examples ``rewards/accuracies`` is the fraction on the right side of the reference point.
* IPO is computed on summed log-probabilities (Azar et al. 2023, eq. 17), not TRL's length-averaged ones.
* Only the completion tokens go through the LM head, chunk by chunk (``forward.completion_stats``: no logits), and
  the model keeps only the hidden states from the last prompt token of the shortest prompt on (``logits_to_keep``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ... import files
from ...algos import PREFERENCE_LOSSES, kto_kl_estimate, kto_loss, masked_mean, masked_sum
from ...config import replace
from ...data import PreferenceCollator, UnpairedCollator
from ...errors import DataError
from ...models.loading import describe, is_peft, is_tiny, load_causal_lm, save_model
from ...rollout import eval_mode
from ...track.progress import held_out
from ..lifecycle.run import run_recipe
from ..shared.batches import gather_rows, load_records, to_device, tokenize
from ..shared.forward import IGNORE, completion_stats
from .loop import SupervisedJob, train_supervised

CACHE_GLOB = "reference_logps*.pt"  # one file per key; a finished run keeps only its own


def cache_path(run_dir: Path, key: str) -> Path:
    """The cache of reference log-probs for ``key``: named by the key, so a run with other data or another reference
    never overwrites an earlier run's cache before it has produced anything (stale ones go when a run finishes)."""
    return Path(run_dir) / f"reference_logps-{key[:16]}.pt"


# ─────────────────────────────────────────────── sequence log-probs ───────────────────────────────────────────


def sequence_logps(model, input_ids, attention_mask, completion_mask, start: int,
                   media: list | None = None, into: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs summed over each row's completion tokens [N] and the number of those tokens [N].

    ``start`` is the first position whose logits are needed (the last prompt token of the shortest prompt), so the
    LM head never runs over the shared prompt prefix. ``media``: the rows' prompt images (one Media or None each).
    ``into``: filled with per-row sums over the same tokens, no gradient, for TRL's metrics (:func:`token_metrics`):
    ``mean_logits``, ``top1`` (tokens that are the model's most likely one), ``entropy`` (absent when Liger's kernel
    computes the head).
    """
    # through the LM head in chunks, only the completion tokens (train/shared/forward.py): no [N, L, V] logits
    labels = torch.where(completion_mask.bool(), input_ids, IGNORE)
    extra = into is not None
    st = completion_stats(model, input_ids, attention_mask, labels, start=start, entropy="metric" if extra else False,
                          argmax=extra, mean_logits=extra, media=media)
    mask = completion_mask[:, start + 1:]
    if extra:
        with torch.no_grad():
            into["mean_logits"] = masked_sum(st.mean_logits, mask, dim=-1)
            into["top1"] = masked_sum((st.argmax == input_ids[:, start + 1:]).float(), mask, dim=-1)
            if st.entropy is not None:
                into["entropy"] = masked_sum(st.entropy.detach(), mask, dim=-1)
    return masked_sum(st.logprobs, mask, dim=-1), mask.sum(-1).to(st.logprobs.dtype)


def token_metrics(rows: dict, tokens: torch.Tensor, chosen: torch.Tensor, accuracy: bool) -> dict:
    """TRL 1.16's per-token metrics of a DPO / KTO batch from :func:`sequence_logps`'s per-row sums: ``entropy``
    (over every completion token), ``logits/chosen`` / ``logits/rejected`` (the mean logit over the vocabulary,
    averaged over the tokens of the chosen / rejected rows), ``mean_token_accuracy`` (``accuracy``: DPO's, over the
    chosen completions' tokens). ``tokens`` [N]: each row's; ``chosen`` [N] bool."""
    with torch.no_grad():
        chosen = chosen.bool()
        n_chosen, n_rejected = tokens[chosen].sum().clamp(min=1), tokens[~chosen].sum().clamp(min=1)
        out = {"logits/chosen": rows["mean_logits"][chosen].sum() / n_chosen,
               "logits/rejected": rows["mean_logits"][~chosen].sum() / n_rejected}
        if "entropy" in rows:
            out["entropy"] = rows["entropy"].sum() / tokens.sum().clamp(min=1)
        if accuracy:
            out["mean_token_accuracy"] = rows["top1"][chosen].sum() / n_chosen
    return out


# ─────────────────────────────────────────────────── batches ──────────────────────────────────────────────────


def _finish(batch: dict, examples: list[dict]) -> dict:
    batch["start"] = min(len(e["prompt_ids"]) for e in examples) - 1
    if all("ref_logps" in e for e in examples):
        batch["ref_logps"] = torch.tensor([e["ref_logps"] for e in examples], dtype=torch.float32)
    return batch


class PairCollator(PreferenceCollator):
    """:class:`PreferenceCollator`'s ``[2B, L]`` batch + ``start`` + precomputed ``ref_logps`` [B, 2] if any."""

    def __call__(self, examples: list[dict]) -> dict:
        return _finish(super().__call__(examples), examples)


class KTOCollator:
    """:class:`UnpairedCollator` batch of labelled completions, the ``kl_*`` batch of each prompt with its fixed
    mismatched completion, ``pair`` ids (-1: unpaired), ``start`` and precomputed ``ref_logps`` [B, 2] if any."""

    def __init__(self, pad_id: int):
        self.unpaired = UnpairedCollator(pad_id)

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.unpaired(examples)
        kl = self.unpaired([{**e, "completion_ids": e["kl_completion_ids"]} for e in examples])
        batch.update({f"kl_{k}": kl[k] for k in ("input_ids", "attention_mask", "completion_mask")})
        batch["pair"] = torch.tensor([e.get("pair", -1) for e in examples], dtype=torch.long)
        return _finish(batch, examples)


def unpair_items(pairs: list[dict]) -> list[dict]:
    """Tokenised pairs -> KTO examples: chosen (label True) and rejected (label False), both with the pair index."""
    out = []
    for k, p in enumerate(pairs):
        media = {"media": p["media"]} if p.get("media") is not None else {}
        out.append({"prompt_ids": p["prompt_ids"], "completion_ids": p["chosen_ids"], "label": True, "pair": k,
                    **media})
        out.append({"prompt_ids": p["prompt_ids"], "completion_ids": p["rejected_ids"], "label": False, "pair": k,
                    **media})
    return out


def assign_kl_partners(items: list[dict], seed: int, max_length: int) -> None:
    """Give each KTO example its mismatched completion: that of the previous example in a seeded permutation."""
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    for j, i in enumerate(order):
        room = max(1, max_length - len(items[i]["prompt_ids"]))
        items[i]["kl_completion_ids"] = list(items[order[j - 1]]["completion_ids"])[:room]


def load_preference_records(cfg, paired: bool) -> tuple[list[dict], list[dict]]:
    """(train, eval) records, read before any weights load: pairs, or for KTO what each file holds (unpaired
    records or pairs) unless data.format=preference."""
    if paired:  # data.format was checked against the loss when the config was built
        return load_records(cfg, "preference")
    detect = cfg if cfg.data.format == "preference" else replace(cfg, data={"format": "auto"})
    train_recs, eval_recs = load_records(detect, "auto")
    for label, recs in (("train", train_recs), ("eval", eval_recs)):
        kinds = {"preference" if "chosen" in r else "unpaired" if "label" in r else "other" for r in recs}
        if kinds - {"preference", "unpaired"}:
            raise DataError("KTO needs unpaired records (prompt, completion, label) or preference pairs",
                            where=cfg.data.train if label == "train" else cfg.data.eval,
                            fix="give unpaired.jsonl-style or preference.jsonl-style data")
    return train_recs, eval_recs


def load_items(run, cfg, tok, paired: bool, records: tuple[list[dict], list[dict]]
               ) -> tuple[list[dict], list[dict]]:
    """(train, eval) tokenised examples: pairs, or KTO examples (unpaired records, or pairs split in two).
    ``records``: those of :func:`load_preference_records` (which checked their kinds)."""
    train_recs, eval_recs = records
    if paired:
        return (tokenize(run, train_recs, "preference", tok, cfg, "train"),
                tokenize(run, eval_recs, "preference", tok, cfg, "eval"))
    out = []
    for label, recs in (("train", train_recs), ("eval", eval_recs)):
        kind = "preference" if recs and "chosen" in recs[0] else "unpaired"
        items = tokenize(run, recs, kind, tok, cfg, label)
        items = unpair_items(items) if items and "chosen_ids" in items[0] else items
        assign_kl_partners(items, cfg.train.seed + (label == "eval"), cfg.data.max_length)
        out.append(items)
    return out[0], out[1]


# ─────────────────────────────────────────────────── reference ────────────────────────────────────────────────


@dataclass
class Reference:
    """Reference log-probs [B, 2] of a batch — (chosen, rejected) for pairs, (completion, kl completion) for KTO:
    the ``ref_logps`` the batch carries when precomputed, else a no-grad forward of the frozen ``copy``, or of the
    policy with its LoRA adapter disabled (``copy`` None)."""

    accelerator: Any
    copy: Any = None

    @torch.no_grad()
    def sequence(self, policy, input_ids, attention_mask, completion_mask, start: int,
                 media: list | None = None) -> torch.Tensor:
        if self.copy is not None:
            return sequence_logps(self.copy, input_ids, attention_mask, completion_mask, start, media)[0]
        base = self.accelerator.unwrap_model(policy)
        if not is_peft(base):
            raise RuntimeError("no reference log-probs in the batch and no reference model to compute them")
        with base.disable_adapter(), eval_mode(policy):
            return sequence_logps(policy, input_ids, attention_mask, completion_mask, start, media)[0]

    def logps(self, policy, batch: dict) -> torch.Tensor:
        if "ref_logps" in batch:
            return batch["ref_logps"]
        s, media = batch["start"], batch.get("media")
        main = self.sequence(policy, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], s,
                             media)
        if "kl_input_ids" in batch:  # KTO: the labelled completions, then their mismatched pairs
            kl = self.sequence(policy, batch["kl_input_ids"], batch["kl_attention_mask"],
                               batch["kl_completion_mask"], s, media)
            return torch.stack([main, kl], dim=1)
        half = main.shape[0] // 2
        return torch.stack([main[:half], main[half:]], dim=1)


def _uses_adapter(cfg) -> bool:
    return cfg.model.lora.enabled and cfg.ref_model in (None, cfg.model.name)


def open_reference(run, cfg, tok) -> Reference:
    """The adapter-disabled policy under LoRA, else a frozen copy of ``ref_model or model.name``."""
    if _uses_adapter(cfg):
        return Reference(run.accelerator)
    mcfg = replace(cfg.model, name=cfg.ref_model or cfg.model.name, lora={"enabled": False, "qlora": False})
    copy, _ = load_causal_lm(mcfg, tokenizer=tok, device=run.device, seed=cfg.train.seed, trainable=False)
    run.print(f"[{cfg.recipe}] reference model {mcfg.name} (frozen copy)")
    return Reference(run.accelerator, copy.to(run.device))


def reference_key(cfg, train: list[dict], evals: list[dict]) -> str:
    """Hash of what the reference log-probs depend on: reference model (name, weight files, dtype) and data."""
    name = cfg.ref_model or cfg.model.name
    path = Path(name)
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.glob("*.safetensors")) \
        if path.is_dir() else []
    h = hashlib.sha256(json.dumps({"ref": name, "files": files, "dtype": cfg.model.dtype,
                                   "seed": cfg.train.seed if is_tiny(name) else None}).encode())
    for part, items in (("train", train), ("eval", evals)):
        h.update(part.encode())
        for e in items:
            h.update(json.dumps([e["prompt_ids"], e.get("chosen_ids"), e.get("rejected_ids"),
                                 e.get("completion_ids"), e.get("kl_completion_ids"),
                                 getattr(e.get("media"), "key", None)]).encode())
    return h.hexdigest()


def _read_cache(path: Path, key: str) -> dict | None:
    if not path.is_file():
        return None
    cache = torch.load(path, map_location="cpu", weights_only=True)
    return cache if cache.get("key") == key else None


@torch.no_grad()
def _reference_table(run, reference: Reference, policy, collate, items: list[dict], batch_size: int) -> torch.Tensor:
    rows = [torch.zeros(0, 2)]
    with eval_mode(policy), run.accelerator.autocast():
        for s in range(0, len(items), batch_size):
            batch = collate(items[s: s + batch_size])
            batch.pop("ref_logps", None)  # always compute, even over examples that carry older values
            rows.append(reference.logps(policy, to_device(batch, run.device)).float().cpu())
    return torch.cat(rows)


def precompute_reference(run, cfg, policy, tok, collate, train: list[dict], evals: list[dict],
                         key: str | None = None) -> bool:
    """Store ``ref_logps`` on every train / eval example, computed once (batched, no grad) and cached in the run
    directory under ``key`` (default :func:`reference_key`); a cache with the same key is reused. Returns True when
    they were computed."""
    key, acc = key or reference_key(cfg, train, evals), run.accelerator
    path = cache_path(run.run_dir, key)
    computed = False
    acc.wait_for_everyone()
    if run.is_main and _read_cache(path, key) is None:
        reference = open_reference(run, cfg, tok)
        bs = cfg.train.eval_batch_size or cfg.train.batch_size
        cache = {"key": key, "train": _reference_table(run, reference, policy, collate, train, bs),
                 "eval": _reference_table(run, reference, policy, collate, evals, bs)}
        files.save_torch(cache, path, what="the reference log-probs cache", fix="rerun")
        del reference  # a frozen copy is freed here: training reads the cached values
        computed = True
    acc.wait_for_everyone()
    cache = _read_cache(path, key)
    for items, table in ((train, cache["train"]), (evals, cache["eval"])):
        for e, row in zip(items, table.tolist()):
            e["ref_logps"] = row
    run.print(f"[{cfg.recipe}] reference log-probs {'computed and cached in' if computed else 'read from'} {path}")
    return computed


# ───────────────────────────────────────────────────── losses ─────────────────────────────────────────────────
PAIR_COLUMNS = ("chosen", "rejected", "chosen_tokens", "rejected_tokens", "ref_chosen", "ref_rejected")


def paired_loss(algo, lp: dict) -> tuple[torch.Tensor, dict]:
    """The loss ``algo.loss`` of the registry over the log-prob dict of :func:`pair_logps`."""
    return PREFERENCE_LOSSES[algo.loss].from_logps(lp, algo)


def pair_logps(model, batch: dict, reference: Reference | None, into: dict | None = None) -> dict:
    """One forward over the [2B, L] batch -> summed log-probs and token counts of both sides (+ reference);
    ``into``: :func:`sequence_logps`'s."""
    sums, counts = sequence_logps(model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"],
                                  batch["start"], batch.get("media"), into)
    half = sums.shape[0] // 2
    lp = {"chosen": sums[:half], "rejected": sums[half:], "chosen_tokens": counts[:half],
          "rejected_tokens": counts[half:]}
    ref = reference.logps(model, batch) if reference is not None else torch.zeros_like(sums).view(2, half).T
    lp["ref_chosen"], lp["ref_rejected"] = ref[:, 0], ref[:, 1]
    return lp


def kto_objective(algo, logps, ref, labels, kl_logps, kl_ref, gather=None) -> tuple[torch.Tensor, dict]:
    """KTO loss and stats; z0 from the mismatched pairs (summed over processes with ``gather`` when given)."""
    if gather is not None:
        kl_logps, kl_ref = gather(kl_logps.detach()), gather(kl_ref)
    z0 = kto_kl_estimate(kl_logps, kl_ref)
    loss, stats = kto_loss(logps, ref, labels, z0, beta=algo.beta, desirable_weight=algo.kto_desirable_weight,
                           undesirable_weight=algo.kto_undesirable_weight)
    with torch.no_grad():
        labels = labels.bool()
        stats["rewards/margins"] = stats["rewards/chosen"] - stats["rewards/rejected"]
        stats["rewards/accuracies"] = ((logps - ref > z0) == labels).float().mean()
        stats["logps/chosen"] = masked_mean(logps.detach(), labels)
        stats["logps/rejected"] = masked_mean(logps.detach(), ~labels)
    return loss, stats


def kto_logps(model, batch: dict, reference: Reference, into: dict | None = None) -> tuple[torch.Tensor, ...]:
    """(logps [B] with grad, ref [B], kl logps [B] without grad, kl ref [B]); ``into``: :func:`sequence_logps`'s,
    with the rows' token counts (``tokens``)."""
    s, media = batch["start"], batch.get("media")
    logps, tokens = sequence_logps(model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], s,
                                   media, into)
    if into is not None:
        into["tokens"] = tokens
    with torch.no_grad():
        kl_logps, _ = sequence_logps(model, batch["kl_input_ids"], batch["kl_attention_mask"],
                                     batch["kl_completion_mask"], s, media)
    ref = reference.logps(model, batch)
    return logps, ref[:, 0], kl_logps, ref[:, 1]


def make_forward(run, cfg, reference: Reference | None):
    """The loss function of the loop: (model, batch) -> (loss, detached stats)."""
    algo = cfg.algo
    if not PREFERENCE_LOSSES[algo.loss].paired:
        gather = run.accelerator.gather if run.world_size > 1 else None

        def kto_forward(model, batch):
            rows: dict = {}
            logps, ref, kl_logps, kl_ref = kto_logps(model, batch, reference, rows)
            loss, stats = kto_objective(algo, logps, ref, batch["label"], kl_logps, kl_ref, gather)
            return loss, {**stats, **token_metrics(rows, rows["tokens"], batch["label"], accuracy=False)}

        return kto_forward

    def paired_forward(model, batch):
        rows: dict = {}
        lp = pair_logps(model, batch, reference, rows)
        loss, stats = paired_loss(algo, lp)
        tokens = torch.cat([lp["chosen_tokens"], lp["rejected_tokens"]])
        chosen = torch.arange(tokens.shape[0], device=tokens.device) < lp["chosen_tokens"].shape[0]
        return loss, {**stats, **token_metrics(rows, tokens, chosen, accuracy=True)}

    return paired_forward


# ─────────────────────────────────────────────────── evaluation ───────────────────────────────────────────────


def _paired_accuracy(rewards: torch.Tensor, labels: torch.Tensor, pair: torch.Tensor) -> torch.Tensor | None:
    """Fraction of pairs (split into KTO examples) whose chosen reward beats the rejected one's."""
    if not bool((pair >= 0).any()):
        return None
    n = int(pair.max()) + 1
    chosen = torch.full((n,), float("nan"), device=rewards.device)
    rejected = chosen.clone()
    chosen[pair[(pair >= 0) & labels]] = rewards[(pair >= 0) & labels]
    rejected[pair[(pair >= 0) & ~labels]] = rewards[(pair >= 0) & ~labels]
    both = ~(chosen.isnan() | rejected.isnan())
    return (chosen[both] > rejected[both]).float().mean()


@torch.no_grad()
def evaluate(run, cfg, reference: Reference | None, model, batches: list[dict]) -> dict:
    """Loss and metrics over the whole held-out set (every process's examples); accuracy = fraction of pairs
    whose implicit reward of chosen beats rejected; TRL's token metrics (:func:`token_metrics`) over every token."""
    algo, acc = cfg.algo, run.accelerator
    paired = PREFERENCE_LOSSES[algo.loss].paired
    rows, has_entropy = [], True
    with eval_mode(model):
        for batch in batches:
            sums: dict = {}
            if not paired:
                logps, ref, kl_logps, kl_ref = kto_logps(model, batch, reference, sums)
                cols = [logps, ref, kl_logps, kl_ref, batch["label"].float(), batch["pair"].float(), sums["tokens"]]
            else:
                lp = pair_logps(model, batch, reference, sums)
                cols = [lp[k].float() for k in PAIR_COLUMNS]
            has_entropy = has_entropy and "entropy" in sums
            extra = [sums["mean_logits"], sums["top1"], sums.get("entropy", torch.zeros_like(sums["top1"]))]
            if paired:  # [2B] per row -> [B] per pair: the chosen half, then the rejected half
                extra = [half for t in extra for half in t.chunk(2)]
            rows.append(torch.stack([*cols, *extra], dim=1).float())
    width = (7 + 3) if not paired else len(PAIR_COLUMNS) + 6
    table = gather_rows(acc, torch.cat(rows) if rows else torch.zeros(0, width, device=acc.device))
    if not paired:
        logps, ref, kl_logps, kl_ref, labels, pair, tokens, ml, top1, ent = table.unbind(1)
        loss, stats = kto_objective(algo, logps, ref, labels.bool(), kl_logps, kl_ref)
        paired = _paired_accuracy(logps - ref, labels.bool(), pair.long())
        if paired is not None:
            stats["rewards/accuracies"] = paired
        chosen, accuracy = labels.bool(), False
    else:
        lp = dict(zip(PAIR_COLUMNS, table[:, :len(PAIR_COLUMNS)].unbind(1)))
        loss, stats = paired_loss(algo, lp)
        ml_c, ml_r, top_c, top_r, ent_c, ent_r = table[:, len(PAIR_COLUMNS):].unbind(1)
        ml, top1, ent = torch.cat([ml_c, ml_r]), torch.cat([top_c, top_r]), torch.cat([ent_c, ent_r])
        tokens = torch.cat([lp["chosen_tokens"], lp["rejected_tokens"]])
        chosen, accuracy = torch.arange(tokens.shape[0], device=tokens.device) < ml_c.shape[0], True
    sums = {"mean_logits": ml, "top1": top1, **({"entropy": ent} if has_entropy else {})}
    stats.update(token_metrics(sums, tokens, chosen, accuracy))
    return {"loss": loss.item(), **{k: float(v) for k, v in stats.items()}}


# ───────────────────────────────────────────────────── recipe ─────────────────────────────────────────────────


def run_preference(cfg) -> dict:
    """Train with the loss ``cfg.algo.loss``, evaluate on held-out pairs, save; returns the final metrics
    (``eval/rewards/accuracies``, ``eval/rewards/margins``, ``train/loss``, …)."""
    # 1. data records first (a mistake in them costs seconds and touches nothing), then the run directory (locked),
    #    accelerator, seed; a finished run is not trained again
    return run_recipe(cfg, _train_preference,
                      prepare=lambda c: load_preference_records(c, PREFERENCE_LOSSES[c.algo.loss].paired))


def _train_preference(cfg, run, records) -> dict:
    spec = PREFERENCE_LOSSES[cfg.algo.loss]
    name = cfg.recipe
    # 2. policy and tokenizer
    model, tok = load_causal_lm(cfg.model, device=run.device, seed=cfg.train.seed)
    model.to(run.device)
    run.print(f"[{name}] {cfg.algo.loss} from {cfg.model.name}: {describe(model)}")
    # 3. data: pairs -> prompt / chosen / rejected ids (KTO: labelled completions + their mismatched pairs)
    train, evals = load_items(run, cfg, tok, spec.paired, records)
    collate = PairCollator(tok.pad_token_id) if spec.paired else KTOCollator(tok.pad_token_id)
    # 4. reference log-probs: cached on the examples once, or a reference forward each step (none for SimPO / ORPO)
    reference, cache = None, None
    if spec.needs_reference and cfg.algo.reference == "precompute":
        key = reference_key(cfg, train, evals)
        cache = cache_path(run.run_dir, key)
        precompute_reference(run, cfg, model, tok, collate, train, evals, key=key)
        reference = Reference(run.accelerator)  # reads the batch's ref_logps
    elif spec.needs_reference:
        reference = open_reference(run, cfg, tok)
    # 5. the loop
    job = SupervisedJob(
        name=name, model=model, tokenizer=tok, train_items=train, collate=collate,
        loss_fn=make_forward(run, cfg, reference), eval_items=evals,
        eval_fn=lambda m, b: evaluate(run, cfg, reference, m, b), show=("loss", "accuracies", "margins"),
        on_save=lambda m, d: save_model(m, tok, d),
    )
    metrics = train_supervised(run, job)
    if run.is_main:  # finished: caches of other keys (earlier runs in this directory) are stale now
        for stale in run.run_dir.glob(CACHE_GLOB):
            if stale != cache:
                files.remove(stale)
    # 6. summary (the report was written when the run finished)
    if "eval/rewards/accuracies" in metrics:
        run.print(f"[{name}] done: model saved to {run.run_dir}; held-out preference accuracy "
                  f"{held_out(metrics['eval/rewards/accuracies'], len(evals))}, margin "
                  f"{metrics['eval/rewards/margins']:.3f}")
    return metrics
