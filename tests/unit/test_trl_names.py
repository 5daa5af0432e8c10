"""TRL's names: each renamed or translated to the rlhfkit keys it stands for (logged once), or refused in one line
that says why and what to do, never with a did-you-mean that points elsewhere; `--config FILE` is the positional
config."""

import dataclasses

import pytest
import yaml

import rlhfkit.config.aliases
from rlhfkit.cli import UsageError, split_overrides
from rlhfkit.config import RECIPES, TRL_NAMES, build_config, load_config
from rlhfkit.errors import ConfigError

M = "model.name=tiny:x"


@pytest.fixture(autouse=True)
def _fresh_log(monkeypatch):
    monkeypatch.setattr(rlhfkit.config.aliases, "_ALIASES_LOGGED", set())


def test_grpo_names_translate_to_what_they_mean(capsys):
    cfg = build_config("grpo", {}, [M, "loss_type=dr_grpo", "bf16=true", "report_to=none", "eval_strategy=no",
                                    "epsilon=0.3", "epsilon_high=0.28", "num_iterations=2",
                                    "mask_truncated_completions=true", "reward_funcs=[my_rewards.py:correct]"])
    assert cfg.algo.loss_aggregation == "seq_mean_token_sum_norm" and cfg.algo.advantage == "dr_grpo"
    assert cfg.train.mixed_precision == "bf16" and cfg.track.backends == ["jsonl"]
    assert cfg.data.eval is None and cfg.data.eval_fraction == 0.0
    assert (cfg.algo.ppo.clip_low, cfg.algo.ppo.clip_high) == (0.3, 0.28) and cfg.algo.ppo_epochs == 2
    assert cfg.algo.overlong.filter is True
    assert [f.fn for f in cfg.reward.functions] == ["my_rewards.py:correct"]
    err = capsys.readouterr().err
    assert "[config] TRL names: loss_type=dr_grpo -> algo.loss_aggregation=seq_mean_token_sum_norm " \
           "algo.advantage=dr_grpo" in err
    assert "epsilon -> algo.ppo.clip_low" in err and "bf16=true -> train.mixed_precision=bf16" in err
    assert err.count("[config]") == 1 and max(len(line) for line in err.splitlines()) <= 120  # one compact block
    build_config("grpo", {}, [M, "loss_type=dr_grpo"])
    assert "loss_type" not in capsys.readouterr().err  # logged once per process


@pytest.mark.parametrize("value,aggregation", [("dapo", "token_mean"), ("bnpo", "token_mean"),
                                               ("grpo", "seq_mean_token_mean")])
def test_loss_type_values(value, aggregation):
    cfg = build_config("grpo", {}, [M, f"loss_type={value}"])
    assert cfg.algo.loss_aggregation == aggregation and cfg.algo.advantage == "grpo"


def test_scale_rewards_false_is_dr_grpo_and_batch_is_refused():
    assert build_config("grpo", {}, [M, "scale_rewards=false"]).algo.advantage == "dr_grpo"
    assert build_config("grpo", {}, [M, "scale_rewards=group"]).algo.advantage == "grpo"
    with pytest.raises(ConfigError, match="scale_rewards='batch'.*not built in"):
        build_config("grpo", {}, [M, "scale_rewards=batch"])
    with pytest.raises(ConfigError, match="advantage is rloo"):
        build_config("rloo", {}, [M, "scale_rewards=false"])


def test_fp16_false_alone_leaves_auto_and_bf16_false_is_fp32():
    assert build_config("sft", {}, [M, "fp16=false"]).train.mixed_precision == "auto"
    assert build_config("sft", {}, [M, "bf16=false"]).train.mixed_precision == "no"


def test_preference_names():
    cfg = build_config("dpo", {}, [M, "loss_type=ipo", "beta=0.2"])
    assert (cfg.algo.loss, cfg.algo.beta) == ("ipo", 0.2)
    assert build_config("dpo", {}, [M, "loss_type=sigmoid", "label_smoothing=0.1"]).algo.label_smoothing == 0.1
    cfg = build_config("kto", {}, [M, "desirable_weight=1.5", "precompute_ref_log_probs=false"])
    assert cfg.algo.kto_desirable_weight == 1.5 and cfg.algo.reference == "on_the_fly"
    with pytest.raises(ConfigError, match="loss_type='hinge' has no rlhfkit equivalent"):
        build_config("dpo", {}, [M, "loss_type=hinge"])


def test_reward_model_and_sft_names():
    assert build_config("rm", {}, [M, "center_rewards_coefficient=0.01"]).rm.center_coef == 0.01
    cfg = build_config("sft", {}, [M, "dataset_text_field=body", "packing=true", "assistant_only_loss=true"])
    assert cfg.data.fields == {"text": "body"} and cfg.data.packing and cfg.data.completion_only_loss


@pytest.mark.parametrize("item,words", [
    ("push_to_hub=true", ["push_to_hub", "plain model directory", "huggingface-cli upload"]),
    ("hub_model_id=me/model", ["hub_model_id", "huggingface-cli upload"]),
    ("use_vllm=true", ["use_vllm", "own engine"]),
    ("device=cpu", ["device", "CUDA_VISIBLE_DEVICES="]),
    ("torch_compile=true", ["torch_compile", "rlhfkit plan"]),
])
def test_names_without_equivalent_are_refused_with_why(item, words):
    with pytest.raises(ConfigError) as e:
        build_config("grpo", {}, [M, item])
    msg = str(e.value)
    assert all(w in msg for w in words) and "did you mean" not in msg and "\n" not in msg


