"""Bad input through the command line: each mistake exits with code 2 and ONE line on stderr that names the
file:line or the key, and a failing run loses nothing a previous run wrote.

The cases run in this process through ``rlhfkit.cli.main`` (one import of torch / transformers for all of them); two
of them also run as a real ``python -m rlhfkit`` subprocess, so the one-line promise holds through the entry point
(import-time warnings included). Each test then checks its own result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = "tiny:hidden=64,layers=2,intermediate=128"
GOOD = [{"prompt": f"shout: {w}", "completion": w.upper()} for w in ["cat", "dog", "owl", "bee"] * 8]

# case -> (argv, strings the one stderr line must contain)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "malformed_jsonl": (["sft", "data.train=bad.jsonl", f"model.name={TINY}", "output_dir=runs/a"],
                        ["bad.jsonl:3", "invalid JSON"]),
    "missing_field": (["sft", "data.train=missing.jsonl", f"model.name={TINY}", "output_dir=runs/b"],
                      ["missing.jsonl:2", "missing field 'completion'"]),
    "empty_file": (["sft", "data.train=empty.jsonl", f"model.name={TINY}", "output_dir=runs/c"],
                   ["empty.jsonl", "no records"]),
    "unknown_key": (["sft", "optim.lrr=1"], ["optim.lrr", "did you mean 'optim.lr'"]),
    "unknown_key_in_file": (["sft", "typo.yaml"], ["typo.yaml", "train.batchsize", "did you mean 'train.batch_size'"]),
    "wrong_type": (["sft", "train.batch_size=many"], ["train.batch_size", "must be an integer"]),
    "missing_config_file": (["sft", "nope.yaml"], ["nope.yaml", "not found"]),
    "prompt_too_long": (["sft", "data.train=long.jsonl", f"model.name={TINY}", "data.max_length=48",
                         "data.overflow=error", "output_dir=runs/d"], ["long.jsonl:2", "tokens"]),
    "unknown_reward_module": (["eval", TINY, "--data", "prompts.jsonl", "--functions", "nope.mod:fn"],
                              ["nope.mod", "--functions"]),
    "eval_missing_model": (["eval", "./no/such/model", "--data", "prompts.jsonl"], ["./no/such/model", "not found"]),
    "eval_missing_data": (["eval", TINY, "--data", "nothere.jsonl"], ["nothere.jsonl", "no such file"]),
    "sft_missing_model": (["sft", "data.train=good.jsonl", "model.name=./no/such/model", "output_dir=runs/e"],
                          ["model.name", "./no/such/model"]),
    "generate_missing_model": (["generate", "./no/such/model", "--prompt", "hi"], ["./no/such/model"]),
    "export_missing_model": (["export", "./no/such/run", "--out", "exported"], ["./no/such/run"]),
    "eval_usage": (["eval", TINY], ["--data"]),
    "eval_unknown_env": (["eval", TINY, "--data", "prompts.jsonl", "--env", "calculater"],
                         ["--env", "did you mean 'calculator'"]),
    "eval_env_kwargs_not_a_mapping": (["eval", TINY, "--data", "prompts.jsonl", "--env", "calculator",
                                       "--env-kwargs", "[1, 2]"], ["--env-kwargs", "mapping"]),
    "eval_env_kwargs_unknown": (["eval", TINY, "--data", "prompts.jsonl", "--env", "calculator",
                                 "--env-kwargs", "{tool_rewrd: 1}"], ["--env-kwargs", "tool_rewrd"]),
    # a previous run's directory: the failing runs below must not destroy what it holds
    "keeps_previous_bad_data": (["sft", "data.train=bad.jsonl", f"model.name={TINY}", "output_dir=prev1"],
                                ["bad.jsonl:3"]),
    "keeps_previous_bad_model": (["sft", "data.train=good.jsonl", "model.name=./no/such/model", "output_dir=prev2"],
                                 ["./no/such/model"]),
}
PREVIOUS = {"metrics.jsonl": '{"step": 1, "train/loss": 1.0}\n', "model.safetensors": "weights",
            "config.json": '{"architectures": ["LlamaForCausalLM"]}', "config.yaml": "# the previous run's config\n",
            "samples.jsonl": "{}\n", "checkpoint-10/trainer_state.pt": "state"}


def _write_inputs(root: Path) -> None:
    def jsonl(name, rows, raw=()):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(line + "\n" for line in raw))

    jsonl("good.jsonl", GOOD)
    jsonl("bad.jsonl", GOOD[:2], ['{"prompt": "shout: cat", "completion": "CAT"'] + [json.dumps(r) for r in GOOD[2:]])
    jsonl("missing.jsonl", [GOOD[0], {"prompt": "shout: dog"}] + GOOD[1:])
    (root / "empty.jsonl").write_text("")
    jsonl("long.jsonl", [GOOD[0], {"prompt": "shout: " + "x" * 200, "completion": "X"}] + GOOD[1:])
    jsonl("prompts.jsonl", [{"prompt": "shout: cat", "answer": "CAT"}])
    (root / "typo.yaml").write_text("train:  # loop\n  batchsize: 8  # typo\n")
    for run in ("prev1", "prev2"):
        for name, text in PREVIOUS.items():
            (root / run / name).parent.mkdir(parents=True, exist_ok=True)
            (root / run / name).write_text(text)


SUBPROCESS_CASES = ("malformed_jsonl", "unknown_key")


def _in_process(argv: list[str], tripwire: bool = False) -> tuple[int | str, str, str]:
    """(exit code, stderr, stdout) of ``rlhfkit.cli.main(argv)`` in this process (cwd and environment as the
    caller set them). With ``tripwire``, loading a model raises :class:`_WeightsLoaded` (exit code "weights
    loaded"); any other exception, a traceback the CLI would show, becomes the exit code's text."""
    import contextlib
    import io

    import rlhfkit.models.loading
    import rlhfkit.train.online.synchronous
    import rlhfkit.train.supervised.preference
    import rlhfkit.train.supervised.reward
    import rlhfkit.train.supervised.sft
    from rlhfkit.cli import main

    err, std = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for key in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "HF_HUB_DISABLE_PROGRESS_BARS",
                    "TRANSFORMERS_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS"):  # main() sets these
            if key in os.environ:
                mp.setenv(key, os.environ[key])
            else:
                mp.delenv(key, raising=False)
        if tripwire:
            for module in (rlhfkit.models.loading, rlhfkit.train.supervised.sft, rlhfkit.train.supervised.reward,
            rlhfkit.train.supervised.preference,
                           rlhfkit.train.online.synchronous):
                for name in ("load_causal_lm", "load_scalar_model"):
                    if hasattr(module, name):
                        mp.setattr(module, name, _tripwire)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            try:
                rc = main(list(argv))
            except _WeightsLoaded:
                rc = "weights loaded"
            except Exception as exc:  # a traceback the CLI would have shown: this case fails, not the others
                rc = f"{type(exc).__name__}: {exc}"
    return rc, err.getvalue(), std.getvalue()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[int, str, str, Path]]:
    root = tmp_path_factory.mktemp("bad-input")
    _write_inputs(root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    procs = {case: subprocess.Popen([sys.executable, "-m", "rlhfkit", *CASES[case][0]], cwd=root, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for case in SUBPROCESS_CASES}
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for case, (argv, _) in CASES.items():
            rc, stderr, stdout = _in_process(argv)
            out[case] = (rc, stdout, stderr, root)
    for case, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        out[f"{case} (subprocess)"] = (p.returncode, stdout, stderr, root)
    return out


@pytest.mark.parametrize("case", [*CASES, *(f"{c} (subprocess)" for c in SUBPROCESS_CASES)])
def test_bad_input_exits_2_with_one_line(case, results):
    rc, stdout, stderr, _ = results[case]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2, f"exit {rc}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert len(lines) == 1, "expected one line on stderr, got:\n" + stderr
    assert lines[0].startswith("error: ")
    for needle in CASES[case.removesuffix(" (subprocess)")][1]:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert "Traceback" not in stdout + stderr


def test_config_errors_fail_before_any_run_directory(results):
    root = results["unknown_key"][3]
    assert not (root / "runs" / "sft").exists()  # the default output_dir was never created


@pytest.mark.parametrize("case", ["keeps_previous_bad_data", "keeps_previous_bad_model"])
def test_failed_run_keeps_previous_metrics_model_and_checkpoints(case, results):
    root = results[case][3]
    run = root / ("prev1" if case.endswith("data") else "prev2")
    for name, text in PREVIOUS.items():
        if name == "config.yaml":
            continue  # checked by the next test
        assert (run / name).read_text() == text, name
    assert not (run / ".saving").exists()

@pytest.mark.parametrize("case", ["keeps_previous_bad_data", "keeps_previous_bad_model"])
def test_failed_run_keeps_previous_config_yaml(case, results):
    root = results[case][3]
    run = root / ("prev1" if case.endswith("data") else "prev2")
    assert (run / "config.yaml").read_text() == PREVIOUS["config.yaml"]


def test_eval_writes_nothing_on_bad_input(results):
    root = results["unknown_reward_module"][3]
    assert not (root / "eval.json").exists()


def test_export_writes_nothing_on_bad_input(results):
    assert not (results["export_missing_model"][3] / "exported").exists()


# ───────────────────────── the table: every bad input of issue 13 and more, in one process ─────────────────────────
# Each case calls rlhfkit.cli.main in this process with model loading replaced by a tripwire, and must: return 2,
# print exactly one line on stderr (``error: ...``) naming the key / file:line and the fix, load no weights, and
# leave every file under the working directory (a previous run's directory among them) byte-identical.

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
_AS_ROOT = pytest.mark.skipif(ROOT_USER, reason="root can write to a read-only directory")
_GRPO = ["grpo", "data.train=prompts.jsonl", "output_dir=prev", "algo.rollout_batch_size=2", "algo.mini_batch_size=8",
         "train.batch_size=4", f"model.name={TINY}"]
_DPO = ["dpo", "data.train=pairs.jsonl", "output_dir=prev", f"model.name={TINY}"]
_SFT = ["sft", "data.train=good.jsonl", "output_dir=prev", f"model.name={TINY}"]


def _fn(spec: str) -> str:
    return f"reward.functions=[{{fn: {spec}}}]"


def _no_package(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


TABLE = [
    # no silent toy model: a run that names no model stops before anything loads (issue 22)
    ("no_model_named", ["sft", "data.train=good.jsonl", "output_dir=prev"], ["model.name", "no model named"]),
    ("no_model_named_grpo", [*_GRPO[:-1], _fn("exact_match")], ["model.name", "no model named"]),
    # the list
    ("lr_negative", [*_SFT, "optim.lr=-1e-5"], ["optim.lr", ">= 0"]),
    ("lr_nan", [*_SFT, "optim.lr=nan"], ["optim.lr", "finite"]),
    ("lr_inf", [*_SFT, "optim.lr=inf"], ["optim.lr", "finite"]),
    ("batch_size_0", [*_SFT, "train.batch_size=0"], ["train.batch_size", ">= 1"]),
    ("grad_accum_0", [*_SFT, "train.grad_accum=0"], ["train.grad_accum", ">= 1"]),
    ("max_new_tokens_0", [*_GRPO, _fn("exact_match"), "generation.max_new_tokens=0"], ["generation.max_new_tokens"]),
    ("temperature_negative", [*_GRPO, _fn("exact_match"), "generation.temperature=-0.5"],
     ["generation.temperature", ">= 0"]),
    ("dpo_beta_negative", [*_DPO, "algo.beta=-0.1"], ["algo.beta", "> 0"]),
    ("dpo_beta_alias_negative", [*_DPO, "beta=-0.1"], ["algo.beta", "> 0"]),
    ("max_steps_0", [*_SFT, "train.max_steps=0"], ["train.max_steps", "nothing would be trained"]),
    pytest.param("fp16_on_cpu", [*_SFT, "train.mixed_precision=fp16"], ["train.mixed_precision", "CUDA"],
                 marks=pytest.mark.skipif(_cuda(), reason="fp16 is valid with a GPU")),
    ("output_dir_empty", ["sft", "data.train=good.jsonl", "output_dir="], ["output_dir", "empty"]),
    ("output_dir_is_a_file", ["sft", "data.train=good.jsonl", "output_dir=good.jsonl"],
     ["output_dir", "existing file"]),
    pytest.param("output_dir_not_writable", ["sft", "data.train=good.jsonl", "output_dir=readonly"],
                 ["output_dir", "cannot be written"], marks=_AS_ROOT),
    pytest.param("output_dir_parent_not_writable", ["sft", "data.train=good.jsonl", "output_dir=readonly/run"],
                 ["output_dir", "cannot be written"], marks=_AS_ROOT),
    pytest.param("output_dir_on_sysfs", ["sft", "data.train=good.jsonl", "output_dir=/sys/rlhfkit-run"],
                 ["output_dir", "cannot be written"],
                 marks=pytest.mark.skipif(not Path("/sys").is_dir(), reason="no /sys here")),
    ("sft_last_turn_not_assistant", ["sft", "data.train=lastuser.jsonl", "output_dir=prev"],
     ["lastuser.jsonl:2", "ends with a 'user' turn"]),
    ("preference_all_tied", ["dpo", "data.train=tied.jsonl", "output_dir=prev"],
     ["tied.jsonl", "chosen equal to rejected"]),
    # config files and overrides
    ("yaml_syntax", ["sft", "syntax.yaml"], ["syntax.yaml:3", "invalid YAML"]),
    ("yaml_section_is_a_number", ["sft", "section_scalar.yaml"], ["'train' must be a mapping"]),
    ("yaml_wrong_type", ["sft", "lr_string.yaml"], ["optim.lr", "must be a number"]),
    ("yaml_not_a_mapping", ["sft", "list.yaml"], ["list.yaml", "mapping of keys"]),
    ("unknown_key_in_file", ["sft", "unknown_nested.yaml"], ["data.trian", "did you mean 'data.train'"]),
    ("unknown_key_override", [*_SFT, "outptu_dir=x"], ["outptu_dir", "did you mean 'output_dir'"]),
    ("config_of_another_recipe", ["sft", "dpo_recipe.yaml"], ["recipe 'dpo', not 'sft'"]),
    ("bool_not_a_bool", [*_SFT, "data.packing=maybe"], ["data.packing", "true or false"]),
    ("choice_misspelt", [*_SFT, "optim.schedule=cosin"], ["optim.schedule", "did you mean 'cosine'"]),
    ("top_p_0", [*_GRPO, _fn("exact_match"), "generation.top_p=0"], ["generation.top_p"]),
    ("kl_coef_negative", [*_GRPO, _fn("exact_match"), "algo.kl.coef=-1"], ["algo.kl.coef"]),
    ("eval_fraction_1", [*_SFT, "data.eval_fraction=1"], ["data.eval_fraction", "< 1"]),
    ("grpo_one_generation", [*_GRPO, _fn("exact_match"), "algo.num_generations=1"], ["algo.num_generations"]),
    ("mini_batch_does_not_split", [*_GRPO, _fn("exact_match"), "algo.mini_batch_size=5"], ["algo.mini_batch_size"]),
    ("min_tokens_above_max", [*_GRPO, _fn("exact_match"), "generation.min_new_tokens=9",
                              "generation.max_new_tokens=8"], ["generation.min_new_tokens"]),
    ("unknown_backend", [*_SFT, "track.backends=[tensorbord]"], ["track.backends", "did you mean 'tensorboard'"]),
    pytest.param("backend_package_missing", [*_SFT, "track.backends=[jsonl,wandb]"],
                 ["track.backends", "wandb package"],
                 marks=pytest.mark.skipif(not _no_package("wandb"), reason="wandb is installed")),
    ("chat_template_file_missing", [*_SFT, "model.chat_template=templates/chat.jinja"],
     ["model.chat_template", "templates/chat.jinja"]),
    ("gguf_file_with_tiny_model", [*_SFT, "model.gguf_file=model.gguf"], ["model.gguf_file"]),
    # data files
    ("data_file_missing", ["sft", "data.train=nope.jsonl", "output_dir=prev"], ["nope.jsonl", "no such file"]),
    ("eval_file_missing", [*_SFT, "data.eval=noeval.jsonl"], ["noeval.jsonl", "no such file"]),
    ("no_data_given", ["sft", "output_dir=prev"], ["data.train", "no training data"]),
    ("data_file_empty", ["sft", "data.train=empty.jsonl", "output_dir=prev"], ["empty.jsonl", "no records"]),
    ("data_file_blank_lines", ["sft", "data.train=blank.jsonl", "output_dir=prev"], ["blank.jsonl", "no records"]),
    ("jsonl_broken_on_line_5", ["sft", "data.train=badline.jsonl", "output_dir=prev"],
     ["badline.jsonl:5", "invalid JSON"]),
    ("field_mapping_to_missing_column", ["sft", "data.train=q.jsonl", "data.fields.prompt=questoin",
                                         "output_dir=prev"], ["q.jsonl:1", "data.fields.prompt", "'question'"]),
    ("fields_not_a_mapping", [*_SFT, "data.fields=question"], ["data.fields", "mapping"]),
    ("csv_without_the_columns", ["sft", "data.train=cols.csv", "output_dir=prev"], ["cols.csv:row 2", "'prompt'"]),
    ("data_not_utf8", ["sft", "data.train=latin1.jsonl", "output_dir=prev"], ["latin1.jsonl", "UTF-8"]),
    ("data_unsupported_extension", ["sft", "data.train=notes.txt", "output_dir=prev"], ["notes.txt", ".txt"]),
    ("pair_without_rejected", ["dpo", "data.train=norejected.jsonl", "output_dir=prev"],
     ["norejected.jsonl:1", "'rejected'"]),
    ("sft_data_for_dpo", ["dpo", "data.train=good.jsonl", "output_dir=prev"], ["good.jsonl:1", "'chosen'"]),
    ("split_unparsable", [*_SFT, "data.split=train[abc]"], ["data.split", "train[abc]"]),
    # reward functions: loaded and probed before any weights
    ("no_reward", [*_GRPO], ["reward", "no reward"]),
    ("reward_module_missing", [*_GRPO, _fn("nope.mod:score")], ["reward.functions", "nope.mod"]),
    ("reward_not_a_function", [*_GRPO, _fn("rf.py:NOT_A_FUNCTION")], ["rf.py:NOT_A_FUNCTION", "not a function"]),
    ("reward_wrong_length", [*_GRPO, _fn("rf.py:wrong_length")], ["rf.py:wrong_length", "returned 1 values for 4"]),
    ("reward_strings", [*_GRPO, _fn("rf.py:strings")], ["rf.py:strings", "returned a str"]),
    ("reward_scalar", [*_GRPO, _fn("rf.py:scalar")], ["rf.py:scalar", "returned a float", "not a list"]),
    ("reward_weight_nan", [*_GRPO, "reward.functions=[{fn: exact_match, weight: .nan}]"],
     ["reward.functions[0].weight", "finite"]),
    # (a function of `completions` alone is TRL's convention, called by keyword: rewards/trl_style.py)
    ("reward_takes_one_argument", [*_GRPO, _fn("rf.py:one_argument")], ["rf.py:one_argument", "takes (texts)"]),
    ("reward_kwarg_misspelt", [*_GRPO, "reward.functions=[{fn: rf.py:scaled, kwargs: {scal: 2}}]"],
     ["rf.py:scaled", "no parameter 'scal'", "did you mean 'scale'"]),
    ("reward_rule_missing_option", [*_GRPO, "reward.functions=[{fn: length_target, kwargs: {targt: 3}}]"],
     ["length_target", "target"]),
    ("reward_list_of_names", [*_GRPO, "reward.functions=[exact_match]"], ["reward.functions[0]", "mapping"]),
    # models: every path checked before the first one loads
    ("model_path_missing", [*_SFT, "model.name=./no/such/model"], ["model.name", "./no/such/model"]),
    ("model_dir_without_config", [*_SFT, "model.name=readonly"], ["model.name", "not a model directory"]),
    ("model_hub_name_not_cached", [*_SFT, "model.name=no-org/no-model"], ["model.name", "local Hugging Face cache"]),
    ("reward_model_missing", [*_GRPO, "reward.model=./no_rm"], ["reward.model", "./no_rm"]),
    ("reference_model_missing", [*_DPO, "ref_model=./no_ref"], ["ref_model", "./no_ref"]),
    ("critic_model_missing", ["ppo", "data.train=prompts.jsonl", "output_dir=prev", _fn("exact_match"),
                              "critic.model=./no_critic"], ["critic.model", "./no_critic"]),
    pytest.param("qlora_without_gpu", [*_SFT, "model.lora.enabled=true", "model.lora.qlora=true"],
                 ["model.lora.qlora", "CUDA"], marks=pytest.mark.skipif(_cuda(), reason="QLoRA may work here")),
    # recipe / data combinations
    ("sft_with_prompt_format", [*_SFT, "data.format=prompt"], ["data.format", "sft"]),
    ("kto_on_sft_data", ["kto", "data.train=good.jsonl", "output_dir=prev"], ["good.jsonl", "KTO needs"]),
    ("rm_margin_field_missing", ["rm", "data.train=pairs.jsonl", "rm.margin_field=margin", "output_dir=prev"],
     ["pairs.jsonl:1", "'margin'", "rm.margin_field"]),
    ("prompt_limit_above_length", [*_SFT, "data.max_prompt_length=100", "data.max_length=64"],
     ["data.max_prompt_length", "data.max_length"]),
    ("yaml_tab_indent", ["sft", "tabs.yaml"], ["tabs.yaml:2", "invalid YAML"]),
    ("message_role_unknown", ["sft", "data.train=robot.jsonl", "output_dir=prev"], ["robot.jsonl:1", "'robot'"]),
    ("structured_tool_calls", ["sft", "data.train=toolcalls.jsonl", "output_dir=prev"],
     ["toolcalls.jsonl:1", "'tool_calls'", "<tool_call>"]),
    ("model_name_empty", [*_SFT, "model.name="], ["model.name", "empty"]),
    ("stop_string_empty", [*_GRPO, _fn("exact_match"), "generation.stop_strings=['']"], ["generation.stop_strings"]),
    ("eval_split_unparsable", [*_SFT, "data.eval=good.jsonl", "data.eval_split=x["], ["data.eval_split", "x["]),
    ("fewer_prompts_than_a_rollout_batch", ["grpo", "data.train=prompts.jsonl", "output_dir=prev", _fn("exact_match"),
                                            "algo.rollout_batch_size=32", "algo.mini_batch_size=8",
                                            "train.batch_size=4"], ["algo.rollout_batch_size", "prompts do not fill"]),
    ("jsonl_null_line", ["sft", "data.train=nullline.jsonl", "output_dir=prev"], ["nullline.jsonl:2", "JSON object"]),
    ("data_dir_with_a_broken_file", ["sft", "data.train=bad_dir", "output_dir=prev"], ["a.jsonl:1", "invalid JSON"]),
]

_RF = '''
NOT_A_FUNCTION = 3


def wrong_length(prompts, completions, **fields):
    return [1.0]


def strings(prompts, completions, **fields):
    return ["good" for _ in completions]


def scalar(prompts, completions, **fields):
    return 1.0


def none_for_all(prompts, completions, **fields):
    return [None for _ in completions]


def one_argument(texts):
    return [1.0 for _ in texts]


def scaled(prompts, completions, scale=1.0):
    return [scale for _ in completions]
'''


def _write_table_inputs(root: Path) -> None:
    def jsonl(name, rows):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    words = ["cat", "dog", "owl", "bee"] * 4
    jsonl("good.jsonl", GOOD)
    jsonl("prompts.jsonl", [{"prompt": f"shout: {w}", "answer": w.upper()} for w in words])
    jsonl("pairs.jsonl", [{"prompt": f"shout: {w}", "chosen": w.upper(), "rejected": w} for w in words])
    jsonl("tied.jsonl", [{"prompt": f"shout: {w}", "chosen": w, "rejected": w} for w in words[:3]])
    jsonl("norejected.jsonl", [{"prompt": "shout: cat", "chosen": "CAT"}])
    user, asst = {"role": "user", "content": "shout: cat"}, {"role": "assistant", "content": "CAT"}
    jsonl("lastuser.jsonl", [{"messages": [user, asst]}, {"messages": [user, asst, user]}])
    jsonl("q.jsonl", [{"question": f"shout: {w}", "completion": w.upper()} for w in words])
    lines = [json.dumps(r) for r in GOOD[:10]]
    (root / "badline.jsonl").write_text("\n".join(lines[:4] + ['{"prompt": "x", "completion": }'] + lines[4:]) + "\n")
    (root / "empty.jsonl").write_text("")
    (root / "blank.jsonl").write_text("\n\n\n")
    (root / "cols.csv").write_text("question,answer\nshout: cat,CAT\n")
    (root / "latin1.jsonl").write_bytes('{"prompt": "caf\u00e9", "completion": "x"}\n'.encode("latin-1"))
    (root / "notes.txt").write_text("shout: cat\n")
    (root / "syntax.yaml").write_text("optim:\n  lr: [1,\n")
    (root / "section_scalar.yaml").write_text("data:\n  train: good.jsonl\ntrain: 5\n")
    (root / "lr_string.yaml").write_text("data:\n  train: good.jsonl\noptim:\n  lr: fast\n")
    (root / "list.yaml").write_text("- optim\n- train\n")
    (root / "unknown_nested.yaml").write_text("data:\n  trian: good.jsonl\n")
    (root / "dpo_recipe.yaml").write_text("recipe: dpo\n")
    (root / "tabs.yaml").write_text("optim:\n\tlr: 1\n")
    (root / "nullline.jsonl").write_text(json.dumps(GOOD[0]) + "\nnull\n")
    (root / "bad_dir").mkdir()
    (root / "bad_dir" / "a.jsonl").write_text("{broken\n")
    jsonl("robot.jsonl", [{"messages": [user, {"role": "robot", "content": "42"}, asst]}])
    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "calc"}}]}
    jsonl("toolcalls.jsonl", [{"messages": [user, call, {"role": "tool", "content": "42"}, asst]}])
    (root / "rf.py").write_text(_RF)
    (root / "readonly").mkdir(mode=0o500)
    for name, text in PREVIOUS.items():
        (root / "prev" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "prev" / name).write_text(text)


