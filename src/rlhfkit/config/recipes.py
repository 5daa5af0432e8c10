"""The recipe table: the one list of recipes. The CLI's commands, config building and the pipeline all read it; a new
recipe is one :class:`Recipe` entry here (plus its runner and its config class when it needs a new one)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from .schema import OnlineConfig, PipelineConfig, PreferenceConfig, RewardModelConfig, SFTConfig

_PAIRS = {"train": "preference.jsonl", "eval": "eval_preference.jsonl"}
_PROMPTS = {"train": "prompts.jsonl", "eval": "eval_prompts.jsonl"}


@dataclass(frozen=True)
class Recipe:
    """One recipe: its command name, config class, defaults layered under the YAML, runner, family.

    family: supervised | reward | online | preference | pipeline. ``makes_policy``: its output is a policy the next
    pipeline stage starts from. ``title``: its name in the Python API's classes (``GRPO`` -> ``rlhfkit.GRPOTrainer``,
    ``rlhfkit.GRPOConfig``; default: the name in capitals). ``task_files``: the built-in task's data files for
    ``data.*`` (pipelines with a task). ``runner`` is ``module:function`` (imported only when the recipe runs, so
    ``--help`` does not import torch).
    """

    name: str
    config: type
    family: str
    runner: str
    description: str
    defaults: dict = field(default_factory=dict)
    makes_policy: bool = False
    task_files: dict = field(default_factory=dict)
    title: str = ""

    @property
    def api_name(self) -> str:
        return self.title or self.name.upper()

    def run(self, cfg):
        module, fn = self.runner.split(":")
        return getattr(importlib.import_module(module), fn)(cfg)


_ONLINE_RUNNER = "rlhfkit.train.online.synchronous:run_online"
_PREFERENCE_RUNNER = "rlhfkit.train.supervised.preference:run_preference"
_NO_NORMALIZE = {"reward": {"normalize": False}}

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("sft", SFTConfig, "supervised", "rlhfkit.train.supervised.sft:run_sft",
           "supervised fine-tuning on demonstrations",
           makes_policy=True, task_files={"train": "sft.jsonl"}),
    Recipe("rm", RewardModelConfig, "reward", "rlhfkit.train.supervised.reward:run_rm",
           "train a reward model on preference pairs (Bradley-Terry)", task_files=_PAIRS, title="Reward"),
    Recipe("ppo", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with PPO (critic + GAE)",
           {"output_dir": "runs/ppo"}, makes_policy=True, task_files=_PROMPTS),
    Recipe("grpo", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with GRPO (group-normalised advantages)",
           # one pass over each rollout (TRL's num_iterations=1): against 2, on 5 paired seeds it moved the policy 4.6x
           # less from the reference with higher greedy accuracy, at half the update's cost (docs/learning.md)
           # the missing-EOS penalty only in groups whose scores differ: on 5 paired seeds of both tasks of
           # bench/learning.py it was level or ahead on greedy and sampled accuracy at 2.5-5x less KL (docs/learning.md)
           {"output_dir": "runs/grpo", "reward": {"normalize": False, "missing_eos_scope": "varied"},
            "algo": {"advantage": "grpo", "num_generations": 4, "loss_aggregation": "seq_mean_token_mean",
                     "whiten_advantages": False, "ppo_epochs": 1, "kl": {"estimator": "k3", "coef": 0.04}}},
           makes_policy=True, task_files=_PROMPTS),
    Recipe("rloo", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with RLOO (leave-one-out baseline)",
           {"output_dir": "runs/rloo", **_NO_NORMALIZE,
            "algo": {"advantage": "rloo", "num_generations": 4, "whiten_advantages": False}},
           makes_policy=True, task_files=_PROMPTS),
    Recipe("reinforce", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with REINFORCE++",
           {"output_dir": "runs/reinforce", **_NO_NORMALIZE,
            "algo": {"advantage": "reinforce_pp", "whiten_advantages": False}},
           makes_policy=True, task_files=_PROMPTS, title="Reinforce"),
    Recipe("distill", OnlineConfig, "online", _ONLINE_RUNNER,
           "on-policy distillation: the student samples, a frozen teacher scores each token (reverse KL)",
           {"output_dir": "runs/distill", **_NO_NORMALIZE,
            "algo": {"advantage": "distill", "gamma": 0.0, "whiten_advantages": False, "ppo_epochs": 1,
                     "kl": {"coef": 0.0}}},
           makes_policy=True, task_files=_PROMPTS, title="Distill"),
    Recipe("online-dpo", OnlineConfig, "online", _ONLINE_RUNNER,
           "online DPO: the policy samples two answers a prompt, the reward picks the preferred one, a DPO-family "
           "loss on the fresh pair",
           {"output_dir": "runs/online-dpo", **_NO_NORMALIZE,
            "algo": {"objective": "preference", "advantage": "grpo", "num_generations": 2, "ppo_epochs": 1,
                     "mini_batch_size": 32, "whiten_advantages": False, "kl": {"coef": 0.0}},
            "generation": {"temperature": 0.9}},
           makes_policy=True, task_files=_PROMPTS, title="OnlineDPO"),
    Recipe("dpo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: DPO",
           {"output_dir": "runs/dpo", "algo": {"loss": "dpo"}}, makes_policy=True, task_files=_PAIRS),
    Recipe("ipo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: IPO",
           {"output_dir": "runs/ipo", "algo": {"loss": "ipo"}}, makes_policy=True, task_files=_PAIRS),
    Recipe("kto", PreferenceConfig, "preference", _PREFERENCE_RUNNER,
           "offline preference optimisation: KTO (unpaired)",
           {"output_dir": "runs/kto", "algo": {"loss": "kto"}, "data": {"format": "unpaired"}},
           makes_policy=True, task_files={"train": "unpaired.jsonl", "eval": "eval_preference.jsonl"}),
    Recipe("simpo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: SimPO",
           {"output_dir": "runs/simpo", "algo": {"loss": "simpo", "beta": 2.0}}, makes_policy=True,
           task_files=_PAIRS, title="SimPO"),
    Recipe("orpo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: ORPO",
           {"output_dir": "runs/orpo", "algo": {"loss": "orpo"}}, makes_policy=True, task_files=_PAIRS),
    Recipe("pipeline", PipelineConfig, "pipeline", "rlhfkit.pipeline:run_pipeline",
           "run several stages in order (e.g. SFT -> RM -> PPO)", title="Pipeline"),
)}
