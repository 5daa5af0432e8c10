"""The command line: ``rlhfkit <command> [config.yaml] [key.sub=value ...]``.

This module parses and dispatches, nothing else. Recipe modules are imported inside each command (so
``rlhfkit --help`` answers without importing torch). Exit codes: 0 success, 2 a :class:`~rlhfkit.errors.UserError`
(one line on stderr: ``error: <where>: <what> (fix: <how>)``), 130 interrupted (Ctrl-C), 143 / 138 stopped by
SIGTERM / SIGUSR1 with a checkpoint (``train/lifecycle/stop.py``); any other exception is a bug and keeps its traceback
(under
torchrun followed by one line naming the rank, exit 1).

Overrides of a training command may be written ``key.sub=value``, ``--key.sub value`` or ``--key.sub=value``;
dashes in a ``--`` key become underscores (``--output-dir x`` is ``output_dir=x``); ``--field NAME=COLUMN`` is
``data.fields.NAME=COLUMN``, as ``rlhfkit eval --field`` takes it (which takes ``data.fields.NAME=COLUMN`` too).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import sys
import time
from pathlib import Path

from . import __version__
from .config import RECIPES, GenerationConfig
from .errors import Stopped, UserError, is_main_rank, say

# The training commands are the recipes of ``config.RECIPES`` (the one recipe table); the others are below.
OTHER_COMMANDS: dict[str, str] = {
    "quickstart": "make the built-in task's data and run SFT -> RM -> PPO on a tiny model, with a report",
    "eval": "evaluate a model: gold metric, reward functions, reward-model score, win rate vs a reference",
    "generate": "chat with a model through its chat template (one --prompt, or an interactive loop)",
    "export": "write a full merged model directory (LoRA merged) or a GGUF file, in the model's own dtype, and verify "
              "that it reloads identically",
    "data": "data helpers: `rlhfkit data make TASK --out DIR` writes a built-in task's files (quickstart, calculator, "
            "arithmetic)",
    "config": "config helpers: `rlhfkit config show RECIPE` prints the commented default config",
    "plan": "per-device memory of each phase and pre-flight checks of a run, before any weights load",
    "reward-lint": "call an online config's rewards on adversarial completions built from its prompts (empty, "
                   "echo, repetition, a second answer, ...) and show which score high; exit 2 on a certain bug",
}

COMMANDS = (*RECIPES, *OTHER_COMMANDS)
ENGINE_HELP = "as generation.engine: " + next(  # the schema's own words, so the two never disagree
    fl.metadata["help"] for fl in dataclasses.fields(GenerationConfig) if fl.name == "engine")
ENGINE_KWARGS_HELP = "settings of the engine, as generation.engine_kwargs, e.g. \"{compile: false}\" for static"

EXIT_OK, EXIT_USER_ERROR, EXIT_INTERRUPTED = 0, 2, 130


class UsageError(UserError):
    """A malformed command line (unknown flag, missing argument)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(message, where=self.prog, fix=f"see `{self.prog} --help`")


# ───────────────────────────────────────────────── environment ────────────────────────────────────────────────


