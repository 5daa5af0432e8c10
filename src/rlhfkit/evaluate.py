"""Evaluating and talking to a model: ``rlhfkit eval`` and ``rlhfkit generate``.

:func:`evaluate` generates one answer per prompt and reports, as a table and a JSON file:

* the **gold metric** of a built-in task (``task="quickstart"``: exact-answer accuracy computed by a program);
* the mean of each **reward function** (``package.module:function``, ``file.py:function`` or a built-in name);
* the mean **reward-model score** of the answers;
* the **win rate** against a reference model's answers to the same prompts, judged pairwise by the reward model
  (a win when the model's answer scores higher, ties count half), with a 95 % Wilson score interval.

Everything that can fail on user input (data file, function specs, model paths) is loaded before the first token
is generated. Sampling is at temperature 1 by default — the policy as a distribution, the quantity RL optimises
(:mod:`rlhfkit.tasks.gold`); ``temperature=0`` is greedy.

:func:`chat` is the loop behind ``rlhfkit generate``: the model's chat template, generation that stops at EOS,
and the conversation kept across turns.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from . import files
from .data.formats import message_text
from .errors import ConfigError, DataError, ModelError, RewardError

Z95 = 1.959963984540054  # the 97.5 % quantile of the standard normal


# ─────────────────────────────────────────────────── statistics ───────────────────────────────────────────────


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson, 1927; Brown, Cai & DasGupta, 2001, eq. 4).

    ``center = (p + z²/2n) / (1 + z²/n)``, ``half = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²)`` with ``p = k/n``.
    ``successes`` may be fractional (ties counted half). Unlike the normal approximation it stays inside [0, 1]
    and is not degenerate at k = 0 or k = n. ``n = 0`` gives the uninformative (0, 1).
    """
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def win_rate(scores: Sequence[float], reference_scores: Sequence[float]) -> dict:
    """Pairwise comparison: wins / ties / losses of ``scores`` against ``reference_scores``, the rate (ties count
    half) and its 95 % Wilson interval."""
    if len(scores) != len(reference_scores):
        raise ValueError(f"{len(scores)} scores vs {len(reference_scores)} reference scores")
    wins = sum(1 for a, b in zip(scores, reference_scores) if a > b)
    ties = sum(1 for a, b in zip(scores, reference_scores) if a == b)
    n = len(scores)
    successes = wins + 0.5 * ties
    lo, hi = wilson_interval(successes, n)
    return {"n": n, "wins": wins, "ties": ties, "losses": n - wins - ties,
            "rate": successes / n if n else float("nan"), "ci95": [lo, hi]}


# ─────────────────────────────────────────────────── loading ──────────────────────────────────────────────────


def _device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _architectures(name: str) -> list[str]:
    cfg = Path(name).expanduser() / "config.json"
    if cfg.is_file():
        try:
            return list(json.loads(cfg.read_text()).get("architectures") or [])
        except (OSError, ValueError):
            return []
    return []


def is_reward_model_dir(name: str) -> bool:
    """True when ``name`` is a directory holding a sequence-classification (reward / value) model."""
    return any(a.endswith("ForSequenceClassification") for a in _architectures(name))


def _check_exists(name: str, what: str, flag: str) -> None:
    """A path-looking name that does not exist is a one-line error (instead of a hub lookup message)."""
    from .models.loading import is_tiny

    if is_tiny(name):
        return
    p = Path(name).expanduser()
    if p.exists():
        return
    parts = Path(name).parts
    path_like = (name.startswith((".", "/", "~")) or p.suffix == ".gguf"
                 or (len(parts) > 1 and Path(parts[0]).exists()))  # runs/sft when runs/ exists
    if path_like:
        raise ModelError(f"{what} not found: {name}", where=flag,
                         fix="give a model or run directory (one a stage wrote), a cached hub name or tiny")


