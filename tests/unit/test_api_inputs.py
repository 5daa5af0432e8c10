"""The Python API without training: the classes made from the recipe table, every form of args / model / data /
reward functions / LoRA it takes, and its mistakes as one raised UserError (never sys.exit), before any weights."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.config import RECIPES, load_config
from rlhfkit.errors import ConfigError, DataError, UserError

TINY = "tiny:hidden=64,layers=2,intermediate=128"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _alias_notes(monkeypatch):
    from rlhfkit.config import aliases

    monkeypatch.setattr(aliases, "_ALIASES_LOGGED", set())  # notes are once per process: these tests' own set


def test_one_trainer_and_one_config_per_recipe_and_a_light_import():
    import rlhfkit
    from rlhfkit import api

    for name, spec in RECIPES.items():
        trainer, config = getattr(rlhfkit, f"{spec.api_name}Trainer"), getattr(rlhfkit, f"{spec.api_name}Config")
        assert trainer.recipe == name and config.recipe == name and issubclass(trainer, api.Trainer)
    assert {"GRPOTrainer", "SFTTrainer", "DPOTrainer", "RewardTrainer", "SimPOTrainer"} <= set(api.TRAINERS)
    with pytest.raises(AttributeError):
        rlhfkit.NoSuchTrainer  # noqa: B018
    code = "import sys, rlhfkit; assert 'torch' not in sys.modules and 'rlhfkit.api' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)  # reward workers import rlhfkit: it stays light


def test_args_in_every_form_give_the_same_config(tmp_path):
    from rlhfkit import GRPOConfig, GRPOTrainer

    want = {"optim.lr": 1e-4, "algo.num_generations": 4, "generation.max_new_tokens": 32}
    yaml_file = tmp_path / "grpo.yaml"
    yaml_file.write_text("optim: {lr: 1.0e-4}\nalgo: {num_generations: 4}\ngeneration: {max_new_tokens: 32}\n")
    forms = [GRPOConfig(learning_rate=1e-4, num_generations=4, max_completion_length=32),
             GRPOConfig(optim={"lr": 1e-4}, **{"algo.num_generations": 4, "generation.max_new_tokens": 32}),
             {"learning_rate": 1e-4, "algo": {"num_generations": 4}, "generation.max_new_tokens": 32},
             str(yaml_file), load_config("grpo", yaml_file)]
    for args in forms:
        cfg = GRPOTrainer(model=TINY, args=args, train_dataset="p.jsonl", reward_funcs="exact_match").config
        got = {"optim.lr": cfg.optim.lr, "algo.num_generations": cfg.algo.num_generations,
               "generation.max_new_tokens": cfg.generation.max_new_tokens}
        assert got == want, args
        assert cfg.model.name == TINY and cfg.data.train == "p.jsonl" and cfg.reward.functions[0].fn == "exact_match"


def test_the_trainers_own_arguments_win_over_args():
    from rlhfkit import GRPOTrainer

    cfg = GRPOTrainer(model=TINY, args={"model.name": "other", "data.train": "a.jsonl"}, train_dataset="b.jsonl",
                      reward_funcs="exact_match").config
    assert (cfg.model.name, cfg.data.train) == (TINY, "b.jsonl")


def test_mistakes_are_one_raised_user_error_located_in_a_yaml_file(tmp_path):
    from rlhfkit import GRPOConfig, GRPOTrainer, SFTTrainer, Trainer

    with pytest.raises(ConfigError, match="'optim.lr' must be >= 0"):
        GRPOConfig(learning_rate=-1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: runs/x\noptim:\n  lr: -1\n")
    with pytest.raises(ConfigError) as err:
        GRPOTrainer(model=TINY, args=str(bad))
    assert err.value.one_line().startswith(f"{bad}:3")
    with pytest.raises(ConfigError, match="no argument 'data_collator': rlhfkit collates by the data format"):
        SFTTrainer(model=TINY, data_collator=object())
    with pytest.raises(ConfigError, match="unknown recipe 'grop'"):
        Trainer("grop", model=TINY)
    with pytest.raises(ConfigError, match="holds grpo settings, not dpo's"):
        Trainer("dpo", model=TINY, args=GRPOConfig())
    with pytest.raises(ConfigError, match="reward_weights has 1 weights for 2 reward functions"):
        GRPOTrainer(model=TINY, args={"reward_weights": [1.0]}, reward_funcs=["exact_match", "format"])
    with pytest.raises(ConfigError, match="the sft recipe takes no reward"):
        SFTTrainer(model=TINY, reward_model="rm_dir")


def test_reward_funcs_become_specs_and_weights():
    from rlhfkit import GRPOTrainer
    from rlhfkit.rewards.loading import IN_PROCESS

    def mine(completions, **kwargs):
        return [0.0] * len(completions)

    sys.path.insert(0, str(Path(__file__).parent))
    import trl_reward_fns

    cfg = GRPOTrainer(model=TINY, train_dataset="p.jsonl", args={"reward_weights": [1.0, 2.0, 0.5]},
                      reward_funcs=[trl_reward_fns.format_reward_func, mine, "math_answer"]).config
    fns = cfg.reward.functions
    assert [f.fn for f in fns[:1]] == ["trl_reward_fns:format_reward_func"]  # imported by name in the workers
    assert fns[1].fn.startswith("python:") and IN_PROCESS[fns[1].fn] is mine  # the script's own: in this process
    assert [f.weight for f in fns] == [1.0, 2.0, 0.5] and [f.convention for f in fns] == ["trl", "trl", "auto"]
    # TRL's reward_funcs given in args instead: the callable stays a callable (not its repr)
    fns = GRPOTrainer(model=TINY, train_dataset="p.jsonl", args={"reward_funcs": mine}).config.reward.functions
    assert IN_PROCESS[fns[0].fn] is mine
    # in both places: the same functions are taken once; different ones are one line, never one dropped silently
    fns = GRPOTrainer(model=TINY, train_dataset="p.jsonl", args={"reward_funcs": [mine]},
                      reward_funcs=mine).config.reward.functions
    assert len(fns) == 1 and IN_PROCESS[fns[0].fn] is mine
    for in_args, given in ((mine, "math_answer"), (["exact_match"], ["exact_match", mine]), ("format", [mine])):
        with pytest.raises(ConfigError, match=r"reward_funcs is given twice with different functions: .* in args "
                                              r"and .* to the trainer; one would be dropped") as err:
            GRPOTrainer(model=TINY, train_dataset="p.jsonl", args={"reward_funcs": in_args}, reward_funcs=given)
        assert "give reward_funcs once" in str(err.value) and "\n" not in str(err.value)


def test_peft_lora_config_and_what_is_refused():
    from peft import LoraConfig

    from rlhfkit import DPOTrainer

    cfg = DPOTrainer(model=TINY, train_dataset="p.jsonl",
                     peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["v_proj", "q_proj"],
                                            task_type="CAUSAL_LM")).config
    assert dataclasses.asdict(cfg.model.lora) == {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.1,
                                                  "target_modules": ["q_proj", "v_proj"], "qlora": False}
    assert DPOTrainer(model=TINY, peft_config=LoraConfig(target_modules="all-linear")).config.model.lora \
        .target_modules is None
    with pytest.raises(ConfigError, match="peft_config.use_dora=True is not applied"):
        DPOTrainer(model=TINY, peft_config=LoraConfig(use_dora=True))


def test_python_data_is_written_once_by_content(tmp_path):
    from datasets import Dataset, DatasetDict

    from rlhfkit import GRPOTrainer
    from rlhfkit.data.sources import dataset_file

    rows = [{"prompt": f"q{i}", "answer": i} for i in range(5)]
    a, b = dataset_file(rows, "train"), dataset_file(Dataset.from_list(rows), "train")
    assert a == b and Path(a).parent == tmp_path / "cache" / "datasets"
    assert dataset_file(rows[:4], "train") != a
    import numpy as np

    assert Path(dataset_file([{"prompt": "x", "v": np.float32(0.5)}], "train")).read_text() == \
        '{"prompt": "x", "v": 0.5}\n'
    with pytest.raises(DataError, match=r"train_dataset\[1\].*row 1 is a str"):
        dataset_file([{"prompt": "x"}, "y"], "train")
    with pytest.raises(DataError, match="column 'v' holds a object value"):
        dataset_file([{"prompt": "x", "v": object()}], "train")
    dd = DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:2])})
    cfg = GRPOTrainer(model=TINY, train_dataset=dd, reward_funcs="exact_match").config
    assert cfg.data.train == a and Path(cfg.data.eval).read_text().count("\n") == 2


def test_a_loaded_model_is_written_once_by_its_weights(tmp_path):
    from rlhfkit import SFTTrainer
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm

    model, tok = load_causal_lm(ModelConfig(name=TINY), trainable=False)
    first = SFTTrainer(model=model, processing_class=tok, train_dataset="d.jsonl").config.model.name
    assert SFTTrainer(model=model, tokenizer=tok, train_dataset="d.jsonl").config.model.name == first
    again, _ = load_causal_lm(ModelConfig(name=first), trainable=False)
    assert all((p == q).all() for p, q in zip(model.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ConfigError, match="needs its tokenizer"):
        SFTTrainer(model=model)
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ConfigError, match="is a PEFT model"):
        SFTTrainer(model=get_peft_model(model, LoraConfig(target_modules=["q_proj"])), processing_class=tok)


@dataclasses.dataclass
class FakeGRPOConfig:
    """The shape of TRL's GRPOConfig that reading by attribute relies on (TRL is not installed here): declared
    defaults, a default that fails without a GPU unless use_cpu is given, and a field derived in __post_init__."""

    output_dir: str = "trainer_output"
    learning_rate: float = 1e-6
    per_device_train_batch_size: int = 8
    num_generations: int = 8
    use_cpu: bool = False
    bf16: bool | None = None
    report_to: str | list = "none"
    generation_batch_size: int | None = None

    def __post_init__(self):
        if self.bf16 is None and not self.use_cpu:
            raise ValueError("Your setup doesn't support bf16/gpu.")
        self.report_to = [] if self.report_to == "none" else self.report_to
        if self.generation_batch_size is None:
            self.generation_batch_size = self.per_device_train_batch_size


def test_a_trl_config_object_is_read_by_attribute():
    from rlhfkit import GRPOTrainer
    from rlhfkit.api import trl_args

    obj = FakeGRPOConfig(output_dir="runs/t", learning_rate=1e-5, per_device_train_batch_size=16, use_cpu=True,
                         num_generations=8)
    # given: output_dir, learning_rate, per_device_train_batch_size; not: num_generations (its default), report_to
    # (rewritten by __post_init__), generation_batch_size (derived), use_cpu (what rlhfkit does without CUDA)
    assert trl_args(obj, "grpo") == {"output_dir": "runs/t", "learning_rate": 1e-5, "per_device_train_batch_size": 16}
    cfg = GRPOTrainer(model=TINY, args=obj, train_dataset="p.jsonl", reward_funcs="exact_match").config
    assert (cfg.output_dir, cfg.optim.lr, cfg.train.batch_size) == ("runs/t", 1e-5, 16)
    # configured through TRL's interface: TRL's defaults for the fields left at theirs (8 generations, 1 iteration,
    # its geometry: 2 prompts x 8 = one update of 16), not rlhfkit's
    assert cfg.defaults == "trl" and (cfg.algo.num_generations, cfg.algo.ppo_epochs) == (8, 1)
    assert (cfg.algo.rollout_batch_size, cfg.algo.mini_batch_size, cfg.optim.schedule) == (2, 16, "linear")
    assert trl_args(FakeGRPOConfig(use_cpu=True, generation_batch_size=32), "grpo") == {"generation_batch_size": 32}


def test_a_real_trl_config_object():
    trl = pytest.importorskip("trl", reason="TRL is not a dependency (bench/.venv-trl has it)")
    from rlhfkit.api import trl_args

    obj = trl.GRPOConfig(output_dir="runs/t", learning_rate=1e-5, num_generations=4, use_cpu=True, bf16=False)
    assert trl_args(obj, "grpo") == {"output_dir": "runs/t", "learning_rate": 1e-5, "num_generations": 4,
                                     "bf16": False}


def test_user_errors_are_raised_not_exits():
    from rlhfkit import GRPOConfig

    with pytest.raises(UserError):
        GRPOConfig(no_such_key=1)


def test_lora_targets_the_model_lacks_are_one_error_naming_its_modules_before_any_work():
    from peft import LoraConfig

    from rlhfkit import DPOTrainer, SFTTrainer
    from rlhfkit.config import build_config
    from rlhfkit.train.lifecycle.run import check_lora

    for targets in (["query", "value"], "layers\\.\\d+\\.attention\\.wq", ["q_proj", "c_attn"]):  # a list, a regex
        with pytest.raises(ConfigError, match="match(es)? no module of .*its adaptable modules are .*q_proj") as info:
            SFTTrainer(model=TINY, train_dataset="p.jsonl", peft_config=LoraConfig(target_modules=targets))
        assert info.value.where == "model.lora.target_modules" and "\n" not in str(info.value)
    # what the model has: names (its last components) and peft's regular-expression form
    for targets in (["q_proj", "v_proj"], "model\\.layers\\.\\d+\\.self_attn\\.(q|v)_proj"):
        assert DPOTrainer(model=TINY, peft_config=LoraConfig(target_modules=targets)).config.model.lora.enabled
    # the same check at the start of a run from a config file or the command line, before data or weights
    cfg = build_config("sft", {}, [f"model.name={TINY}", "model.lora.enabled=true", "model.lora.target_modules=[wq]",
                                   "data.train=missing.jsonl"])
    with pytest.raises(ConfigError, match="LoRA target 'wq' matches no module"):
        check_lora(cfg)


def test_model_none_is_refused_when_the_trainer_is_made():
    from rlhfkit import GRPOTrainer

    with pytest.raises(ConfigError, match="no model: model=None") as info:
        GRPOTrainer(model=None, reward_funcs="exact_match", train_dataset="p.jsonl")
    assert info.value.where == "model"
    assert GRPOTrainer(args={"model.name": TINY}, reward_funcs="exact_match").config.model.name == TINY


def test_data_errors_name_the_users_object_and_row_and_a_none_prompt_as_such():
    from rlhfkit.data import load_dataset_records
    from rlhfkit.data.sources import dataset_file

    path = dataset_file([{"prompt": "a", "answer": "1"}, {"prompt": None, "answer": "2"}], "train")
    with pytest.raises(DataError, match=r"^train_dataset\[1\]: 'prompt' is None \(null\) in this row"):
        load_dataset_records(path, "prompt")
    path = dataset_file([{"completion": "x"}, {"question": "q", "answer": "2"}], "eval", "train_dataset['test']")
    with pytest.raises(DataError, match=r"^train_dataset\['test'\]\[0\]: ") as info:
        load_dataset_records(path, "auto")
    assert "cache" not in str(info.value)
def test_the_interface_decides_whose_defaults(tmp_path):
    """docs/coming-from-trl.md's rule: configured through TRL's interface (a TRL-named trainer without rlhfkit keys, a
    TRL config object, TRL names in args or a file) -> TRL 1.16's defaults; rlhfkit's keys, the generic Trainer, the
    command line alone -> rlhfkit's; `defaults` said wins."""
    from rlhfkit import (
        DPOTrainer,
        GRPOConfig,
        GRPOTrainer,
        KTOTrainer,
        OnlineDPOTrainer,
        PPOTrainer,
        RewardTrainer,
        SFTTrainer,
        Trainer,
    )
    from rlhfkit.config import build_config

    def grpo(**kw):
        return GRPOTrainer(model=TINY, train_dataset="p.jsonl", reward_funcs="exact_match", **kw).config

    quick = grpo()  # TRL's quickstart: GRPOTrainer(model, reward_funcs, train_dataset)
    assert (quick.defaults, quick.optim.lr, quick.train.epochs, quick.algo.num_generations) == ("trl", 1e-6, 3.0, 8)
    assert (quick.generation.max_new_tokens, quick.data.plain_text, quick.reward.clip) == (512, "raw", None)
    assert quick.train.resume == "never"  # TRL's train() starts over unless resume_from_checkpoint says otherwise
    assert grpo(args=GRPOConfig(learning_rate=1e-5)).defaults == "trl"
    assert grpo(args={"learning_rate": 1e-5, "algo": {"num_generations": 4}}).defaults == "trl"  # TRL names win
    own = grpo(args=GRPOConfig(optim={"lr": 1e-5}))
    assert own.defaults == "rlhfkit" and own.algo.kl.coef == 0.04 and own.data.plain_text == "template"
    assert own.train.resume == "auto"
    assert grpo(args=GRPOConfig(defaults="rlhfkit", learning_rate=1e-5)).defaults == "rlhfkit"
    assert Trainer("grpo", model=TINY, train_dataset="p.jsonl", reward_funcs="exact_match").config.defaults == \
        "rlhfkit"
    trl_yaml, own_yaml = tmp_path / "trl.yaml", tmp_path / "own.yaml"
    trl_yaml.write_text("learning_rate: 1.0e-5\nnum_generations: 4\n")
    own_yaml.write_text("optim: {lr: 1.0e-5}\n")
    assert grpo(args=str(trl_yaml)).defaults == "trl" and grpo(args=str(own_yaml)).defaults == "rlhfkit"
    cli = build_config("grpo", {}, [f"model.name={TINY}", "learning_rate=1e-5"])  # the CLI's own recipe
    assert cli.defaults == "rlhfkit" and cli.algo.kl.coef == 0.04  # TRL: beta=0
    # every TRL-mirrored recipe: TRL's learning rate, 3 epochs, the short last batch kept
    for cls, lr in ((SFTTrainer, 2e-5), (DPOTrainer, 1e-6), (KTOTrainer, 1e-6), (RewardTrainer, 1e-4),
                    (OnlineDPOTrainer, 5e-7)):
        extra = {"reward_funcs": "exact_match"} if cls is OnlineDPOTrainer else {}
        cfg = cls(model=TINY, train_dataset="d.jsonl", **extra).config
        assert (cfg.defaults, cfg.optim.lr, cfg.train.epochs) == ("trl", lr, 3.0), cls.__name__
        assert cfg.train.drop_last is (cls is OnlineDPOTrainer), cls.__name__  # online: no batches to drop
    assert DPOTrainer(model=TINY, train_dataset="d.jsonl").config.algo.reference == "on_the_fly"
    online_dpo = OnlineDPOTrainer(model=TINY, train_dataset="d.jsonl", reward_funcs="exact_match",
                                  args={"per_device_train_batch_size": 4}).config  # 4 prompts x 2 a step, 1 update
    assert (online_dpo.algo.rollout_batch_size, online_dpo.algo.mini_batch_size, online_dpo.train.batch_size) == \
        (4, 8, 8)
    ppo = PPOTrainer(model=TINY, train_dataset="p.jsonl", reward_funcs="exact_match").config
    assert ppo.defaults == "rlhfkit"  # TRL 1.16 has no PPO trainer


