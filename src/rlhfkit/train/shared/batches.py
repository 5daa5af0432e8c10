"""Pieces every recipe shares: loading the configured data (with a held-out split), tokenising it under the length
policy with the counts printed, the seeded per-epoch batch plan of both loops, the forward pass that gives per-token
log-probs of the labels, averaging and reducing step metrics over processes, moving a batch to a device, and the
end-of-run report."""

from __future__ import annotations

import random

import torch

from ...data import LengthPolicy, load_dataset_records, tokenize_dataset
from ...data.chat import plain_view
from ...errors import ConfigError, DataError, say
from ...track.progress import MIN_HELD_OUT
from .forward import completion_stats


def load_records(cfg, kind: str) -> tuple[list[dict], list[dict]]:
    """(train, eval) records of ``kind``. Without ``data.eval``, ``data.eval_fraction`` of the training records are
    held out (a seeded shuffle, so every process and every resumed run holds out the same ones)."""
    d = cfg.data
    if not d.train:
        raise ConfigError("no training data given", where="data.train",
                          fix="set data.train=path/to/file.jsonl (see `rlhfkit data make quickstart --out data/`)")
    fmt = kind if d.format == "auto" else d.format
    train = load_dataset_records(d.train, fmt, fields=d.fields or None, split=d.split, limit=d.limit)
    if not train:
        raise DataError("no records", where=d.train, fix="check the file / split")
    if d.eval:
        evals = load_dataset_records(d.eval, fmt, fields=d.fields or None, split=d.eval_split)
    elif d.eval_fraction > 0 and len(train) >= 10:
        idx = list(range(len(train)))
        random.Random(cfg.train.seed).shuffle(idx)
        n_eval = max(1, int(len(train) * d.eval_fraction))
        held = set(idx[:n_eval])
        evals = [train[i] for i in sorted(held)]
        train = [r for i, r in enumerate(train) if i not in held]
    else:
        evals = []
    check_images_fit(cfg, train + evals)
    if 0 < len(evals) < MIN_HELD_OUT:  # before any weights load: its accuracy would read 1.000 on one pair
        say(f"[data] the held-out split has {len(evals)} record{'s' if len(evals) > 1 else ''}: its metrics move in "
            f"steps of 1/{len(evals)} (hold out {MIN_HELD_OUT} or more: data.eval_fraction, data.eval)")
    return train, evals


def check_images_fit(cfg, records: list[dict]) -> None:
    """Records with images need a vision-language model (read from its ``config.json``, before any weights) and a
    run that handles them: one line otherwise, naming the first such record and what is not built."""
    first = next((r for r in records if r.get("images")), None)
    if first is None:
        return
    from ...models.vision import processor_difference, vlm_type

    where = getattr(first, "where", "data")
    name = cfg.model.name
    if name and vlm_type(str(name)) is None:
        raise DataError(f"the record has {len(first['images'])} image(s) but {name} is a text model", where=where,
                        fix="train a vision-language model (Qwen2.5-VL, Gemma 3, LLaVA, ...), or drop the images")
    refused = [("data.packing", getattr(getattr(cfg, "data", None), "packing", False)),
               ("env.name", getattr(getattr(cfg, "env", None), "name", None)),
               ("algo.async.max_staleness", getattr(getattr(getattr(cfg, "algo", None), "async_", None),
                                                    "max_staleness", 0))]
    for key, value in refused:
        if value:
            raise ConfigError(f"{key}={value} with images is not built (the data has images: {where})", where=key,
                              fix=f"unset {key}, or use data without images")
    teacher = getattr(getattr(cfg, "teacher", None), "model", None)
    if teacher:  # the teacher reads the student's image tokens: it must expand images as the student's processor
        differs = processor_difference(str(name), str(teacher))
        if differs:
            raise ConfigError(f"the data has images and the teacher's processor differs from the student's "
                              f"({differs}): distilling across processors is not built", where="teacher.model",
                              fix="use a teacher of the student's family and image processor settings")