def load_policy(name: str, device: str | torch.device | None = None, flag: str = "model"):
    """A causal LM (merged when ``name`` is a LoRA adapter directory) and its tokenizer, in eval mode."""
    from .config import ModelConfig
    from .models.loading import load_causal_lm

    _check_exists(str(name), "model", flag)
    if is_reward_model_dir(str(name)):
        raise ModelError(f"{name} is a reward model (sequence classifier), not a language model", where=flag,
                         fix="give a policy / SFT model here; pass reward models with --reward-model")
    dev = _device(str(device) if device is not None else None)
    model, tok = load_causal_lm(ModelConfig(name=str(name)), device=dev, trainable=False)
    return model.to(dev), tok


def load_reward_model(name: str, device: str | torch.device | None = None, flag: str = "--reward-model"):
    """A 1-label sequence-classification reward model and its tokenizer, in eval mode."""
    from .config import ModelConfig
    from .models.loading import load_scalar_model
    from .models.tokenizer import load_tokenizer

    _check_exists(str(name), "reward model", flag)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ModelError(f"reward model directory not found: {name}", where=flag,
                         fix="give the run directory of `rlhfkit rm` (it holds config.json)")
    if not is_reward_model_dir(str(path)):
        archs = ", ".join(_architectures(str(path))) or "no architecture"
        raise ModelError(f"{name} is not a reward model ({archs})", where=flag,
                         fix="give a directory written by `rlhfkit rm` (a ...ForSequenceClassification model)")
    tok = load_tokenizer(str(path))
    dev = _device(str(device) if device is not None else None)
    model = load_scalar_model(str(path), ModelConfig(name=str(path)), tokenizer=tok, device=dev, trainable=False)
    return model.to(dev), tok


def load_prompts(data: str, n: int | None = None, fields: dict[str, str] | None = None) -> list[dict]:
    """Prompt records (``{"prompt": [messages], **other fields}``, each knowing its ``where``); the first ``n``.
    ``fields`` maps canonical names to your columns, as ``data.fields`` does for training (``--field``)."""
    from .data import load_dataset_records

    if n is not None and n < 1:
        raise ConfigError(f"--n must be at least 1, got {n}", where="--n", fix="give a positive number")
    try:
        records = load_dataset_records(str(data), "prompt", fields=fields or None, limit=n)
    except DataError as err:  # the training key is data.fields.X; here the flag is --field X=...
        raise DataError(err.message, where=err.where,
                        fix=(err.fix or "").replace("data.fields.", "--field ")) from None
    if not records:
        raise DataError("no prompts", where=str(data), fix="give a file with at least one prompt record")
    return records


def _prompt_arg(record: dict):
    """What reward functions receive as the prompt: the text of a single user turn, else the message list."""
    msgs = record["prompt"]
    if len(msgs) == 1 and msgs[0]["role"] == "user" and isinstance(msgs[0]["content"], str):
        return msgs[0]["content"]
    return msgs


def _last_user_text(record: dict) -> str:
    return message_text(next(m["content"] for m in reversed(record["prompt"]) if m["role"] == "user"))


# tasks whose prompts can be recognised, to suggest --task (never applied silently)
_TASK_PATTERNS = {"quickstart": re.compile(r"^shout: [a-z]+$")}


def suggest_task(records: Sequence[dict]) -> str | None:
    """The built-in task whose prompts these look like (checked on the first 50), or None."""
    texts = [_last_user_text(r) for r in records[:50]]
    for name, pattern in _TASK_PATTERNS.items():
        if texts and all(pattern.match(t) for t in texts):
            return name
    return None


# ─────────────────────────────────────────────────── generation ───────────────────────────────────────────────


def engine_for(engine, model, tok, batch_size: int, engine_kwargs: dict | None = None):
    """``engine`` itself, or the rollout engine of that name (``auto``, ``hf``, ``static``; its settings
    ``engine_kwargs``) built for ``model``'s tokenizer and EOS ids, with micro-batches of ``batch_size``."""
    from .rollout import make_engine

    if not isinstance(engine, str):
        return engine
    check_engine_flags(engine, engine_kwargs)
    return make_engine(engine, tok, model, batch_size=max(1, batch_size), engine_kwargs=engine_kwargs)


