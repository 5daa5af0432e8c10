"""Typed configuration: one frozen dataclass per recipe, composed of small shared sections.

A config comes from a YAML file plus dotted overrides (``optim.lr=1e-4``, ``output_dir=runs/x``). Building it
validates every key and type once: unknown keys and wrong types raise :class:`~rlhfkit.errors.ConfigError` with the
key path and a "did you mean" hint. After that the config is frozen; nothing rewrites it. Every field has a help
string (``field(metadata={"help": ...})``) from which the commented YAML files in ``configs/`` are checked.

One job per module (each imports only those above it, plus ``errors``):

* :mod:`.splits` — the split syntax of ``data.split`` (``train[:500]``);
* :mod:`.choices` — the values a key may take: static, read from the registries (lazily), tracker names;
* :mod:`.checks` — the cross-field rules (``check()``) and what a run needs (``check_inputs()``);
* :mod:`.schema` — the field helper :func:`f` and every section and recipe dataclass;
* :mod:`.recipes` — the recipe table :data:`RECIPES`;
* :mod:`.trl` — the table of TRL's names: renamed, translated (``loss_type=dr_grpo``) or refused with why;
* :mod:`.trl_defaults` — TRL 1.16's defaults per recipe as rlhfkit settings (``defaults=trl``);
* :mod:`.geometry` — the online step's batch geometry, TRL's derivation of it, the block every online run starts
  with (what differs from TRL's defaults);
* :mod:`.aliases` — applying that table while a config is built (``learning_rate`` -> ``optim.lr``), logged once;
  the sources in order (defaults < file < command line, whichever names) and the did-you-mean;
* :mod:`.parse` — YAML, dotted overrides, coercion with bounds and did-you-mean, :func:`build_config`,
  :func:`dump_yaml`.
"""

from .aliases import trl_entry
from .checks import check_backends, check_output_dir, require_model
from .choices import STATIC_CHOICES, choices_of, known_backends, registry_choices
from .parse import (
    build_config,
    dump_yaml,
    load_config,
    locate,
    parse_override,
    read_yaml,
    replace,
    save_config,
    show_yaml,
    specific_sections,
)
from .recipes import RECIPES, Recipe
from .schema import (
    AsyncConfig,
    CriticConfig,
    DataConfig,
    DistributedConfig,
    DynamicSamplingConfig,
    EnvConfig,
    GenerationConfig,
    KLConfig,
    LoraConfig,
    MemoryConfig,
    ModelConfig,
    OffPolicyConfig,
    OnlineAlgoConfig,
    OnlineConfig,
    OptimConfig,
    OverlongConfig,
    PipelineConfig,
    PreferenceAlgoConfig,
    PreferenceConfig,
    RewardConfig,
    RewardFunction,
    RewardModelConfig,
    RMConfig,
    SFTConfig,
    TeacherConfig,
    TrackConfig,
    TrainConfig,
    f,
    field_of,
    key_of,
)
from .splits import parse_split
from .trl import TRL_NAMES, TrlName

__all__ = [
    "RECIPES", "TRL_NAMES", "STATIC_CHOICES", "AsyncConfig", "CriticConfig",
    "DataConfig", "DistributedConfig", "DynamicSamplingConfig",
    "EnvConfig", "GenerationConfig", "KLConfig", "LoraConfig", "MemoryConfig", "ModelConfig", "OffPolicyConfig",
    "OnlineAlgoConfig", "OnlineConfig", "OptimConfig", "OverlongConfig", "PipelineConfig", "PreferenceAlgoConfig",
    "PreferenceConfig", "Recipe", "RewardConfig", "RewardFunction", "RewardModelConfig", "RMConfig", "SFTConfig",
    "TeacherConfig", "TrackConfig", "TrainConfig", "TrlName", "build_config", "check_backends", "check_output_dir",
    "choices_of", "dump_yaml", "f", "field_of", "key_of", "known_backends", "load_config", "locate", "parse_override",
    "parse_split",
    "read_yaml",
    "registry_choices", "replace", "require_model", "save_config", "show_yaml", "specific_sections", "trl_entry",
]
