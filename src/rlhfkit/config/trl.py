"""TRL's names: every field of TRL 1.16's ``GRPOConfig``, ``RLOOConfig``, ``DPOConfig``, ``KTOConfig``, ``SFTConfig``,
``RewardConfig``, ``ModelConfig`` / ``ScriptArguments`` and of ``transformers.TrainingArguments`` (5.x, plus the 4.x
names users still write), each either

* **renamed**: the value goes to one rlhfkit key as it is (``learning_rate`` -> ``optim.lr``);
* **translated**: the meanings differ and a function turns the value into rlhfkit keys
  (``loss_type=dr_grpo`` -> ``algo.loss_aggregation=seq_mean_token_sum_norm`` + ``algo.advantage=dr_grpo``);
* or **refused**, with why and what to do instead (``push_to_hub``: rlhfkit writes a plain model directory;
  upload it with ``huggingface-cli upload``), except for the values in ``accepted``, which ask for what rlhfkit does
  anyway (``push_to_hub=false``, ``use_vllm=false``) and set nothing.

This module is the table only (and the README's rendering of it, :func:`markdown_tables`; the translation
functions it names are in :mod:`.trl_values`); :mod:`.aliases` applies
it while a config is built. A name that means different things per recipe family has one entry per family
(``beta``: the KL coefficient online, the preference strength in the DPO family).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .trl_values import (  # noqa: F401 - the table's translations; some names re-exported for .aliases
    GEOMETRY_INPUT,
    NoEquivalent,
    _adam_beta,
    _assistant_only,
    _center_rewards,
    _checkpointing_kwargs,
    _choice,
    _completion_only,
    _dataset,
    _dataset_test_split,
    _deepspeed,
    _disable_tqdm,
    _eval_strategy,
    _fsdp,
    _generation_kwargs,
    _geometry_input,
    _importance_sampling_level,
    _log_completions,
    _logging_steps,
    _max_grad_norm,
    _max_tool_iterations,
    _mixed_precision,
    _model_init_kwargs,
    _no_cuda,
    _online_beta,
    _online_epochs,
    _online_eval_batch,
    _online_logging,
    _online_loss_type,
    _overwrite,
    _report_to,
    _resume,
    _reward_clip_range,
    _reward_funcs,
    _save_strategy,
    _save_total_limit,
    _scale_rewards,
    _schedule,
    _warmup_steps,
    same_value,
    truthy,
    word,
)


@dataclass(frozen=True)
class TrlName:
    """One TRL / transformers name: the rlhfkit key it is (``key``), the translation of its value (``to``), or why it
    has no equivalent (``why`` / ``fix``)."""

    name: str
    key: str | None = None  # renamed: the value goes here as it is
    to: Callable[[Any, Any], dict[str, Any]] | None = None  # translated: (value, ctx) -> {rlhfkit key: value}
    doc: str = ""  # what the translation does (README), or why there is no equivalent
    fix: str = ""  # refused: what to do instead
    families: tuple[str, ...] = ()  # recipe families the entry is for; () = every family
    accepted: tuple = ()  # refused names: values that ask for what rlhfkit does anyway (nothing to set)
    words: bool = False  # the value is a word (YAML 1.1 reads eval_strategy=no as false): logged as written

    @property
    def refused(self) -> bool:
        return self.key is None and self.to is None


# ───────────────────────────────────────────────── the table ──────────────────────────────────────────────────


def _renamed(*pairs: tuple[str, str], families: tuple[str, ...] = ()) -> list[TrlName]:
    return [TrlName(name, key=key, families=families) for name, key in pairs]


def _refused(names: tuple[str, ...], why: str, fix: str, accepted: tuple = (None,),
             families: tuple[str, ...] = ()) -> list[TrlName]:
    return [TrlName(name, doc=why, fix=fix, accepted=accepted, families=families) for name in names]


_ONLINE, _PREF = ("online",), ("preference",)
_VLLM = "rlhfkit generates with its own engine on the policy's weights in place (generation.engine); no vLLM"

TRL_NAMES: list[TrlName] = [
    # ── optimizer and schedule (TrainingArguments)
    *_renamed(("learning_rate", "optim.lr"), ("lr", "optim.lr"), ("weight_decay", "optim.weight_decay"),
              ("warmup_ratio", "optim.warmup_ratio"), ("adam_epsilon", "optim.eps")),
    TrlName("warmup_steps", to=_warmup_steps, doc="`optim.warmup_steps` (a float below 1: `optim.warmup_ratio`, as "
            "transformers 5 reads it)"),
    TrlName("lr_scheduler_type", to=_schedule, doc="`optim.schedule`: linear, cosine, constant; "
            "constant_with_warmup -> constant (warm-up applies to every schedule)"),
    TrlName("max_grad_norm", to=_max_grad_norm, doc="`optim.max_grad_norm` (0 -> null: no clipping)"),
    TrlName("adam_beta1", to=_adam_beta(0), doc="`optim.betas[0]`"),
    TrlName("adam_beta2", to=_adam_beta(1), doc="`optim.betas[1]`"),
    TrlName("optim", to=_choice("optim", {k: {} for k in ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw")},
                                "remove optim: rlhfkit trains with torch.optim.AdamW (optim.* sets it)"),
            doc="AdamW variants accepted (rlhfkit trains with `torch.optim.AdamW`); 8-bit, paged, Adafactor, SGD... "
                "are not built in"),
    # ── batches, length of the run, checkpoints (TrainingArguments)
    *_renamed(("per_device_train_batch_size", "train.batch_size"), ("per_gpu_train_batch_size", "train.batch_size"),
              ("per_device_eval_batch_size", "train.eval_batch_size"),
              ("per_gpu_eval_batch_size", "train.eval_batch_size"),
              ("gradient_accumulation_steps", "train.grad_accum"), ("num_train_epochs", "train.epochs"),
              ("max_steps", "train.max_steps"), ("seed", "train.seed"), ("eval_steps", "train.eval_every"),
              ("save_steps", "train.save_every")),
    TrlName("logging_steps", to=_logging_steps, doc="`train.log_every` (a whole number of updates; TRL's fraction "
            "of the run is refused)"),
    TrlName("save_total_limit", to=_save_total_limit, doc="`train.save_total_limit` (null, keep all: refused)"),
    TrlName("resume_from_checkpoint", to=_resume, doc="`train.resume`: a path -> that checkpoint, true -> auto "
            "(the latest valid one), false / null -> never (TRL starts over unless told)"),
    TrlName("overwrite_output_dir", to=_overwrite, doc="true -> `train.resume=never` (start over in output_dir)"),
    TrlName("eval_strategy", to=_eval_strategy, words=True,
            doc="no -> `data.eval=null data.eval_fraction=0` (no evaluation); steps -> nothing (eval_steps sets "
                "`train.eval_every`); epoch: refused"),
    TrlName("evaluation_strategy", to=_eval_strategy, words=True, doc="as `eval_strategy` (its transformers 4 name)"),
    TrlName("save_strategy", to=_save_strategy, words=True,
            doc="no -> `train.save_every=0` (only the final model); steps -> nothing (save_steps); epoch / best: "
                "refused"),
    TrlName("logging_strategy", to=_choice("logging_strategy", {"steps": {}}, "use logging_steps=N"),
            doc="steps only (logging_steps sets `train.log_every`)"),
    # ── precision, memory (TrainingArguments)
    TrlName("bf16", to=_mixed_precision("bf16"), doc="true -> `train.mixed_precision=bf16`; false -> `no` "
            "(unless fp16=true)"),
    TrlName("fp16", to=_mixed_precision("fp16"), doc="true -> `train.mixed_precision=fp16`; false -> nothing "
            "(TRL's default, bf16 where it can, is rlhfkit's auto)"),
    TrlName("gradient_checkpointing", key="model.gradient_checkpointing"),
    TrlName("gradient_checkpointing_kwargs", to=_checkpointing_kwargs, doc="`{use_reentrant: false}` (what rlhfkit "
            "does) or empty: nothing to set; re-entrant checkpointing refused"),
    TrlName("fsdp", to=_fsdp, doc="any FSDP option -> `distributed.strategy=fsdp2` (PyTorch fully_shard); "
            "`offload` in it -> `distributed.cpu_offload=true`"),
    TrlName("deepspeed", to=_deepspeed, doc="a JSON path -> `distributed.strategy=deepspeed "
            "distributed.deepspeed_config=PATH`"),
    TrlName("auto_find_batch_size", doc="batch sizes are not searched at run time", fix="run `rlhfkit plan RECIPE "
            "... --gpu-memory 24GiB` before the run: it prints the change that fits", accepted=(False,)),
    TrlName("use_cpu", to=_no_cuda, doc="true -> `train.device=cpu` (the CPU even with a GPU visible); false: "
            "nothing to set"),
    TrlName("no_cuda", to=_no_cuda, doc="as `use_cpu`"),
    TrlName("device", doc="rlhfkit trains on CUDA whenever a GPU is visible, else on the CPU (`args.device` is a "
            "read-only property in TRL)", fix="hide the GPUs to train on the CPU: CUDA_VISIBLE_DEVICES= rlhfkit ..."),
    # ── tracking (TrainingArguments)
    TrlName("report_to", to=_report_to, doc="`track.backends` (jsonl is always written; none -> `[jsonl]`)"),
    TrlName("disable_tqdm", to=_disable_tqdm, doc="true -> `track.progress=false`"),
    TrlName("log_completions", to=_log_completions, families=_ONLINE,
            doc="false -> `track.sample_every=0`; true -> nothing (samples every `track.sample_every` steps)"),
    # ── model (TRL ModelConfig)
    TrlName("model_name_or_path", key="model.name"),
    TrlName("dtype", key="model.dtype"),
    TrlName("torch_dtype", key="model.dtype"),
    TrlName("model_init_kwargs", to=_model_init_kwargs, doc="`{dtype: X}` -> `model.dtype=X`; other keys refused"),
    *_renamed(("use_peft", "model.lora.enabled"), ("lora_r", "model.lora.r"), ("lora_alpha", "model.lora.alpha"),
              ("lora_dropout", "model.lora.dropout"), ("lora_target_modules", "model.lora.target_modules"),
              ("load_in_4bit", "model.lora.qlora")),
    TrlName("chat_template_path", key="model.chat_template"),
    # ── data (TRL ScriptArguments, SFTConfig)
    TrlName("dataset_name", to=_dataset, doc="`data.train` (with dataset_config: `data.train=NAME:CONFIG`)"),
    TrlName("dataset_config", to=_dataset, doc="`data.train=NAME:CONFIG`"),
    TrlName("dataset_train_split", key="data.split"),
    TrlName("dataset_test_split", to=_dataset_test_split, doc="`data.eval=DATASET data.eval_split=SPLIT`"),
    TrlName("dataset_text_field", key="data.fields.text"),
    *_renamed(("max_length", "data.max_length"), ("max_prompt_length", "data.max_prompt_length")),
    TrlName("packing", key="data.packing"),
    TrlName("completion_only_loss", to=_completion_only, doc="`data.completion_only_loss` (null: rlhfkit's default, "
            "true)"),
    TrlName("assistant_only_loss", to=_assistant_only, doc="true -> `data.completion_only_loss=true` (conversations: "
            "assistant turns only)"),
    # ── online RL (GRPOConfig, RLOOConfig, PPOConfig)
    *_renamed(("max_completion_length", "generation.max_new_tokens"), ("max_new_tokens", "generation.max_new_tokens"),
              ("temperature", "generation.temperature"), ("top_p", "generation.top_p"), ("top_k", "generation.top_k"),
              ("num_generations", "algo.num_generations"), ("num_ppo_epochs", "algo.ppo_epochs"),
              ("num_iterations", "algo.ppo_epochs"), ("entropy_coef", "algo.entropy_coef"),
              ("top_entropy_quantile", "algo.top_entropy_quantile"),
              ("mask_truncated_completions", "algo.overlong.filter"), ("kl_coef", "algo.kl.coef"),
              ("reward_model_path", "reward.model"),
              ("normalize_advantages", "algo.whiten_advantages"), ("total_episodes", "algo.total_episodes"),
              families=_ONLINE),
    TrlName("beta", to=_online_beta, families=_ONLINE, doc="`algo.kl.coef`; in online DPO (algo.objective="
            "preference) `algo.preference.beta` (OnlineDPOConfig's list of one too)"),
    TrlName("missing_eos_penalty", key="reward.missing_eos_penalty", families=_ONLINE),
    TrlName("epsilon", key="algo.clip_low", families=_ONLINE,
            doc="`algo.clip_low`, rlhfkit's earlier name, which goes on to the chosen policy loss's section: "
                "`algo.<section>.clip_low` (`algo.ppo.clip_low` for ppo; the sections in `rlhfkit config show "
                "grpo`); a loss without a clip range (sapo) refuses it"),
    TrlName("cliprange", key="algo.clip_low", families=_ONLINE, doc="as `epsilon`"),
    TrlName("epsilon_high", key="algo.clip_high", families=_ONLINE,
            doc="`algo.clip_high`, likewise: `algo.<section>.clip_high`"),
    TrlName("loss_type", families=_ONLINE, to=_online_loss_type,
            doc="dapo, bnpo -> `algo.loss_aggregation=token_mean`; grpo -> `seq_mean_token_mean`; dr_grpo -> "
                "`seq_mean_token_sum_norm` + `algo.advantage=dr_grpo`; luspo, vespo -> `algo.policy_loss` (+ their "
                "aggregation); cispo, sapo refused; online DPO: sigmoid -> `algo.preference.loss=dpo`, ipo -> `ipo`"),
    TrlName("scale_rewards", to=_scale_rewards, families=_ONLINE,
            doc="true / group -> `algo.advantage=grpo`; false / none -> `algo.advantage=dr_grpo` (Dr. GRPO: no std "
                "scaling); batch refused"),
    TrlName("importance_sampling_level", families=_ONLINE, to=_importance_sampling_level,
            doc="token -> `algo.policy_loss=ppo`; sequence -> `gspo`; luspo's sequence (vespo's token) keeps it"),
    *_renamed(("vespo_k_pos", "algo.vespo.k_pos"), ("vespo_lambda_pos", "algo.vespo.lambda_pos"),
              ("vespo_k_neg", "algo.vespo.k_neg"), ("vespo_lambda_neg", "algo.vespo.lambda_neg"), families=_ONLINE),
    TrlName("reward_funcs", to=_reward_funcs, families=_ONLINE,
            doc="`reward.functions=[{fn: ...}]`: each a function spec (`package.module:function`, `file.py:function` "
                "or a built-in name); a reward model goes to `reward.model`"),
    TrlName("reward_weights", to=_reward_funcs, families=_ONLINE, doc="the `weight` of each `reward.functions` entry"),
    TrlName("reward_clip_range", to=_reward_clip_range, families=_ONLINE,
            doc="a symmetric `[-c, c]` -> `reward.clip=c`"),
    TrlName("max_tool_calling_iterations", to=_max_tool_iterations, families=_ONLINE,
            doc="`env.max_turns` = iterations + 1 (rlhfkit counts assistant turns)"),
    TrlName("generation_kwargs", to=_generation_kwargs, families=_ONLINE,
            doc="temperature, top_p, top_k, max_new_tokens, min_new_tokens, stop_strings -> `generation.*`; others "
                "refused"),
    # ── preference (DPOConfig, KTOConfig)
    *_renamed(("beta", "algo.beta"), ("label_smoothing", "algo.label_smoothing"),
              ("desirable_weight", "algo.kto_desirable_weight"),
              ("undesirable_weight", "algo.kto_undesirable_weight"), families=_PREF),
    TrlName("loss_type", families=_PREF, to=_choice("loss_type", {"sigmoid": {"algo.loss": "dpo"},
                                                                  "ipo": {"algo.loss": "ipo"},
                                                                  "kto": {"algo.loss": "kto"}},
                                                    "use the recipe: rlhfkit dpo | ipo | kto | simpo | orpo"),
            doc="sigmoid -> `algo.loss=dpo`, ipo -> `ipo`, kto -> `kto`; the other TRL losses refused"),
    TrlName("precompute_ref_log_probs", families=_PREF,
            to=_choice("precompute_ref_log_probs", {"true": {"algo.reference": "precompute"},
                                                    "false": {"algo.reference": "on_the_fly"}}, "give true or false"),
            doc="true -> `algo.reference=precompute`, false -> `on_the_fly`"),
    # ── reward model (RewardConfig), SFT loss (SFTConfig)
    TrlName("center_rewards_coefficient", to=_center_rewards, families=("reward",),
            doc="`rm.center_coef` (null -> 0)"),
    TrlName("loss_type", families=("supervised",), to=_choice("loss_type", {"nll": {}}, "remove loss_type (SFT "
                                                                                        "trains the NLL)"),
            doc="nll only (rlhfkit's SFT loss); dft refused"),
    # ── no equivalent: why, and what to do instead
    *_refused(("push_to_hub", "hub_model_id", "hub_token", "hub_private_repo", "hub_strategy", "hub_always_push",
               "hub_revision", "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token",
               "log_completions_hub_repo"),
              "rlhfkit writes a plain model directory and uploads nothing",
              "upload it with `huggingface-cli upload REPO OUTPUT_DIR`", accepted=(None, False, "every_save")),
    *_refused(("use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
               "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
               "vllm_group_port", "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
               "ds3_gather_for_generation", "use_transformers_continuous_batching",
               "transformers_continuous_batching_config", "use_transformers_paged", "cache_implementation"),
              _VLLM, "remove it; generation.engine and generation.batch_size choose how rollouts run",
              accepted=(None, False), families=_ONLINE),
    *_refused(("vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_cap",
               "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "use_bias_correction_kl",
               "off_policy_mask_threshold"),
              "the rollout / trainer mismatch correction is algo.off_policy (its own engine, no vLLM)",
              "set algo.off_policy.correction=tis|mis|icepop with algo.off_policy.level / cap / low / high "
              "(icepop: algo.off_policy.icepop.low / high)",
              families=_ONLINE),
    # ── the batch geometry of an online step, translated together once every source is merged (config/geometry.py:
    #    TRL derives the update and the generation batch from per_device_train_batch_size; rlhfkit names them)
    TrlName("gradient_accumulation_steps", to=_geometry_input, families=_ONLINE,
            doc="`algo.mini_batch_size` = per_device_train_batch_size x G (TRL's samples per update per device)"),
    TrlName("generation_batch_size", to=_geometry_input, families=_ONLINE,
            doc="`algo.rollout_batch_size` = generation_batch_size / (num_generations x processes) (TRL counts "
                "samples over every process, rlhfkit prompts per process)"),
    TrlName("steps_per_generation", to=_geometry_input, families=_ONLINE,
            doc="`algo.rollout_batch_size` = per_device_train_batch_size x S / num_generations (TRL's generation "
                "batch is S micro-batches of every process)"),
    TrlName("num_train_epochs", to=_online_epochs, families=_ONLINE,
            doc="`train.epochs` with `algo.total_episodes=null` (the run is that many passes over the prompts)"),
    TrlName("logging_steps", to=_online_logging, families=_ONLINE,
            doc="nothing to set: the online recipes log one line per rollout step"),
    TrlName("per_device_eval_batch_size", to=_online_eval_batch, families=_ONLINE,
            doc="nothing to set: online evaluation generates 64 prompts at a time"),
    *_refused(("delta", "sapo_temperature_neg", "sapo_temperature_pos", "use_adaptive_entropy", "entropy_coef_min",
               "entropy_coef_max", "entropy_coef_delta", "entropy_target", "multi_objective_aggregation",
               "num_generations_eval"),
              "this GRPO variant is not built in (policy losses: algo.policy_loss; entropy: algo.entropy_coef)",
              "remove it", accepted=(None, False, 1.0, "sum_then_normalize"), families=_ONLINE),
    *_refused(("min_p", "repetition_penalty", "chat_template_kwargs"),
              "rollouts sample from the policy's own distribution (generation.temperature / top_p / top_k)",
              "remove it", accepted=(None, 1.0, 0.0), families=_ONLINE),
    *_refused(("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"),
              "the reference model stays the initial policy (TR-DPO's reference sync is not built in)",
              "remove it", accepted=(None, False)),
    *_refused(("shuffle_dataset",), "rlhfkit always shuffles the training data (seeded by train.seed)",
              "remove it", accepted=(True,), families=("online",)),
    *_refused(("shuffle_dataset",), "rlhfkit shuffles the training data every epoch (seeded by train.seed), as "
              "TRL's sampler does whatever shuffle_dataset says (it only shuffles the dataset once more before)",
              "remove it", accepted=(True, False), families=("supervised", "reward", "preference")),
    *_refused(("disable_dropout",), "online RL here always disables dropout (old and new log-probs must agree)",
              "remove it", accepted=(True,), families=_ONLINE),
    *_refused(("disable_dropout",), "supervised and preference training keep the model's own dropout (most chat "
              "models have none)", "remove it", accepted=(False,), families=("supervised", "reward", "preference")),
    *_refused(("trust_remote_code",), "rlhfkit loads only architectures transformers ships (no code from a model "
              "repository)", "remove it, or convert the model to a transformers architecture", accepted=(False,)),
    *_refused(("model_revision",), "rlhfkit reads models from a directory or the local cache",
              "download the revision: `huggingface-cli download NAME --revision R --local-dir DIR`; model.name=DIR",
              accepted=(None, "main")),
    *_refused(("attn_implementation",), "rlhfkit loads with transformers' default attention (SDPA)",
              "remove it", accepted=(None, "sdpa")),
    *_refused(("load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"),
              "QLoRA here is fixed: 4-bit NF4 with double quantisation and bf16 compute (model.lora.qlora)",
              "remove it", accepted=(None, False, "nf4")),
    *_refused(("use_rslora", "use_dora", "lora_modules_to_save", "lora_target_parameters", "lora_task_type"),
              "rlhfkit's LoRA is plain LoRA on the causal LM (model.lora.r / alpha / dropout / target_modules)",
              "remove it", accepted=(None, False, "CAUSAL_LM")),
    *_refused(("router_aux_loss_coef", "cast_lm_head_to_fp32", "activation_offloading", "padding_free",
               "pad_to_multiple_of", "use_liger_kernel", "liger_kernel_config", "torch_compile",
               "torch_compile_backend", "torch_compile_mode", "neftune_noise_alpha", "torch_empty_cache_steps",
               "tf32", "bf16_full_eval", "fp16_full_eval", "half_precision_backend", "activation_checkpointing",
               "activation_checkpointing_kwargs", "use_cache", "label_smoothing_factor",
               "average_tokens_across_devices", "optim_args", "optim_target_modules", "lr_scheduler_kwargs"),
              "not a setting of rlhfkit's loop (its memory savers: model.gradient_checkpointing, "
              "generation.batch_size, memory.offload_*, model.lora)", "remove it (`rlhfkit plan` shows what fits)",
              accepted=(None, False, 0, 0.0, "auto", {})),
    *_refused(("truncation_mode",), "rlhfkit cuts an over-long prompt from the left, then the completion from the "
              "right", "remove it; data.overflow=truncate|drop|error chooses what happens", accepted=(None,)),
    *_refused(("packing_strategy", "eval_packing"), "rlhfkit packs examples in order (data.packing)", "remove it"),
    *_refused(("eos_token", "pad_token"), "EOS and pad come from the tokenizer and its chat template "
              "(`rlhfkit plan` shows them)", "remove it, or give a chat template: model.chat_template",
              accepted=(None,)),
    TrlName("dataloader_drop_last", key="train.drop_last", families=("supervised", "reward", "preference"),
            doc="`train.drop_last` (TRL's default false trains on an epoch's short last batch)"),
    *_refused(("dataset_kwargs", "dataset_num_proc", "dataloader_num_workers", "dataloader_drop_last",
               "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
               "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns",
               "length_column_name", "label_names", "train_sampling_strategy", "group_by_length", "data_seed",
               "precompute_ref_batch_size"),
              "rlhfkit tokenises the data once, before training, and batches it itself (extra columns reach reward "
              "functions by name; train.seed sets the order)", "remove it",
              accepted=(None, False, True, 0, "length", "random")),
    *_refused(("loss_weights", "ld_alpha", "f_divergence_type", "f_alpha_divergence_coef", "use_weighting",
               "discopop_tau", "rpo_alpha"),
              "this DPO variant is not built in (losses: rlhfkit dpo | ipo | kto | simpo | orpo, algo.label_smoothing)",
              "remove it", accepted=(None, False, "reverse_kl"), families=_PREF),
    *_refused(("eval_delay", "eval_on_start", "prediction_loss_only", "eval_accumulation_steps",
               "eval_do_concat_batches", "eval_use_gather_object", "batch_eval_metrics", "include_for_metrics",
               "load_best_model_at_end", "metric_for_best_model", "greater_is_better"),
              "rlhfkit evaluates every train.eval_every updates and at the end, and keeps the final model",
              "remove it", accepted=(None, False, 0, True, [])),
    *_refused(("save_only_model", "save_on_each_node", "save_safetensors", "enable_jit_checkpoint",
               "ignore_data_skip", "restore_callback_states_from_checkpoint"),
              "a checkpoint keeps model, optimizer, scheduler, RNG and data position, saved once (safetensors), so a "
              "resumed run continues exactly", "remove it", accepted=(None, False, True)),
    *_refused(("logging_dir", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter", "log_level",
               "log_level_replica", "include_num_input_tokens_seen", "include_tokens_per_second", "run_name",
               "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "skip_memory_metrics",
               "num_completions_to_print", "log_unique_prompts", "log_multimodal"),
              "metrics go to OUTPUT_DIR/metrics.jsonl (+ OUTPUT_DIR/tb for TensorBoard; W&B: $WANDB_PROJECT, the "
              "run named after output_dir)", "remove it",
              accepted=(None, False, True, "passive", "warning", "no", "huggingface")),
    *_refused(("ddp_backend", "ddp_timeout", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
               "ddp_broadcast_buffers", "ddp_static_graph", "fsdp_config", "fsdp_min_num_params",
               "fsdp_transformer_layer_cls_to_wrap", "accelerator_config", "parallelism_config", "local_rank",
               "full_determinism", "debug", "do_train", "do_eval", "do_predict"),
              "accelerate sets up the processes (launch with `accelerate launch`); the strategy is "
              "distributed.strategy", "remove it", accepted=(None, False, True, -1, 1800, "")),
]


def entries_for(name: str) -> list[TrlName]:
    """Every entry of ``name`` (one per family where the meaning differs)."""
    return _BY_NAME.get(name, [])


_BY_NAME: dict[str, list[TrlName]] = {}
for _entry in TRL_NAMES:
    _BY_NAME.setdefault(_entry.name, []).append(_entry)


# ───────────────────────────────────────────────── README ─────────────────────────────────────────────────────


def markdown_tables() -> str:
    """The README's tables of TRL names (rendered from :data:`TRL_NAMES`; tools/sync_configs.py writes them and
    tests/unit/test_readme.py checks they agree): names with an rlhfkit key or translation, then the names refused
    with their reason."""
    rows = ["| TRL name | rlhfkit | recipes |", "|---|---|---|"]
    for e in TRL_NAMES:
        if e.refused:
            continue
        what = f"`{e.key}`" + (f": {e.doc}" if e.doc else "") if e.key else e.doc
        rows.append(f"| `{e.name}` | {what} | {', '.join(e.families) or 'all'} |")
    refused: dict[tuple[str, str], list[str]] = {}
    for e in TRL_NAMES:
        if e.refused:
            refused.setdefault((e.doc, e.fix), []).append(e.name)
    rows += ["", "Refused, each in one line with why and what to do (values that ask for what rlhfkit does anyway, "
             "such as `push_to_hub=false`, are accepted and set nothing):", "",
             "| TRL names | why | instead |", "|---|---|---|"]
    for (why, fix), names in refused.items():
        rows.append(f"| {', '.join(f'`{n}`' for n in dict.fromkeys(names))} | {why} | {fix} |")
    return "\n".join(rows)