def check_engine_flags(engine, engine_kwargs: dict | None = None) -> None:
    """A ConfigError naming ``--engine`` / ``--engine-kwargs`` for an unknown engine or setting (the recipes' keys
    are generation.engine / generation.engine_kwargs), before any weights load."""
    from .rollout import check_engine

    if isinstance(engine, str):
        try:
            check_engine(engine, engine_kwargs)
        except ConfigError as err:
            flag = "--engine" if err.where == "generation.engine" else "--engine-kwargs"
            raise ConfigError(err.message, where=flag, fix=err.fix) from None


def generate_answers(model, tok, prompts: Sequence[list[dict]], *, max_new_tokens: int, temperature: float,
                     top_p: float = 1.0, seed: int | None = 0, batch_size: int = 64,
                     wheres: Sequence[str] | None = None, engine="auto", images: Sequence | None = None) -> dict:
    """One answer per conversation: ``{"texts": [...], "ended": [bool], "lengths": [int]}`` (ended = stopped at
    EOS rather than at ``max_new_tokens``). ``engine``: a built rollout engine, or the name of one to build.
    ``images``: each conversation's images (a list of references or None; a vision-language model)."""
    from .data.chat import render_prompt_media
    from .rollout import SamplingParams, decode_responses

    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}", where="--max-new-tokens",
                          fix="give a positive number")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}", where="--temperature",
                          fix="use 0 for greedy decoding or a positive temperature")
    images = list(images) if images is not None else [None] * len(prompts)
    encoded = [render_prompt_media(tok, m, imgs, where=wheres[i] if wheres else f"prompt {i}")
               for i, (m, imgs) in enumerate(zip(prompts, images))]
    ids, media = [e[0] for e in encoded], [e[1] for e in encoded]
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int):
        for i, row in enumerate(ids):
            if len(row) >= limit:
                raise DataError(f"the prompt has {len(row)} tokens; the model's context is {limit}",
                                where=wheres[i] if wheres else f"prompt {i}",
                                fix="shorten the prompt or use a model with a longer context")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    rollout = engine_for(engine, model, tok, batch_size).generate(model, ids, params, seed=seed, media=media)
    return {"texts": decode_responses(tok, rollout), "ended": rollout.ended.cpu().tolist(),
            "lengths": rollout.lengths.cpu().tolist()}


def play_answers(model, tok, records: Sequence[dict], env_cls: type, env_spec: str, env_kwargs: dict, *,
                 max_new_tokens: int, temperature: float, max_turns: int, max_total_tokens: int, seed: int | None = 0,
                 batch_size: int = 64, engine="auto") -> dict:
    """One multi-turn episode per record with the environment (``--env``), played by the training's episode code:
    ``{"texts": the final assistant turns, "ended", "lengths": episode tokens, "env": {metric: mean},
    "transcripts": the messages after each prompt}``. The environment's metrics are those the training logs as
    ``env/*`` (its own ``metrics()``, plus turns and episode reward)."""
    from .config import EnvConfig
    from .envs.episodes import episode_metrics, run_episodes
    from .envs.host import EnvCalls
    from .rollout import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    rows = [dict(r) for r in records]  # prompt as messages and every other field, as training's rows
    with torch.no_grad(), EnvCalls(env_spec, env_cls, env_kwargs, workers=EnvConfig.workers,
                                   timeout_s=EnvConfig.timeout_s) as envs:  # training's limits, at their defaults
        _, episodes = run_episodes(
            engine_for(engine, model, tok, batch_size), model, tok, envs, rows, params=params,
            seed=0 if seed is None else seed, max_turns=max_turns, max_total_tokens=max_total_tokens)
        counts = envs.take_counts()
    finals = [next((m["content"] for m in reversed(e.messages) if m["role"] == "assistant"), "") for e in episodes]
    return {"texts": finals, "ended": [e.ended for e in episodes], "lengths": [len(e.ids) for e in episodes],
            "env": episode_metrics(episodes, counts), "transcripts": [e.messages[e.n_first:] for e in episodes]}