def model_named(mcfg, name: str):
    """The model section ``mcfg`` for another model ``name`` (a reference, a teacher, a reward model, a critic): its
    GGUF file name kept only for the same model."""
    from ...config import replace

    return replace(mcfg, name=name, gguf_file=None if name != mcfg.name else mcfg.gguf_file)


def length_policy(cfg) -> LengthPolicy:
    d = cfg.data
    return LengthPolicy(max_length=d.max_length, max_prompt_length=d.max_prompt_length, on_overflow=d.overflow)


def tokenize(run, records: list[dict], kind: str, tok, cfg, label: str,
             completion_only: bool | None = True) -> list[dict]:
    """Tokenise and print the kept / truncated / dropped counts (never silent). Plain-string records (TRL's standard
    format) go through the chat template as user / assistant turns (``data.plain_text=template``, said once), or
    as they are (``raw``: :func:`~rlhfkit.data.chat.plain_view`, as TRL tokenises them)."""
    if not records:
        return []
    tok = text_tokenizer(run, records, kind, tok, cfg, label)
    examples, stats = tokenize_dataset(records, kind, tok, length_policy(cfg), completion_only=completion_only)
    msg = f"[data] {label}: {stats['kept']} records"
    if stats["truncated"] or stats["dropped"]:
        msg += (f" ({stats['truncated']} truncated, {stats['dropped']} dropped by data.max_length="
                f"{cfg.data.max_length} / data.max_prompt_length={cfg.data.max_prompt_length}, "
                f"data.overflow={cfg.data.overflow})")
    run.print(msg)
    cut = stats["truncated"] + stats["dropped"]
    if cut * 2 >= len(records):  # most of the data cut: the run trains on something other than the data
        run.print(f"[data] warning: {cut} of the {len(records)} {label} records do not fit data.max_length="
                  f"{cfg.data.max_length} (prompts are cut from the left, completions from the right): the model "
                  "trains on cut text; raise data.max_length (and data.max_prompt_length), or shorten the records")
    if run.sink is not None:
        run.sink.log({f"data/{label}_{k}": v for k, v in stats.items()}, step=0)
    return examples


def text_tokenizer(run, records: list[dict], kind: str, tok, cfg, label: str):
    """The tokenizer ``records`` are rendered with: ``tok``, or for plain-string records with
    ``data.plain_text=raw`` its :func:`~rlhfkit.data.chat.plain_view`; with ``template`` (rlhfkit's default) one
    line says that plain strings are templated, at the first data of a run."""
    # plain strings: records a source marked so (data.sources: the row gave text, not messages); unmarked: as they are
    plain = bool(records) and getattr(records[0], "conversational", None) is False and \
        not (kind == "sft" and "text" in records[0])
    if not plain:
        return tok
    if getattr(cfg.data, "plain_text", "template") == "raw":
        return plain_view(tok)
    if label in ("train", "prompts"):
        run.print(f"[data] {label}: plain strings, each a user / assistant turn of the chat template "
                  "(data.plain_text=template; TRL feeds them raw: data.plain_text=raw)")
    return tok


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The seeded permutation of ``n`` items for ``epoch`` (the same on every process and in a resumed run)."""
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def plan_batches(n: int, micro_batch: int, world: int, seed: int, epoch: int, rank: int,
                 drop_last: bool = True) -> list[list[int]]:
    """This rank's micro-batches for one epoch: a seeded permutation cut into global batches of micro*world, each
    split by rank. The tail that does not fill a global batch is dropped (``drop_last``), or kept: on one process as
    a short batch, on several filled from the start of the order so every rank steps in lock-step with a batch of
    the same size (accelerate's ``even_batches``, which TRL's dataloaders use)."""
    order = epoch_order(n, seed, epoch)
    global_batch = micro_batch * world
    full = len(order) // global_batch if drop_last else -(-len(order) // global_batch)
    if not drop_last and world > 1 and len(order) % global_batch:
        order = order + order[: global_batch - len(order) % global_batch]
    return [order[b * global_batch + rank * micro_batch: b * global_batch + (rank + 1) * micro_batch]
            for b in range(full)]


def completion_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        position_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Log-prob of each token given its prefix: [B, T-1] for tokens 1..T-1, from the hidden states through the LM
    head in chunks (no [B, T, V] logits: ``forward.completion_stats``); ``labels`` [B, T] (default ``input_ids``):
    -100 where a token is not wanted (not computed; 0 there)."""
    return completion_stats(model, input_ids, attention_mask, labels, position_ids=position_ids).logprobs