def test_values_that_ask_for_what_rlhfkit_does_are_accepted(capsys):
    build_config("grpo", {}, [M, "push_to_hub=false", "use_vllm=false"])
    assert "push_to_hub=false: nothing to set" in capsys.readouterr().err


def test_a_name_of_another_family_says_whose_it_is():
    with pytest.raises(ConfigError, match="'num_generations' \\(TRL\\) is a setting of the .*grpo.* not of sft"):
        build_config("sft", {}, [M, "num_generations=4"])


def test_file_and_command_line_conflicts(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "tiny:x"}, "optim": {"lr": 1e-5}, "learning_rate": 2e-5}))
    with pytest.raises(ConfigError, match="'learning_rate' and 'optim.lr' are both set"):
        load_config("sft", path, [])
    path.write_text(yaml.safe_dump({"model": {"name": "tiny:x"}, "learning_rate": 2e-5}))
    assert load_config("sft", path, []).optim.lr == 2e-5
    assert load_config("sft", path, ["learning_rate=3e-5"]).optim.lr == 3e-5  # the command line wins
    assert load_config("sft", path, ["optim.lr=4e-5"]).optim.lr == 4e-5  # over the file's TRL name
    # a TRL name and the key it stands for, both on the command line with different values: refused as in a file,
    # whichever comes first (never the later one silently)
    for pair in (["learning_rate=0.001", "optim.lr=0.005"], ["optim.lr=0.005", "learning_rate=0.001"]):
        with pytest.raises(ConfigError, match="'learning_rate' and 'optim.lr' are both set, to different values") \
                as info:
            load_config("sft", path, pair)
        assert info.value.where == "command line" and "keep only optim.lr" in info.value.fix
    for recipe, pair in (("grpo", ["beta=0.1", "algo.kl.coef=0.2"]), ("sft", ["max_steps=3", "train.max_steps=5"]),
                         ("grpo", ["learning_rate=0.001", "optim={lr: 0.005}"])):
        with pytest.raises(ConfigError, match="are both set, to different values"):
            build_config(recipe, {}, [M, *pair])
    assert load_config("sft", path, ["learning_rate=4e-5", "optim.lr=4e-5"]).optim.lr == 4e-5  # the same value
    with pytest.raises(ConfigError, match="'bf16' and 'fp16' both set train.mixed_precision"):
        build_config("sft", {}, [M, "bf16=true", "fp16=true"])


def test_every_renamed_key_exists_in_its_recipes():
    """A table entry pointing at a key no recipe of its family has would be refused at run time for everyone."""
    for entry in TRL_NAMES:
        if not entry.key:
            continue
        recipes = [r for r, s in RECIPES.items() if s.family != "pipeline"
                   and (not entry.families or s.family in entry.families)]
        found = False
        for recipe in recipes:
            obj, ok = RECIPES[recipe].config(), True
            for part in entry.key.split("."):
                if not dataclasses.is_dataclass(obj):
                    break  # inside a mapping field (data.fields.text)
                ok = part in {fl.name for fl in dataclasses.fields(obj)}
                if not ok:
                    break
                obj = getattr(obj, part)
            found |= ok
        assert found or entry.key in ("algo.clip_low", "algo.clip_high"), entry


def test_config_flag_is_the_positional_config():
    assert split_overrides(["--config", "x.yaml", "a.b=1"]) == split_overrides(["x.yaml", "a.b=1"])
    assert split_overrides(["--config=x.yaml"])[0] == "x.yaml"
    with pytest.raises(UsageError, match="two config files"):
        split_overrides(["x.yaml", "--config", "y.yaml"])
    with pytest.raises(UsageError, match="--config needs a file"):
        split_overrides(["--config"])


def test_config_show_reads_a_config_file(tmp_path, capsys):
    from rlhfkit.cli import main

    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: tiny:x\nlearning_rate: 0.002\n")
    assert main(["config", "show", "sft", "--config", str(path), "train.epochs=3"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.002" in out and "epochs: 3" in out


@pytest.mark.parametrize("recipe", ["sft", "grpo", "dpo", "ppo"])
def test_config_show_fits_120_columns_and_marks_recipe_sections(recipe, capsys):
    from rlhfkit.cli import main

    assert main(["config", "show", recipe]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    marked = {line.split()[2].rstrip(":") for line in out.splitlines() if line.startswith("# ── ")}
    shared = {"model", "data", "optim", "train", "track", "distributed"}
    assert not marked & shared and (recipe == "sft" or "algo" in marked)
    if recipe == "grpo":
        assert {"generation", "reward", "algo", "env"} <= marked
    assert yaml.safe_load(out)["recipe"] == recipe  # still valid YAML, the same keys


def test_max_steps_counts_optimizer_updates_in_every_recipe():
    assert build_config("grpo", {}, [M, "max_steps=2"]).train.max_steps == 2
    assert build_config("sft", {}, [M, "max_steps=2"]).train.max_steps == 2


def test_top_entropy_quantile_is_built_and_refused_where_it_means_nothing():
    assert build_config("grpo", {}, [M, "top_entropy_quantile=0.2"]).algo.top_entropy_quantile == 0.2
    assert build_config("grpo", {}, [M]).algo.top_entropy_quantile == 1.0  # TRL's default: every token
    assert build_config("grpo", {}, [M, "top_entropy_quantile=0.2", "loss_type=vespo"]).algo.policy_loss == "vespo"
    with pytest.raises(ConfigError, match="algo.top_entropy_quantile.*preference"):
        build_config("online-dpo", {}, [M, "algo.top_entropy_quantile=0.2"])
    with pytest.raises(ConfigError, match="top_entropy_quantile"):
        build_config("grpo", {}, [M, "algo.top_entropy_quantile=1.5"])