# ─────────────────────────────────────────────────── evaluation ───────────────────────────────────────────────


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def default_out(model: str) -> Path:
    p = Path(model).expanduser()
    return p / "eval.json" if p.is_dir() else Path("eval.json")


_NOT_PROMPT_FIELDS = ("completion", "chosen", "rejected", "text", "label")  # what a prompt file does not carry


def run_fields(model: str) -> dict[str, str]:
    """The ``data.fields`` mapping of the run that wrote ``model`` (its ``config.yaml``), for the columns a prompt
    file has (the prompt / messages and extra fields such as ``answer``); {} for anything else."""
    import yaml

    path = Path(model).expanduser() / "config.yaml"
    try:
        tree = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return {}
    fields = ((tree or {}).get("data") or {}).get("fields") if isinstance(tree, dict) else None
    if not isinstance(fields, dict):
        return {}
    return {str(k): str(v) for k, v in fields.items() if k not in _NOT_PROMPT_FIELDS and isinstance(v, str)}


def evaluate(
    model: str,
    data: str,
    *,
    reference: str | None = None,
    reward_model: str | None = None,
    functions: Sequence[str] = (),
    task: str | None = None,
    n: int | None = None,
    temperature: float = 1.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    batch_size: int = 64,
    out: str | Path | None = None,
    device: str | None = None,
    show: bool = True,
    fields: dict[str, str] | None = None,
    env: str | None = None,
    env_kwargs: dict | None = None,
    max_turns: int | None = None,
    max_total_tokens: int | None = None,
    engine: str = "auto",
    engine_kwargs: dict | None = None,
) -> dict:
    """Evaluate ``model`` on the prompts of ``data`` (module docstring); writes ``out`` (default
    ``<model>/eval.json``) and returns the results dict. With ``env`` (a built-in environment, ``module:Class`` or
    ``file.py:Class``), each prompt is a multi-turn episode (``env_kwargs``, ``max_turns``, ``max_total_tokens`` as
    ``env.*`` in training, with its defaults); the environment's metrics are reported and the final assistant turn
    is the answer the gold metric, reward functions and reward model score. ``engine``: the rollout engine
    (``generation.engine``'s choices; its settings ``engine_kwargs``), built once per model answering."""
    from .rewards import CombinedRewards, RewardModelScorer
    from .tasks import get_task

    # 1. everything the user gave, checked before any generation
    if reference is not None and reward_model is None:
        raise ConfigError("a win rate needs a judge", where="--reference",
                          fix="add --reward-model DIR (the reward model judges model vs reference pairwise)")
    the_task = get_task(task) if task else None
    check_engine_flags(engine, engine_kwargs)
    env_cls = None
    if env is not None:
        from .config import EnvConfig
        from .envs import EnvError, load_environment
        from .envs.base import make_environment

        try:  # the class, and one instance from the kwargs, before any weights load
            env_cls = load_environment(env)
            make_environment(env_cls, dict(env_kwargs or {}), env)
        except EnvError as err:  # training's keys are env.name / env.kwargs; here the flags are --env / --env-kwargs
            flag = "--env-kwargs" if err.where == "env.kwargs" else "--env"
            raise EnvError(err.message, where=flag, fix=err.fix) from None
        max_turns = EnvConfig.max_turns if max_turns is None else max_turns
        max_total_tokens = EnvConfig.max_total_tokens if max_total_tokens is None else max_total_tokens
        if max_turns < 1 or max_total_tokens < 1:
            raise ConfigError("--max-turns and --max-total-tokens must be at least 1", where="--max-turns",
                              fix="give positive limits")
    inherited = {k: v for k, v in run_fields(model).items() if k not in (fields or {})}
    if inherited and show:
        print(f"[eval] the run's data.fields (config.yaml): {', '.join(f'{k}={v}' for k, v in inherited.items())} "
              "(--field NAME=COLUMN overrides)", file=sys.stderr)
    records = load_prompts(data, n, {**inherited, **(fields or {})})
    if any(r.get("images") for r in records) and (reward_model is not None or env is not None):
        raise ConfigError("prompts with images are answered and scored by the gold metric and reward functions; a "
                          "reward model or an environment reading them is not built", where="--reward-model" if
                          reward_model is not None else "--env", fix="drop it, or use prompts without images")
    try:
        conversational = bool(records) and bool(getattr(records[0], "conversational", False))  # TRL-style functions
        rewards = CombinedRewards(list(functions), conversational=conversational) if functions else None
    except RewardError as err:  # the recipe's key is reward.functions; here the flag is --functions
        raise RewardError(err.message, where="--functions", fix=err.fix) from None
    out_path = Path(out) if out is not None else default_out(model)
    policy, tok = load_policy(model, device, flag="model")
    ref = load_policy(reference, device, flag="--reference") if reference else None
    judge = load_reward_model(reward_model, device) if reward_model else None
    say = _printer(show)

    # 2. the model's answers
    prompts = [r["prompt"] for r in records]
    gen_kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size,
                  wheres=[getattr(r, "where", f"record {i}") for i, r in enumerate(records)],
                  images=[r.get("images") for r in records])
    say(f"[eval] {model}: answering {len(prompts)} prompts from {data} "
        f"({'greedy' if temperature <= 0 else f'temperature {temperature}'}, max {max_new_tokens} new tokens)")
    if env_cls is not None:
        def answer(model_, tok_):  # one episode per prompt
            return play_answers(model_, tok_, records, env_cls, env, dict(env_kwargs or {}),
                                max_new_tokens=max_new_tokens, temperature=temperature, max_turns=max_turns,
                                max_total_tokens=max_total_tokens, seed=seed, batch_size=batch_size,
                                engine=engine_for(engine, model_, tok_, batch_size, engine_kwargs))
    else:
        def answer(model_, tok_):
            return generate_answers(model_, tok_, prompts,
                                    engine=engine_for(engine, model_, tok_, batch_size, engine_kwargs), **gen_kw)
    answers = answer(policy, tok)
    texts = answers["texts"]
    result: dict = {
        "model": str(model), "data": str(data), "n": len(records),
        "sampling": {"temperature": temperature, "greedy": temperature <= 0, "max_new_tokens": max_new_tokens,
                     "seed": seed, "engine": engine if isinstance(engine, str) else engine.name},
        "responses": {"mean_tokens": _mean(answers["lengths"]),
                      "eos_frac": _mean([float(e) for e in answers["ended"]])},
    }
    samples = [{"prompt": _last_user_text(r), "response": t} for r, t in zip(records, texts)]
    if env_cls is not None:
        result["env"] = {"name": env, "kwargs": dict(env_kwargs or {}), "max_turns": max_turns,
                         "max_total_tokens": max_total_tokens, **answers["env"]}
        for s, transcript in zip(samples, answers["transcripts"]):
            s["transcript"] = transcript

    # 3. gold metric of a built-in task
    if the_task is not None:
        gold = [the_task.gold(_last_user_text(r), t, **({"images": r.get("images")} if getattr(
            the_task, "uses_images", False) else {})) for r, t in zip(records, texts)]
        result["gold"] = {"task": the_task.name, "mean": _mean(gold)}
        for s, g in zip(samples, gold):
            s["gold"] = g
    else:
        hint = suggest_task(records)
        if hint:
            say(f"[eval] these prompts look like the built-in '{hint}' task: add --task {hint} for its gold metric")

    # 4. reward functions, each by name
    if rewards is not None:
        rows = [{k: v for k, v in r.items() if k != "prompt"} for r in records]
        per_fn = rewards([_prompt_arg(r) for r in records], texts, rows,
                         messages=[r["prompt"] for r in records]).per_function
        result["rewards"] = {}
        for name, values in per_fn.items():
            present = values[~torch.isnan(values)]
            result["rewards"][name] = {"mean": float(present.mean()) if len(present) else float("nan"),
                                       "n": int(len(present))}
            for s, v in zip(samples, values.tolist()):
                s[f"reward/{name}"] = None if math.isnan(v) else v

    # 5. reward-model score, and the win rate against the reference judged by it
    if judge is not None:
        rm, rm_tok = judge
        scorer = RewardModelScorer(rm, rm_tok, batch_size=max(1, batch_size))
        scores = scorer.score(prompts, texts).tolist()
        result["reward_model"] = {"path": str(reward_model), "mean": _mean(scores), "std": _std(scores)}
        for s, v in zip(samples, scores):
            s["rm_score"] = v
        if ref is not None:
            say(f"[eval] reference {reference}: answering the same prompts")
            ref_answers = answer(ref[0], ref[1])
            ref_scores = scorer.score(prompts, ref_answers["texts"]).tolist()
            wr = win_rate(scores, ref_scores)
            result["win_rate"] = {"reference": str(reference), "judge": str(reward_model), **wr,
                                  "reference_rm_mean": _mean(ref_scores),
                                  "reference_eos_frac": _mean([float(e) for e in ref_answers["ended"]])}
            for s, t, v in zip(samples, ref_answers["texts"], ref_scores):
                s["reference_response"], s["reference_rm_score"] = t, v

    result["samples"] = samples  # every prompt with its answer(s) and scores, for inspection

    # 6. report
    files.make_dirs(out_path.parent)
    files.write_atomic(out_path, json.dumps(result, indent=1, default=float) + "\n", fix="rerun")
    result["out"] = str(out_path)
    if show:
        print_results(result)
    return result