def gather_rows(acc, rows: torch.Tensor) -> torch.Tensor:
    """Rows [n, k] of every process (different n allowed, 0 too), each once, in process order."""
    if acc.num_processes == 1:
        return rows
    valid = torch.ones(rows.shape[0], 1, dtype=rows.dtype, device=rows.device)
    every = acc.gather(acc.pad_across_processes(torch.cat([rows, valid], dim=1), dim=0))
    return every[every[:, -1] > 0, :-1]


# Step metrics that are counts (summed over processes); every other scalar is a per-process mean over equal shares
SUMMED_METRICS = frozenset({"rewards/dropped", "rollout/degenerate_groups", "rollout/degenerate_groups_filled"})
# Prefixes reduced otherwise: a step waits for its slowest process (time/: the largest), throughputs add up
MAX_PREFIXES, SUM_PREFIXES = ("time/",), ("throughput/",)


def reduce_metrics(acc, metrics: dict) -> dict:
    """One step's scalar metrics, the same on every process: the processes' values averaged (each process holds
    the same number of samples, so the mean of their means is the global mean), summed for the counts of
    :data:`SUMMED_METRICS` and ``throughput/`` keys, the largest for ``*_max`` and ``time/`` keys (the step waits for
    the slowest process) and the smallest for ``*_min`` keys. A key some process lacks
    is reduced over those that have it. Metrics already computed on gathered tensors are the same everywhere and
    come back unchanged. Statistics that do not reduce this way (a percentile) must be computed on gathered data
    before. One ``all_gather_object`` per call; on one process ``metrics`` comes back as is."""
    if acc.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object

    every = gather_object([{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}])
    out = dict(metrics)
    for key in set().union(*every):
        values = [m[key] for m in every if key in m]
        if key in SUMMED_METRICS or key.endswith(("/timeouts", "/errors")) or key.startswith(SUM_PREFIXES):
            out[key] = sum(values)
        elif key.endswith("_max") or key.startswith(MAX_PREFIXES):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def kl_per_token(metrics: dict) -> dict:
    """``metrics`` (reduced over the processes) with ``objective/kl_per_token``, the KL to the reference averaged
    over every response token of the step (TRL 1.16's ``kl``: sum over tokens / count), from ``objective/kl`` (per
    answer) and the ``objective/kl_tokens`` it is divided by, which leaves. Each process holds as many answers, so
    the ratio of the two process means is the ratio of the global sums."""
    tokens = metrics.pop("objective/kl_tokens", None)
    if tokens is not None and "objective/kl" in metrics:
        metrics["objective/kl_per_token"] = metrics["objective/kl"] / tokens if tokens > 0 else 0.0
    return metrics


def mean_stats(accelerator, stats: list[dict]) -> dict[str, float]:
    """Each stat averaged over the micro-batches of one update, then over processes (one all-reduce; every process
    must call it, with the same keys)."""
    keys = list(stats[0])
    local = torch.stack([torch.stack([torch.as_tensor(s[k], dtype=torch.float32, device=accelerator.device).mean()
                                      for s in stats]).mean() for k in keys])
    return dict(zip(keys, accelerator.reduce(local, "mean").tolist()))


def to_device(batch: dict, device) -> dict:
    """The batch with every tensor on ``device`` (other values as they are)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