def _quiet_environment() -> None:
    """Offline by default, no progress bars or advisory warnings from the Hugging Face libraries."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _quiet_libraries() -> None:
    """Called by commands that load models (importing transformers costs a second; --help skips it)."""
    from .track.console import silence_libraries

    silence_libraries()  # for the rest of the process


# ───────────────────────────────────────────────── parsing ────────────────────────────────────────────────────


def split_overrides(tokens: list[str]) -> tuple[str | None, list[str]]:
    """``[config.yaml] [key=value | --key value | --key=value ...]`` -> (config path or None, ["key=value", ...]).

    A ``--flag`` followed by another ``--`` option (or nothing) means ``flag=true``.
    """
    config: str | None = None
    overrides: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--config" or tok.startswith("--config="):  # TRL's spelling of the positional config file
            path = tok.partition("=")[2] if "=" in tok else (tokens[i + 1] if i + 1 < len(tokens) else "")
            i += 1 if "=" in tok else 2
            if not path or path.startswith("--"):
                raise UsageError("--config needs a file", where="command line", fix="write --config path/to/x.yaml")
            if config is not None:
                raise UsageError(f"two config files given ({config!r} and {path!r})", where="command line",
                                 fix="give one config file; change single keys with key.sub=value")
            config = path
            continue
        if tok.startswith("--") and len(tok) > 2:
            body = tok[2:]
            if "=" in body:
                key, value = body.split("=", 1)
            else:
                key = body
                if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                    value = tokens[i + 1]
                    i += 1
                else:
                    value = "true"
            key = key.replace("-", "_")
            overrides.append(f"data.fields.{_field_item(value)}" if key in ("field", "fields") else f"{key}={value}")
        elif "=" in tok and not tok.startswith("-"):
            overrides.append(tok)
        elif tok.startswith("-"):
            raise UsageError(f"unknown option {tok!r}", where="command line",
                             fix="write overrides as key.sub=value or --key.sub value")
        elif config is None and (tok.endswith((".yaml", ".yml")) or Path(tok).is_file()):
            config = tok
        elif config is not None and tok.endswith((".yaml", ".yml")):
            raise UsageError(f"two config files given ({config!r} and {tok!r})", where="command line",
                             fix="give one config file; change single keys with key.sub=value")
        else:
            raise UsageError(f"expected a config file (.yaml) or key=value, got {tok!r}", where="command line",
                             fix=f"write {tok}=VALUE to set a key, or check the config file's path")
        i += 1
    return config, overrides


def build_parser() -> _Parser:
    parser = _Parser(
        prog="rlhfkit",
        description="rlhfkit: SFT, reward models, online RL (PPO, GRPO, RLOO, REINFORCE++) and offline preference "
                    "optimisation (DPO, IPO, KTO, SimPO, ORPO) for causal language models.",
        epilog="Training commands take an optional config file and overrides: "
               "rlhfkit sft configs/sft.yaml optim.lr=1e-5 --output_dir runs/x. "
               "`rlhfkit config show RECIPE` prints every key with its meaning.",
    )
    parser.add_argument("--version", action="version", version=f"rlhfkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    for name, recipe in RECIPES.items():
        desc = recipe.description
        p = sub.add_parser(name, help=desc, description=f"rlhfkit {name}: {desc}.",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=_common_keys_help(recipe)
                           + "\n\nOverrides: key.sub=value, --key.sub value or --key.sub=value "
                             f"(e.g. optim.lr=1e-5 --output_dir runs/x).\nTRL-style flat names are accepted "
                             f"(learning_rate, per_device_train_batch_size, ...). `rlhfkit config show {name}` "
                             "lists every key.")
        p.add_argument("config", nargs="?", help="YAML config file (optional: the recipe's defaults otherwise)")
        p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")

    p = sub.add_parser("quickstart", help=OTHER_COMMANDS["quickstart"], description=OTHER_COMMANDS["quickstart"])
    p.add_argument("--out", default="runs/quickstart", help="output directory (default: runs/quickstart)")

    p = sub.add_parser("eval", help=OTHER_COMMANDS["eval"], description=OTHER_COMMANDS["eval"] + ".")
    p.add_argument("model", help="policy: model or run directory, or a tiny[:...] spec")
    p.add_argument("--data", required=True, help="prompts: .jsonl/.json/.csv/.parquet with `prompt` or `messages`")
    p.add_argument("--reference", help="reference model for the win rate (judged by --reward-model)")
    p.add_argument("--reward-model", dest="reward_model", help="reward-model directory (from `rlhfkit rm`)")
    p.add_argument("--functions", nargs="+", action="extend", default=[], metavar="SPEC",
                   help="reward functions: package.module:function, file.py:function or a built-in name")
    p.add_argument("--field", dest="fields", action="append", default=[], metavar="NAME=COLUMN",
                   help="map a canonical field to your column, as data.fields does in training, either spelling "
                        "(--field prompt=question or --field data.fields.prompt=question; a training command takes "
                        "both too)")
    p.add_argument("--task", help="built-in task whose gold metric to compute (quickstart | calculator | arithmetic "
                                  "| shapes)")
    p.add_argument("--n", type=int, help="evaluate the first N prompts (default: all)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--greedy", action="store_true", help="greedy decoding")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=128,
                   help="maximum response tokens (default 128; responses end at EOS)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64, help="generation batch (default 64)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--out", help="results JSON (default: MODEL/eval.json for a directory, else ./eval.json)")
    p.add_argument("--env", help="play each prompt as a multi-turn episode with this environment (calculator, "
                                 "package.module:Class or file.py:Class) and report its metrics")
    p.add_argument("--env-kwargs", dest="env_kwargs", default="{}", metavar="YAML",
                   help="keyword arguments of the environment, e.g. \"{system_prompt: ''}\" (as env.kwargs)")
    p.add_argument("--max-turns", dest="max_turns", type=int,
                   help="assistant turns per episode (default: env.max_turns's)")
    p.add_argument("--max-total-tokens", dest="max_total_tokens", type=int,
                   help="tokens per episode after the prompt (default: env.max_total_tokens's)")
    p.add_argument("--engine", default="auto", help=ENGINE_HELP)
    p.add_argument("--engine-kwargs", dest="engine_kwargs", default="{}", metavar="YAML", help=ENGINE_KWARGS_HELP)

    p = sub.add_parser("generate", help=OTHER_COMMANDS["generate"], description=OTHER_COMMANDS["generate"] + ".")
    p.add_argument("model", help="model or run directory, or a tiny[:...] spec")
    p.add_argument("--prompt", help="answer this one message and exit (else: interactive, /exit or Ctrl-D quits)")
    p.add_argument("--system", help="system message prepended to the conversation")
    p.add_argument("--image", dest="images", action="append", default=[], metavar="PATH",
                   help="an image shown with the first message (vision-language models; repeat for several)")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=256,
                   help="maximum response tokens (default 256; a response ends at EOS)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 = greedy (default 0.7)")
    p.add_argument("--top-p", dest="top_p", type=float, default=1.0, help="nucleus sampling (default 1.0 = off)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--engine", default="auto", help=ENGINE_HELP)
    p.add_argument("--engine-kwargs", dest="engine_kwargs", default="{}", metavar="YAML", help=ENGINE_KWARGS_HELP)

    p = sub.add_parser("export", help=OTHER_COMMANDS["export"], description=OTHER_COMMANDS["export"] + ".")
    p.add_argument("source", metavar="RUN_OR_DIR", help="run directory, model directory or LoRA adapter directory")
    p.add_argument("--out", required=True, help="directory to write the merged model to, or a file name ending in "
                                                "'.gguf' for one GGUF file (llama.cpp; Llama-family models)")
    p.add_argument("--base", help="base model of a LoRA adapter (default: from the run's config.yaml or the "
                                  "adapter's config)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="dtype of the weights written (default auto: the model's own, as its first model was "
                        "published, e.g. bfloat16 for SmolLM2; float32 keeps the trained float32 weights)")

    p = sub.add_parser("data", help=OTHER_COMMANDS["data"], description=OTHER_COMMANDS["data"] + ".")
    dsub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", parser_class=_Parser, required=True)
    m = dsub.add_parser("make", help="write a built-in task's data files (quickstart: sft, preference, prompts, "
                                     "unpaired, eval; calculator: tool-use sft, prompts, eval; arithmetic: sft, "
                                     "prompts, eval; shapes: pictures with sft, prompts, eval)")
    m.add_argument("task", help="built-in task: quickstart | calculator | arithmetic | shapes")
    m.add_argument("--out", required=True, help="directory for the files")
    m.add_argument("--n", type=int, default=2000, help="records per training file (default 2000)")
    m.add_argument("--n-eval", dest="n_eval", type=int, default=200, help="records per eval file (default 200)")
    m.add_argument("--seed", type=int, default=0, help="data seed (default 0)")

    p = sub.add_parser("plan", help=OTHER_COMMANDS["plan"], description=OTHER_COMMANDS["plan"] + ".",
                       epilog="example: rlhfkit plan grpo configs/grpo.yaml model.name=path/to/llama-7b "
                              "--world-size 8 --gpu-memory 80GiB")
    p.add_argument("config", nargs="?", help="[RECIPE] the run's YAML config (the recipe: the first word, else the "
                                             "file's `recipe:` key)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    p.add_argument("--recipe", help="recipe when the config file has no `recipe:` key (default: sft)")
    p.add_argument("--gpu-memory", dest="gpu_memory", help="memory of one device, e.g. 80GiB, 24GB")
    p.add_argument("--world-size", dest="world_size", type=int, help="devices in the run (default: $WORLD_SIZE "
                                                                      "or 1)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="what the run trains on (default "
                                                                              "cuda; cpu: fp32, no autocast)")
    p.add_argument("--no-checks", dest="checks", action="store_false", help="memory only, no pre-flight checks")

    p = sub.add_parser("reward-lint", help=OTHER_COMMANDS["reward-lint"],
                       description=OTHER_COMMANDS["reward-lint"] + ".",
                       epilog="example: rlhfkit reward-lint configs/grpo.yaml data.train=prompts.jsonl "
                              "'reward.functions=[{fn: math_answer}]' --prompts 8")
    p.add_argument("config", nargs="?", help="the run's YAML config (its `recipe:` key names the recipe)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    p.add_argument("--recipe", help="online recipe when the config file has no `recipe:` key (default: grpo)")
    p.add_argument("--prompts", type=int, help="prompts to build adversarial completions from (default 4)")

    p = sub.add_parser("config", help=OTHER_COMMANDS["config"], description=OTHER_COMMANDS["config"] + ".")
    csub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", parser_class=_Parser, required=True)
    s = csub.add_parser("show", help="print a recipe's default config as commented YAML")
    s.add_argument("recipe", help=" | ".join(RECIPES))
    s.add_argument("overrides", nargs=argparse.REMAINDER, metavar="[config.yaml | --config FILE] key.sub=value",
                   help="a config file and overrides applied before printing")
    return parser


_COMMON_KEYS = {  # recipe family -> the keys a newcomer sets first (help text read from the config classes)
    "supervised": ("output_dir", "model.name", "data.train", "data.max_length", "optim.lr", "train.batch_size",
                   "train.epochs", "model.lora.enabled"),
    "reward": ("output_dir", "model.name", "data.train", "optim.lr", "train.batch_size", "train.epochs"),
    "online": ("output_dir", "model.name", "data.train", "reward.model", "reward.functions", "optim.lr",
               "algo.rollout_batch_size", "algo.num_generations", "algo.kl.coef", "generation.max_new_tokens",
               "algo.total_episodes", "model.lora.enabled", "defaults"),
    "preference": ("output_dir", "model.name", "data.train", "algo.beta", "optim.lr", "train.batch_size",
                   "train.epochs", "model.lora.enabled"),
    "pipeline": ("output_dir", "task", "base_model", "stages"),
}


def _common_keys_help(recipe) -> str:
    """"common keys:" and one line per key with its help string and the recipe's default (its ``defaults`` over the
    config class's; no torch import: reads the dataclass fields)."""
    import dataclasses

    base = recipe.config()

    def field_of(dotted: str):
        *parents, last = dotted.split(".")
        obj, own = base, recipe.defaults
        for part in parents:
            obj, own = getattr(obj, part), own.get(part, {}) if isinstance(own, dict) else {}
        fl = next(fl for fl in dataclasses.fields(obj) if fl.name == last)
        return fl, own[last] if isinstance(own, dict) and last in own else getattr(obj, last)

    lines = ["common keys:"]
    for key in _COMMON_KEYS.get(recipe.family, ()):
        fl, default = field_of(key)
        lines.append(f"  {key:<26} {fl.metadata.get('help', '')} (default: {default!r})")
    return "\n".join(lines)