def _printer(show: bool) -> Callable[[str], None]:
    def say(text: str) -> None:
        if show:
            print(text, flush=True)

    return say


def print_results(result: dict) -> None:
    """The results as a rich table (metric, value, detail) on the shared console."""
    from rich.table import Table

    from .track.console import get_console

    table = Table(title=f"rlhfkit eval: {result['model']} on {result['n']} prompts")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("detail")
    if "gold" in result:
        table.add_row(f"gold ({result['gold']['task']})", f"{result['gold']['mean']:.3f}",
                      "exact-answer accuracy of the sampled answers" if not result["sampling"]["greedy"]
                      else "exact-answer accuracy (greedy)")
    for name, r in result.get("rewards", {}).items():
        table.add_row(f"reward: {name}", f"{r['mean']:.4f}", f"mean over {r['n']} scored answers")
    if "reward_model" in result:
        rm = result["reward_model"]
        table.add_row("reward model score", f"{rm['mean']:.4f}", f"std {rm['std']:.4f}; {rm['path']}")
    if "win_rate" in result:
        w = result["win_rate"]
        lo, hi = w["ci95"]
        table.add_row("win rate", f"{w['rate']:.3f}",
                      f"95% CI [{lo:.3f}, {hi:.3f}]; {w['wins']} wins, {w['ties']} ties, {w['losses']} losses "
                      f"of {w['n']} vs {w['reference']} (judge: reward model; reference RM mean "
                      f"{w['reference_rm_mean']:.4f})")
    if "env" in result:
        env = result["env"]
        detail = f"mean over episodes ({env['name']}, at most {env['max_turns']} turns)"
        for key, value in env.items():
            if isinstance(value, float):
                table.add_row(f"env: {key}", f"{value:.3f}", detail)
                detail = ""
    resp = result["responses"]
    table.add_row("response length", f"{resp['mean_tokens']:.1f}", "mean tokens, EOS included")
    table.add_row("ended with EOS", f"{resp['eos_frac']:.3f}", "fraction; the rest hit --max-new-tokens")
    console = get_console()
    console.print(table)
    for s in result.get("samples", [])[:3]:
        console.print(f"  e.g. {s['prompt']!r} -> {s['response']!r}", markup=False, highlight=False)
    console.print(f"[eval] results written to {result['out']}", markup=False, highlight=False)