def test_reward_funcs_twice_use_cpu_and_checkpointing_kwargs():
    from rlhfkit import GRPOTrainer

    with pytest.raises(ConfigError, match="reward_funcs is given twice") as e:
        GRPOTrainer(model=TINY, train_dataset="p.jsonl", reward_funcs="exact_match",
                    args={"reward_funcs": ["math_answer"]})  # neither silently dropped
    assert "once" in e.value.fix
    cfg = GRPOTrainer(model=TINY, train_dataset="p.jsonl", reward_funcs="exact_match",
                      args={"use_cpu": True, "gradient_checkpointing": True,
                            "gradient_checkpointing_kwargs": {"use_reentrant": False}}).config
    assert cfg.train.device == "cpu" and cfg.model.gradient_checkpointing  # TRL's meaning, not refused
    with pytest.raises(ConfigError, match="use_reentrant"):
        GRPOTrainer(model=TINY, train_dataset="p.jsonl", reward_funcs="exact_match",
                    args={"gradient_checkpointing_kwargs": {"use_reentrant": True}})


def test_the_start_up_block_of_a_supervised_run_says_whose_defaults(capsys):
    from rlhfkit.config import build_config
    from rlhfkit.config.startup import startup_block

    own = startup_block(build_config("sft", {"model": {"name": TINY}, "optim": {"lr": 1e-4}}))
    flat = own.replace("\n    ", " ")
    assert flat.startswith("[sft] rlhfkit's defaults where TRL 1.16's SFTConfig differs (defaults=trl for TRL's):")
    assert "train.epochs=1 [num_train_epochs=3]" in flat and "optim.lr" not in flat  # never the user's own value
    trl = startup_block(build_config("dpo", {"model_name_or_path": TINY, "learning_rate": 1e-4,
                                             "dataset_name": "d.jsonl", "logging_steps": 1}))
    flat = trl.replace("\n    ", " ")
    assert "[dpo] defaults: TRL 1.16's DPOConfig (the configuration is written with TRL's names" in flat
    assert "TRL keeps every checkpoint" in flat  # save_steps=500: a row that applies
    assert "logs the mean over the window" not in flat  # logging_steps=1: that row does not apply
    assert max(len(line) for line in trl.splitlines()) <= 120