# ───────────────────────────────────────────────── commands ───────────────────────────────────────────────────

_STATE: dict = {"run_dir": None, "timeout_s": None}


def _lazy(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def cmd_train(command: str, tokens: list[str]) -> int:
    from .config import load_config, locate
    from .errors import ConfigError

    config_path, overrides = split_overrides(tokens)
    cfg = load_config(command, config_path, overrides)  # every key and the trackers, before anything is written
    run_dir = Path(cfg.output_dir)
    _STATE["run_dir"] = run_dir
    _STATE["timeout_s"] = getattr(getattr(cfg, "distributed", None), "timeout_s", None)
    _STATE["resume"] = getattr(getattr(cfg, "train", None), "resume", None)
    say(f"[rlhfkit] {command}: run directory {run_dir.resolve()}"  # rank 0 only under torchrun
        + (f" (config {config_path})" if config_path else " (recipe defaults + overrides)"))
    _quiet_libraries()
    started = time.time()
    try:
        RECIPES[command].run(cfg)
    except ConfigError as err:  # an input checked before the run (model.name, ...): file:line when the file set it
        raise locate(err, config_path, overrides) from None
    from .track.progress import run_summary_line

    say(run_summary_line(command, run_dir, time.time() - started, since=started))
    return EXIT_OK


def cmd_quickstart(args) -> int:
    out = Path(args.out)
    _STATE["run_dir"] = out
    say(f"[rlhfkit] quickstart: run directory {out.resolve()}")
    _quiet_libraries()
    _lazy("rlhfkit.pipeline", "run_quickstart")(str(out))
    say(f"[rlhfkit] quickstart finished; run directory {out.resolve()} (report: {out / 'report.html'})")
    return EXIT_OK


def cmd_eval(args) -> int:
    _quiet_libraries()
    from .evaluate import evaluate

    evaluate(
        args.model, args.data, reference=args.reference, reward_model=args.reward_model, functions=args.functions,
        task=args.task, n=args.n, temperature=0.0 if args.greedy else args.temperature,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=args.seed, out=args.out,
        fields=_field_map(args.fields), env=args.env, env_kwargs=_yaml_mapping(args.env_kwargs, "--env-kwargs"),
        max_turns=args.max_turns, max_total_tokens=args.max_total_tokens, engine=args.engine,
        engine_kwargs=_yaml_mapping(args.engine_kwargs, "--engine-kwargs"),
    )
    return EXIT_OK


def _yaml_mapping(text: str, flag: str) -> dict:
    import yaml

    from .config.parse import load_yaml

    try:
        value = load_yaml(text, flag, lines=False)  # aliases, depth and size bounded
    except yaml.YAMLError as exc:
        raise UsageError(f"{flag} is not valid YAML: {str(exc).splitlines()[0]}", where=flag,
                         fix="write a mapping, e.g. \"{tool_reward: 0.5}\"") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a mapping, got {type(value).__name__}", where=flag,
                         fix="write a mapping, e.g. \"{tool_reward: 0.5}\"")
    return value