# ─────────────────────────────────────────────────── chat ─────────────────────────────────────────────────────


def reply(model, tok, messages: list[dict], *, max_new_tokens: int = 256, temperature: float = 0.7,
          top_p: float = 1.0, seed: int | None = None, engine="auto", images: list | None = None) -> str:
    """The model's next assistant turn for a conversation (chat template, stops at EOS; ``images``: the
    conversation's images, in the order of its image parts)."""
    answers = generate_answers(model, tok, [messages], max_new_tokens=max_new_tokens, temperature=temperature,
                               top_p=top_p, seed=seed, batch_size=1, engine=engine, images=[images])
    return answers["texts"][0]


def chat(model_name: str, *, prompt: str | None = None, system: str | None = None, max_new_tokens: int = 256,
         temperature: float = 0.7, top_p: float = 1.0, seed: int | None = None, device: str | None = None,
         stdin=None, stdout=None, engine: str = "auto", engine_kwargs: dict | None = None,
         images: Sequence[str] = ()) -> list[dict]:
    """``rlhfkit generate``: answer ``prompt`` once, or chat turn by turn on ``stdin`` until EOF or ``/exit``
    (``/reset`` starts a new conversation), with the rollout engine ``engine`` (settings ``engine_kwargs``) built
    once for the session. ``stdout`` gets the answers only: what is printed while generating (the engine's note of
    its choice) goes to stderr. ``images`` (``--image``, paths): shown with the first user turn (a vision-language
    model), each checked before any weights load. Returns the conversation."""
    from .data.images import image_ref, open_image

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    check_engine_flags(engine, engine_kwargs)
    refs = [image_ref(p, base=Path.cwd(), where="--image", field="--image") for p in images]
    for ref in refs:
        open_image(ref, "--image")
    model, tok = load_policy(model_name, device, flag="model")
    if seed is None and temperature > 0:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
              engine=engine_for(engine, model, tok, 1, engine_kwargs))

    def answer(messages: list[dict], text: str, turn_seed: int | None) -> str:  # the user's turn and the reply
        first = refs and not any(m["role"] == "user" for m in messages)  # the images go with the first user turn
        content = [{"type": "image"} for _ in refs] + [{"type": "text", "text": text}] if first else text
        messages.append({"role": "user", "content": content})
        with contextlib.redirect_stdout(sys.stderr):  # the engine's notes: stdout gets the answers only
            out = reply(model, tok, messages, seed=turn_seed, images=refs or None, **kw)
        messages.append({"role": "assistant", "content": out})
        return out

    if prompt is not None:
        stdout.write(answer(messages, prompt, seed) + "\n")
        stdout.flush()
        return messages
    interactive = hasattr(stdin, "isatty") and stdin.isatty()
    print(f"[generate] chatting with {model_name}; /reset starts over, /exit or Ctrl-D quits", file=sys.stderr)
    turn = 0
    while True:
        if interactive:
            stdout.write("you> ")
            stdout.flush()
        line = stdin.readline()
        if not line:  # EOF
            break
        text = line.rstrip("\n")
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/reset":
            messages = list(start)
            continue
        if not text.strip():
            continue
        said = answer(messages, text, None if seed is None else seed + turn)
        turn += 1
        stdout.write(("model> " if interactive else "") + said + "\n")
        stdout.flush()
    return messages