class _WeightsLoaded(Exception):
    """Raised by the tripwire that replaces model loading: a bad input got past every check."""


def _tripwire(*args, **kwargs):
    raise _WeightsLoaded


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def table_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input-table")
    _write_table_inputs(root)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for case in TABLE:
            name, argv, _ = case.values if hasattr(case, "values") else case
            if not name.startswith("no_model_named") and not any(a.startswith("model.name=") for a in argv):
                argv = [*argv, f"model.name={TINY}"]  # every case names its model (none is picked silently)
            before = _files(root)
            rc, stderr, stdout = _in_process(argv, tripwire=True)
            out[name] = (rc, stderr, stdout, before == _files(root))
    return out


@pytest.mark.parametrize("name, argv, needles", TABLE, ids=[c.values[0] if hasattr(c, "values") else c[0]
                                                            for c in TABLE])
def test_bad_input_table(name, argv, needles, table_results):
    rc, stderr, stdout, unchanged = table_results[name]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2, f"{argv}: exit {rc}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert len(lines) == 1, "expected one line on stderr, got:\n" + stderr
    assert lines[0].startswith("error: ") and "(fix: " in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert unchanged, "a file under the working directory (the previous run's among them) changed"


@pytest.mark.slow
def test_first_rollout_with_no_valid_reward_keeps_the_previous_run(tmp_path, monkeypatch, capsys):
    # a reward function returning None for every sample can only be seen on the first rollout (after the model
    # loaded): one line naming the function and the step, exit 2, and the previous run's files untouched
    from rlhfkit.cli import main

    _write_table_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path / "prev")
    rc = main([*_GRPO, _fn("rf.py:none_for_all"), "model.name=tiny:hidden=32,layers=1", "generation.max_new_tokens=4",
               "algo.total_episodes=8", "track.progress=false"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert "rf.py:none_for_all -> None x 8" in lines[0] and "at step 1" in lines[0]
    assert _files(tmp_path / "prev") == before


@pytest.mark.slow
def test_reward_function_raising_mid_run_is_one_line_naming_the_step(tmp_path, monkeypatch):
    # the function fails from its 4th call on: the probe before weights load is call 1, steps 1 and 2 are calls 2
    # and 3, so step 3 fails on every sample (its call, then each sample's call again) -> exit 2, one line naming the
    # function, the exception and the step (no traceback). A function failing on some samples only loses those
    # (tests/unit/test_reward_limits.py)
    (tmp_path / "flaky.py").write_text(
        "CALLS = []\n\n\ndef flaky(prompts, completions, **fields):\n    CALLS.append(1)\n"
        "    if len(CALLS) >= 4:\n        raise RuntimeError('judge server down')\n"
        "    return [float(len(c)) for c in completions]\n")
    _write_table_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, stderr, stdout = _in_process([*_GRPO, "output_dir=flaky_run", _fn("flaky.py:flaky"),
                                      "model.name=tiny:hidden=32,layers=1", "generation.max_new_tokens=4",
                                      "algo.total_episodes=40", "track.progress=false", "track.sample_every=0",
                                      "train.save_every=32", "reward.workers=0", "reward.lint=false",
                                      "algo.ppo_epochs=2"])
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, stderr
    assert "reward function flaky.py:flaky raised RuntimeError: judge server down at step 3" in lines[0]
    # the two finished rollout steps are not lost (checkpoints every 32 updates would have saved none): a checkpoint
    # of step 2 = update 4 (2 PPO epochs x 1 mini-batch per step) was written before stopping
    assert [p.name for p in (tmp_path / "flaky_run").glob("checkpoint-*")] == ["checkpoint-4"]


def test_distill_teacher_with_another_tokenizer_in_episodes_exits_2_before_any_weights(tmp_path, monkeypatch):
    """The README's distill command with a teacher whose tokenizer has one token more, in a multi-turn environment
    (cross-tokenizer distillation aligns one response, not episodes: not built): one line naming both vocabularies,
    exit 2, no model loaded (tripwire) and no run directory made. Single-turn, the same teacher is distilled across
    tokenizers (tests/e2e/test_distill.py)."""
    from rlhfkit.models.tokenizer import load_tokenizer

    teacher = tmp_path / "teacher"
    tok = load_tokenizer("tiny")
    tok.add_tokens(["<|tool|>"])
    tok.save_pretrained(teacher)
    (teacher / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"what is {a} + 2?", "expression": f"{a}+2"})
                                                    + "\n" for a in range(32)))
    monkeypatch.chdir(tmp_path)
    rc, stderr, stdout = _in_process([
        "distill",
        f"model.name={TINY}", "teacher.model=teacher", "data.train=prompts.jsonl", "data.eval=prompts.jsonl",
        "env.name=calculator", "output_dir=runs/distill"], tripwire=True)
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("[")]
    assert rc == 2, (rc, stdout, stderr)
    assert len(lines) == 1 and lines[0].startswith("error: teacher.model"), stderr
    for needle in (f"student {TINY} (", "teacher teacher (", "tokens", "'<|tool|>'", "not episodes with environment "
                   "turns (not built)"):
        assert needle in lines[0], (needle, lines[0])
    assert not (tmp_path / "runs").exists()


def test_distill_teacher_whose_config_is_smaller_than_its_tokenizer_exits_2_before_any_weights(tmp_path,
                                                                                                monkeypatch):
    """A teacher with the student's tokenizer but a config.json vocab_size below it (transformers' index error after
    the weights loaded): one line naming the teacher and both sizes, exit 2, no model loaded, no run directory."""
    from rlhfkit.models.tokenizer import load_tokenizer

    teacher, tok = tmp_path / "teacher", load_tokenizer("tiny")
    tok.save_pretrained(teacher)
    (teacher / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                     "vocab_size": len(tok) - 10}))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"shout: {w}"}) + "\n"
                                                    for w in ["cat", "dog"] * 16))
    monkeypatch.chdir(tmp_path)
    rc, stderr, stdout = _in_process(["distill", f"model.name={TINY}", "teacher.model=teacher",
                                      "data.train=prompts.jsonl", "output_dir=runs/distill"], tripwire=True)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: teacher.model"), stderr
    assert f"vocab_size={len(tok) - 10} in its config.json" in lines[0] and f"{len(tok)} token ids" in lines[0]
    assert not (tmp_path / "runs").exists()