def _field_item(item: str) -> str:
    """``--field`` as eval and training both take it: ``NAME=COLUMN``, or the config's own spelling
    ``data.fields.NAME=COLUMN`` (``fields.NAME=COLUMN``), as ``NAME=COLUMN``."""
    name, eq, column = item.partition("=")
    name = name.strip()
    name = name.removeprefix("data.fields.") if name.startswith("data.fields.") else name.removeprefix("fields.")
    if not eq or not name or "." in name or not column.strip():
        raise UsageError(f"bad --field {item!r}", where="--field",
                         fix="write --field NAME=COLUMN (or data.fields.NAME=COLUMN), e.g. prompt=question")
    return f"{name}={column.strip()}"


def _field_map(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, _, column = _field_item(item).partition("=")
        out[name] = column
    return out


def cmd_generate(args) -> int:
    _quiet_libraries()
    from .evaluate import chat

    chat(args.model, prompt=args.prompt, system=args.system, max_new_tokens=args.max_new_tokens,
         temperature=args.temperature, top_p=args.top_p, seed=args.seed, engine=args.engine,
         engine_kwargs=_yaml_mapping(args.engine_kwargs, "--engine-kwargs"), images=args.images)
    return EXIT_OK


def cmd_export(args) -> int:
    _quiet_libraries()
    from .models.export import export_model

    export_model(args.source, args.out, base=args.base, dtype=args.dtype)
    return EXIT_OK


def cmd_data(args) -> int:
    from .tasks import get_task, make_task_data

    get_task(args.task)  # unknown task: one-line error
    if args.n < 1 or args.n_eval < 1:
        raise UsageError("--n and --n-eval must be at least 1", where="rlhfkit data make", fix="give positive counts")
    written = make_task_data(args.task, args.out, n=args.n, n_eval=args.n_eval, seed=args.seed)
    print(f"[rlhfkit] wrote the '{args.task}' task's data to {Path(args.out).resolve()}:")
    for fname, path in written.items():
        with open(path) as fh:
            first = fh.readline().strip()
        count = sum(1 for _ in open(path))
        what, used_by = get_task(args.task).FILES[fname][2:]
        print(f"\n  {path}  ({count} records)\n    what: {what}\n    for:  {used_by}\n    e.g.: {first}")
    return EXIT_OK


def cmd_config(args) -> int:
    from .config import build_config, load_config, show_yaml

    path, overrides = split_overrides(args.overrides)
    cfg = load_config(args.recipe, path, overrides) if path else build_config(args.recipe, {}, overrides,
                                                                              source="defaults")
    what = f"the config of {path}" if path else "default config"
    sys.stdout.write(f"# rlhfkit {args.recipe}: {what} (rlhfkit {__version__}); a run needs model.name and "
                     "data.train, every other key is optional\n")
    sys.stdout.write(show_yaml(cfg))
    return EXIT_OK


_PLAN_FLAGS = {"--gpu-memory": "gpu_memory", "--world-size": "world_size", "--device": "device", "--recipe": "recipe"}


def parse_plan_args(tokens: list[str]) -> dict:
    """``plan``'s own flags, anywhere on the line (``--world-size 8`` or ``--world-size=8``); every other token is
    the config file or an override, as for a training command."""
    opts: dict = {"gpu_memory": None, "world_size": None, "device": "cuda", "recipe": None, "checks": True}
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        flag, eq, value = tok.partition("=")
        if flag in _PLAN_FLAGS:
            if not eq:
                if i + 1 >= len(tokens):
                    raise UsageError(f"{flag} needs a value", where="rlhfkit plan", fix="see `rlhfkit plan --help`")
                value, i = tokens[i + 1], i + 1
            opts[_PLAN_FLAGS[flag]] = value
        elif tok == "--no-checks":
            opts["checks"] = False
        else:
            rest.append(tok)
        i += 1
    if rest and rest[0] in RECIPES and not Path(rest[0]).is_file():  # `rlhfkit plan grpo ...`, as `rlhfkit grpo ...`
        if opts["recipe"] not in (None, rest[0]):
            raise UsageError(f"two recipes given ({rest[0]} and --recipe {opts['recipe']})", where="rlhfkit plan",
                             fix=f"give one: rlhfkit plan {rest[0]} ...")
        opts["recipe"] = rest.pop(0)
    opts["config"], opts["overrides"] = split_overrides(rest)
    if opts["device"] not in ("cuda", "cpu"):
        raise UsageError(f"bad --device {opts['device']!r}", where="--device", fix="use cuda or cpu")
    if opts["world_size"] is not None:
        try:
            opts["world_size"] = int(opts["world_size"])
        except ValueError:
            opts["world_size"] = 0
        if opts["world_size"] < 1:
            raise UsageError("--world-size must be a number of devices >= 1", where="--world-size",
                             fix="give the number of devices, e.g. --world-size 8")
    return opts


def cmd_plan(tokens: list[str]) -> int:
    from .config import load_config, read_yaml, require_model
    from .models.memory import parse_size
    from .plan import plan

    args = parse_plan_args(tokens)
    config_path, overrides = args["config"], args["overrides"]
    recipe = args["recipe"] or (read_yaml(config_path).get("recipe") if config_path else None) or "sft"
    if recipe not in RECIPES or RECIPES[recipe].family == "pipeline":
        raise UsageError(f"cannot plan recipe {recipe!r}", where="rlhfkit plan",
                         fix=f"give --recipe one of {', '.join(r for r in RECIPES if r != 'pipeline')}")
    gpu = None
    if args["gpu_memory"] is not None:
        try:
            gpu = parse_size(args["gpu_memory"])
        except ValueError:
            raise UsageError(f"bad --gpu-memory {args['gpu_memory']!r} (a positive, finite size of at least 1MiB)",
                             where="--gpu-memory", fix="write a size such as 80GiB, 24GB or 512MiB") from None
    cfg = load_config(recipe, config_path, overrides)
    require_model(cfg)
    _quiet_libraries()
    command = shlex.join(["rlhfkit", recipe, *([config_path] if config_path else []), *overrides])
    result = plan(cfg, world=args["world_size"], gpu_memory=gpu, device=args["device"], checks=args["checks"],
                  command=command)
    print(result.render())
    return EXIT_OK if not any(c.status == "fail" for c in result.checks) else EXIT_USER_ERROR


def cmd_reward_lint(tokens: list[str]) -> int:
    from .config import load_config, read_yaml
    from .rewards.lint import lint_config

    opts = {"--recipe": None, "--prompts": "4"}
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        flag, eq, value = tokens[i].partition("=")
        if flag in opts:
            if not eq:
                if i + 1 >= len(tokens):
                    raise UsageError(f"{flag} needs a value", where="rlhfkit reward-lint",
                                     fix="see `rlhfkit reward-lint --help`")
                value, i = tokens[i + 1], i + 1
            opts[flag] = value
        else:
            rest.append(tokens[i])
        i += 1
    config_path, overrides = split_overrides(rest)
    recipe = opts["--recipe"] or (read_yaml(config_path).get("recipe") if config_path else None) or "grpo"
    if recipe not in RECIPES or RECIPES[recipe].family != "online":
        raise UsageError(f"reward-lint needs an online recipe, not {recipe!r}", where="rlhfkit reward-lint",
                         fix="give --recipe " + " | ".join(r for r, x in RECIPES.items() if x.family == "online"))
    if not opts["--prompts"].isdigit() or int(opts["--prompts"]) < 1:
        raise UsageError(f"bad --prompts {opts['--prompts']!r}", where="--prompts", fix="give a number >= 1")
    cfg = load_config(recipe, config_path, overrides)
    report = lint_config(cfg, max_prompts=int(opts["--prompts"]))
    print("\n".join(report.lines()))
    return EXIT_OK


# ───────────────────────────────────────────────── main ───────────────────────────────────────────────────────


def _last_checkpoint(run_dir: Path | None) -> Path | None:
    if run_dir is None or not run_dir.is_dir():
        return None
    found = [p.parent for p in run_dir.glob("**/checkpoint-*/trainer_state.pt") if not p.parent.name.endswith(".tmp")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in RECIPES and not any(a in ("-h", "--help") for a in argv[1:]):
        return cmd_train(argv[0], argv[1:])
    if argv and argv[0] == "plan" and not any(a in ("-h", "--help") for a in argv[1:]):
        return cmd_plan(argv[1:])  # its flags may sit between overrides, which argparse cannot take
    if argv and argv[0] == "reward-lint" and not any(a in ("-h", "--help") for a in argv[1:]):
        return cmd_reward_lint(argv[1:])
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(argv[0], list(COMMANDS), n=1, cutoff=0.5)
        raise UsageError(f"invalid choice: {argv[0]!r} is not a command", where="rlhfkit",
                         fix=(f"did you mean `rlhfkit {close[0]}`?" if close else "see `rlhfkit --help`"))
    parser = build_parser()
    if not argv:
        parser.print_help()
        return EXIT_OK
    args = parser.parse_args(argv)
    handlers = {"quickstart": cmd_quickstart, "eval": cmd_eval, "generate": cmd_generate, "export": cmd_export,
                "data": cmd_data, "config": cmd_config}
    return handlers[args.command](args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rlhfkit`` console script and ``python -m rlhfkit``; returns the exit code."""
    _quiet_environment()
    argv = list(sys.argv[1:] if argv is None else argv)
    _STATE["run_dir"], _STATE["timeout_s"], _STATE["resume"] = None, None, None
    who = f"rank {os.environ.get('RANK', '0')}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""  # torchrun
    try:
        return _dispatch(argv)
    except UserError as err:
        sys.stdout.flush()
        print(f"error: {who}{err}".replace("\n", " "), file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as err:  # Ctrl-C, or a stop by SIGTERM / SIGUSR1 / another rank's failure (Stopped)
        sys.stdout.flush()
        stopped = err if isinstance(err, Stopped) else None
        where = _resume_hint() or (f"; no checkpoint written yet in {_STATE['run_dir']}" if _STATE["run_dir"] else "")
        line = "interrupted" + where if stopped is None else stopped.message + ("" if stopped.names_checkpoint
                                                                                else where)
        if is_main_rank() or stopped is None:  # a stop is the same on every rank: said once
            print(line, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED if stopped is None else stopped.exit_code
    except Exception as err:
        if not who:
            raise  # a bug: its traceback
        from .train.lifecycle.stop import one_line

        cause, resume = one_line(err), _resume_hint()
        low = cause.lower()
        collective = isinstance(err, RuntimeError) or type(err).__module__.startswith("torch.distributed")
        if collective and ("timed out" in low or "timeout" in low):  # torch.distributed's collective timeout
            line = (f"a collective waited longer than distributed.timeout_s={_STATE.get('timeout_s')} s for the other "
                    f"processes ({cause}){resume} (fix: another rank failed or hangs: see its line; raise "
                    "distributed.timeout_s if it was only slow)")
        elif collective and ("closed by peer" in low or "connection reset" in low or "remote process" in low):
            line = f"another process of the run ended, so a collective failed ({cause}){resume}"
        else:
            import traceback

            traceback.print_exc()  # a bug keeps its traceback; then the one line that names the process
            line = cause
        print(f"error: {who}{line}", file=sys.stderr, flush=True)
        return 1
    finally:
        if who:
            _end_process_group()


def _resume_hint() -> str:
    """"; last checkpoint: PATH (...)" after an early end, when the run wrote one; "" otherwise."""
    ckpt = _last_checkpoint(_STATE["run_dir"])
    how = "rerun with train.resume=auto" if _STATE.get("resume") == "never" else "run the same command again"
    return f"; last checkpoint: {ckpt} ({how} to resume from it)" if ckpt else ""


def _end_process_group() -> None:
    """Under torchrun, destroy the process group while the interpreter is whole. Left to interpreter shutdown,
    gloo's worker threads can abort the process (SIGABRT, "terminate called without an active exception"; seen in
    CI on a rank that finished while the other still wrote the report; pytorch/pytorch#179291)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - after a failed collective the group may not shut down cleanly; exiting anyway
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
