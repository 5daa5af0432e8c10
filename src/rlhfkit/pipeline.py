"""Pipelines: stages run in order, each reading the directory the previous one wrote (SFT -> RM -> PPO, SFT -> DPO,
…). With a built-in task, its data is generated first and the gold metric of the base, and of every policy the
pipeline produced, is measured on held-out prompts and shown side by side in ``report.html``.

A stage is ``{name, recipe, config}`` where ``config`` holds that recipe's keys (nested, as in its own YAML). Keys
left out are chained: a policy stage starts from the last policy (the base model first), a reward-model stage from
the last policy, an online stage scores with the last reward model, and with a task each stage reads the task's
file of its kind. A finished stage is marked in ``pipeline_state.json`` and skipped when the pipeline is started
again; an interrupted stage resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import files
from .config import RECIPES, PipelineConfig, build_config, save_config
from .config.parse import is_key
from .errors import ConfigError
from .track.console import get_console

STAGE_KEYS = {"name", "recipe", "config"}

TINY = "tiny:hidden=64,layers=2,intermediate=128"

# The built-in quickstart: the tiny model learns the "shout" task by SFT, a reward model learns the preferences,
# PPO moves the policy towards what the reward model prefers. Measured on 2 CPU cores: about 2 minutes in all.
QUICKSTART = {
    "recipe": "pipeline",
    "output_dir": "runs/quickstart",
    "task": "quickstart",
    "task_size": 2000,
    "eval_prompts": 200,
    "base_model": TINY,
    "stages": [
        {"name": "sft", "recipe": "sft", "config": {
            "optim": {"lr": 5e-3}, "train": {"batch_size": 32, "epochs": 7}, "data": {"max_length": 64}}},
        {"name": "rm", "recipe": "rm", "config": {
            "optim": {"lr": 1e-3}, "train": {"batch_size": 32, "epochs": 2}, "data": {"max_length": 64}}},
        {"name": "ppo", "recipe": "ppo", "config": {
            "optim": {"lr": 1e-4}, "critic": {"lr": 1e-3}, "train": {"batch_size": 32, "save_every": 32},
            # kl.coef 0.2, not ppo's 0.05: beside scores normalised to ~1-2 a penalty of 0.05 x 2 nats held nothing
            # back; KL jumped 0.1 -> 2.1 nats in 10 updates and the critic chased the returns it moved (both health
            # warnings, update 46); at 0.2 KL stays 0.4-1.1 and the gold metric is as high (0.88 vs 0.86)
            "algo": {"rollout_batch_size": 32, "mini_batch_size": 32, "total_episodes": 2048, "kl": {"coef": 0.2}},
            "generation": {"max_new_tokens": 12}, "data": {"max_length": 64}, "track": {"sample_every": 16}}},
    ],
}

def _deep_default(tree: dict, defaults: dict) -> dict:
    """``tree`` with ``defaults`` filled in where ``tree`` has no value (never overwrites the user's keys)."""
    out = dict(tree)
    for k, v in defaults.items():
        if isinstance(v, dict):
            out[k] = _deep_default(out.get(k) or {}, v)
        elif out.get(k) is None:
            out[k] = v
    return out


def plan_stages(cfg: PipelineConfig) -> list[tuple[str, str, object]]:
    """Resolve every stage to (name, recipe, frozen config) with the chaining rules of the module docstring."""
    cfg.check_inputs()
    out_dir = Path(cfg.output_dir)
    data_dir = out_dir / "data"
    policy, reward_model = cfg.base_model, None
    planned, names = [], set()
    for i, stage in enumerate(cfg.stages):
        where = f"stages[{i}]"
        unknown = set(stage) - STAGE_KEYS
        if unknown:
            raise ConfigError(f"unknown key '{where}.{sorted(unknown)[0]}'", where=where,
                              fix="a stage has name, recipe and config")
        recipe = stage.get("recipe")
        stageable = [r for r, spec in RECIPES.items() if spec.family != "pipeline"]
        if recipe not in stageable:
            raise ConfigError(f"unknown recipe {recipe!r} in {where}", where=f"{where}.recipe",
                              fix=f"use one of {', '.join(stageable)}")
        spec = RECIPES[recipe]
        name = stage.get("name") or recipe
        if name in names:
            raise ConfigError(f"two stages are named '{name}'", where=f"{where}.name", fix="give each a unique name")
        names.add(name)
        tree = dict(stage.get("config") or {})
        defaults: dict = {"output_dir": str(out_dir / name), "model": {"name": policy}}
        if spec.family == "online" and reward_model is not None:
            defaults["reward"] = {"model": reward_model}
        if cfg.task:
            from .tasks import get_task

            files = get_task(cfg.task).FILES
            given = tree.get("data") if isinstance(tree.get("data"), dict) else {}
            lacking = [f for key, f in spec.task_files.items() if f not in files and key not in given]
            if lacking:
                raise ConfigError(f"the '{cfg.task}' task writes no {lacking[0]} for the {recipe} stage",
                                  where=f"{where}.recipe", fix=f"the task writes {', '.join(files)}; give the stage "
                                                               "its own data.train / data.eval, or drop it")
            defaults["data"] = {k: str(data_dir / v) for k, v in spec.task_files.items()}
        tree = _deep_default(tree, defaults)
        try:
            stage_cfg = build_config(recipe, tree, source=f"pipeline {where} ({name})")
        except ConfigError as err:  # the key inside the pipeline file, so the CLI can name its file:line
            if err.key:
                err.key = f"{where}.config.{err.key}"
            elif is_key(err.where):  # a cross-field check placed by its key (where=algo.num_generations)
                err.where = f"{where}.config.{err.where}"
            raise
        planned.append((name, recipe, stage_cfg))
        if spec.family == "reward":
            reward_model = stage_cfg.output_dir
        elif spec.makes_policy:
            policy = stage_cfg.output_dir
    return planned


def _load_state(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"done": {}}


def _save_state(path: Path, state: dict) -> None:
    files.write_atomic(path, json.dumps(state, indent=1, default=float), fix="rerun (finished stages are skipped)")


def run_pipeline(cfg: PipelineConfig) -> dict:
    """Run every stage (skipping finished ones), then measure the gold metric and write the report."""
    console = get_console()
    out = Path(cfg.output_dir)
    # 1. the plan of every stage (configs built and checked, trackers too: a mistake in one is reported before the
    #    pipeline directory is made), then the data of the built-in task when one is named
    stages = plan_stages(cfg)
    files.make_dirs(out)
    files.check_run_dir(out)
    if cfg.task:
        from .tasks import make_task_data

        if not (out / "data" / "eval_prompts.jsonl").is_file():
            make_task_data(cfg.task, out / "data", n=cfg.task_size, n_eval=cfg.eval_prompts)
            console.print(f"[pipeline] wrote the {cfg.task} task's data to {out / 'data'}", markup=False)
    save_config(cfg, out)
    state_path = out / "pipeline_state.json"
    state = _load_state(state_path)
    # 2. the stages, in order
    for name, recipe, stage_cfg in stages:
        if name in state["done"]:
            console.print(f"[pipeline] stage {name} already done ({stage_cfg.output_dir}), skipping", markup=False)
            continue
        console.rule(f"stage {name}: {recipe} -> {stage_cfg.output_dir}")
        t0 = time.time()
        metrics = RECIPES[recipe].run(stage_cfg)
        state["done"][name] = {"recipe": recipe, "output_dir": stage_cfg.output_dir, "seconds": time.time() - t0,
                               "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
        _save_state(state_path, state)
    # 3. gold metric of the base model and of every policy, side by side
    gold, answers = _gold_table(cfg, stages) if cfg.task else ({}, {})
    summary = {"stages": state["done"], "gold": gold}
    files.write_atomic(out / "summary.json", json.dumps(summary, indent=1, default=float),
                       fix="rerun (finished stages are skipped)")
    # 4. report
    from .report import build_report

    report = build_report(out, title=f"rlhfkit pipeline: {out}", gold=gold or None, answers=answers or None, stages=[
        {"name": n, "run_dir": state["done"][n]["output_dir"], "summary": _short(state["done"][n])}
        for n, _, _ in stages])
    _print_summary(console, stages, state, gold, report)
    return summary


def _gold_table(cfg: PipelineConfig, stages) -> tuple[dict, dict]:
    """(gold metric per model, its sampled answers ``[(prompt, answer, score)]`` to the same held-out prompts)."""
    from .config import GenerationConfig, ModelConfig
    from .models.loading import load_causal_lm
    from .rollout import make_engine
    from .tasks import get_task
    from .tasks.gold import gold_metric

    task = get_task(cfg.task)
    prompts = [json.loads(x) for x in (Path(cfg.output_dir) / "data" / "eval_prompts.jsonl").read_text().splitlines()]
    gold, answers = {}, {}
    models = [("untrained", cfg.base_model)] + [(n, c.output_dir) for n, r, c in stages if RECIPES[r].makes_policy]
    # the engine of the first stage that generates (its generation.engine, engine_kwargs and stop strings), built
    # once for every model measured
    gen = next((c.generation for _, _, c in stages if hasattr(c, "generation")), GenerationConfig())
    engine = None
    for name, path in models:
        model, tok = load_causal_lm(ModelConfig(name=path), trainable=False, seed=0)
        engine = engine or make_engine(gen.engine, tok, model, batch_size=128, engine_kwargs=gen.engine_kwargs,
                                       stop_strings=gen.stop_strings)
        result = gold_metric(model, tok, task, prompts, seed=1234, engine=engine)
        gold[name], answers[name] = result["gold"], result["samples"]
    return gold, answers


def _short(done: dict) -> dict:
    keep = ("eval/loss", "eval/accuracy", "eval/chosen_mean", "eval/rejected_mean", "objective/scores",
            "objective/kl", "eval/scores", "rewards/accuracies", "eval/rewards/accuracies")
    out = {k: round(v, 4) for k, v in done["metrics"].items() if k in keep}
    out["seconds"] = round(done["seconds"], 1)
    return out


def _print_summary(console, stages, state, gold, report) -> None:
    from rich.table import Table

    table = Table(title="pipeline summary")
    table.add_column("stage")
    table.add_column("output")
    table.add_column("time")
    table.add_column("key metrics")
    for name, _, _ in stages:
        d = state["done"][name]
        table.add_row(name, d["output_dir"], f"{d['seconds']:.0f}s",
                      ", ".join(f"{k}={v}" for k, v in _short(d).items() if k != "seconds"))
    console.print(table)
    if gold:
        console.print("gold metric (exact-answer accuracy of sampled answers on held-out prompts): "
                      + "  ".join(f"{k}={v:.3f}" for k, v in gold.items()), markup=False)
    console.print(f"report: {report}", markup=False)


def quickstart_config(out_dir: str | None = None) -> PipelineConfig:
    tree = dict(QUICKSTART)
    if out_dir:
        tree["output_dir"] = out_dir
    return build_config("pipeline", tree, source="built-in quickstart")


def run_quickstart(out_dir: str | None = None) -> dict:
    """The built-in SFT -> RM -> PPO pipeline on the tiny model and task (offline, minutes on 2 CPU cores)."""
    return run_pipeline(quickstart_config(out_dir))
