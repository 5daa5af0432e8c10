"""The schema: the field helper :func:`f` and every section and recipe dataclass (frozen, one help string per field).

A field's bounds (``ge`` / ``gt`` / ``le`` / ``lt``) sit in its metadata beside the help string; the builder in
:mod:`.parse` enforces them. Each recipe config's ``check()`` / ``check_inputs()`` call the rules in :mod:`.checks`.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .checks import (
    _check_common,
    _check_data_format,
    _check_online,
    _check_preference,
    _inputs_common,
    _inputs_online,
    check_output_dir,
    raise_no_model,
)
from .keys import field_of, key_of  # noqa: F401 - re-exported


def f(default, help: str, **kw):  # noqa: A002 - short helper for fields with help text
    """A dataclass field with a help string; mutable defaults are copied per instance."""
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


# ─────────────────────────────────────────────── shared sections ──────────────────────────────────────────────


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = f(False, "train LoRA adapters instead of all weights")
    r: int = f(16, "LoRA rank", ge=1)
    alpha: int = f(32, "LoRA scaling numerator (scale = alpha / r)", ge=1)
    dropout: float = f(0.05, "dropout on the LoRA branch", ge=0, lt=1)
    target_modules: list[str] | None = f(None, "module names to adapt; null = chosen per architecture")
    qlora: bool = f(False, "load the base model in 4-bit (needs CUDA and bitsandbytes)")


@dataclass(frozen=True)
class ModelConfig:
    name: str | None = f(None, "the model (required): HF directory, cached hub name, .gguf file, or "
                               "tiny[:hidden=..,layers=..,arch=llama|qwen3|gemma3|qwen2_5_vl|gemma3_vl|llava] (the "
                               "built-in toy models, only when named)")
    gguf_file: str | None = f(None, "GGUF file name inside `name` (a directory) when loading a GGUF model")
    dtype: str = f("auto", "auto (CUDA: fp32 weights + bf16 autocast when trained, bf16 when frozen or LoRA base; "
                           "CPU: fp32) | float32 | bfloat16 | float16")
    gradient_checkpointing: bool = f(False, "recompute activations in backward to save memory")
    chat_template: str | None = f(None, "override the tokenizer's chat template (a Jinja string or a file path)")
    lora: LoraConfig = f(LoraConfig(), "LoRA / QLoRA settings")
    train_vision: bool = f(False, "vision-language models: train the vision tower and its projector too (false: "
                                  "frozen, LoRA on the language model only, each image's features computed once)")
    train_embeddings: bool = f(True, "train the token embeddings and the LM head (false: both frozen, tied or not; "
                                     "every other weight trained; no effect under LoRA, which leaves them frozen)")


@dataclass(frozen=True)
class DataConfig:
    train: str | None = f(None, "training data: .jsonl/.json/.parquet/.csv file, a directory, or a datasets name")
    eval: str | None = f(None, "evaluation data (same forms); null = split eval_fraction off the training data")
    split: str | None = f(None, "split / slice of the training source, e.g. train[:500]")
    eval_split: str | None = f(None, "split / slice of the evaluation source")
    eval_fraction: float = f(0.05, "fraction of training records held out for evaluation when eval is null",
                             ge=0, lt=1)
    format: str = f("auto", "auto | sft | preference | prompt | unpaired")
    fields: dict[str, str] = f({}, "column mapping, field -> your column, e.g. {prompt: question, answer: solution}")
    max_length: int = f(512, "maximum tokens of prompt + completion", ge=2)
    max_prompt_length: int | None = f(None, "maximum prompt tokens; null = max_length (prompts), max_length/2 (pairs)",
                                      ge=1)
    overflow: str = f("truncate", "over-long prompts: truncate (keep the end) | drop | error; always counted")
    plain_text: str = f("template", "prompts / completions given as plain strings (TRL's standard format): template "
                                    "(each a user / assistant turn of the chat template) | raw (the text as it is, "
                                    "EOS after a completion, as TRL feeds it); messages always go through the "
                                    "template")
    completion_only_loss: bool | None = f(True, "SFT: train on assistant / completion tokens only; null = TRL's rule "
                                                "(the completion of prompt / completion rows, every token of a "
                                                "conversation or a text)")
    packing: bool = f(False, "SFT: pack several examples into each row of max_length")
    limit: int | None = f(None, "use at most this many training records", ge=1)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = f(1e-5, "peak learning rate", ge=0)
    weight_decay: float = f(0.0, "AdamW weight decay", ge=0)
    betas: list[float] = f([0.9, 0.999], "AdamW betas", ge=0, lt=1)
    eps: float = f(1e-8, "AdamW epsilon", gt=0)
    schedule: str = f("linear", "linear | cosine | constant (after warm-up)")
    warmup_ratio: float = f(0.0, "warm-up as a fraction of all optimizer updates", ge=0, le=1)
    warmup_steps: int = f(0, "warm-up in optimizer updates (wins over warmup_ratio when > 0)", ge=0)
    warmup_from_zero: bool = f(False, "the warm-up's first update at LR 0, as transformers / TRL run it (a ratio "
                                      "rounded up); false: each update one step ahead, the first at 1/warmup of "
                                      "the peak, none wasted")
    max_grad_norm: float | None = f(1.0, "gradient clipping norm; null = no clipping", gt=0)


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = f(1.0, "passes over the training data (fractions allowed)", gt=0)
    max_steps: int = f(-1, "optimizer updates to run; -1 = derived from epochs; 0 = none (an evaluation of the model "
                           "as it is)", ge=-1)
    batch_size: int = f(8, "micro-batch size per device", ge=1)
    grad_accum: int = f(1, "micro-batches accumulated per optimizer update", ge=1)
    eval_batch_size: int | None = f(None, "evaluation micro-batch size; null = batch_size", ge=1)
    seed: int = f(42, "random seed (data order, initialisation, sampling)", ge=0)
    eval_every: int = f(0, "evaluate every N optimizer updates; 0 = only at the end", ge=0)
    save_every: int = f(0, "checkpoint every N optimizer updates; 0 = only the final model", ge=0)
    save_total_limit: int = f(2, "checkpoints kept (older ones deleted)", ge=1)
    resume: str = f("auto", "auto (latest valid checkpoint of the same run) | never (start over) | force (resume "
                            "even when settings changed; the new settings apply from there) | a checkpoint-N path")
    log_every: int = f(1, "log metrics every N optimizer updates", ge=1)
    drop_last: bool = f(True, "supervised recipes: drop the last batch of an epoch when it is short (true), or train "
                              "on it (false, as TRL / transformers; on several processes its rows are filled from "
                              "the start of the epoch's order)")
    mixed_precision: str = f("auto", "auto (bf16 on CUDA, none on CPU) | no | bf16 | fp16")
    device: str = f("auto", "auto (CUDA when a GPU is visible, else the CPU) | cpu (the CPU even with a GPU: TRL's "
                            "use_cpu=true)")
    max_nonfinite_skips: int = f(5, "stop after this many consecutive updates skipped for a non-finite loss or "
                                    "gradient", ge=1)


@dataclass(frozen=True)
class TrackConfig:
    backends: list[str] = f(["jsonl"], "trackers: jsonl (always) + tensorboard | wandb | mlflow | comet_ml | aim | "
                                       "clearml | dvclive | swanlab | trackio (the last via accelerate)")
    sample_every: int = f(10, "print and save a table of samples every N steps (online recipes)", ge=0)
    progress: bool = f(True, "show a progress bar with ETA (off: no bar; metrics still go to metrics.jsonl)")
    report: bool = f(True, "write report.html at the end of the run")
    stop_on_critical: bool = f(False, "stop the run when a critical health warning fires (KL blow-up, collapse)")


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = f(64, "maximum response tokens (a response usually ends earlier, at EOS)", ge=1)
    min_new_tokens: int = f(0, "minimum response tokens; 0 = never force length", ge=0)
    temperature: float = f(1.0, "sampling temperature (0 = greedy); keep 1.0 for on-policy RL", ge=0)
    top_p: float = f(1.0, "nucleus sampling; 1.0 = off", gt=0, le=1)
    top_k: int = f(0, "top-k sampling; 0 = off", ge=0)
    stop_strings: list[str] = f([], "extra strings that end a response (EOS always does)")
    engine: str = f("auto", "rollout engine (see `rollout.ENGINES`): auto (the fastest expected for the device and "
                            "model: continuous for answers of 512 tokens or more or more requests than "
                            "generation.batch_size rows, else static (uncompiled on CPU; CUDA graphs on CUDA); hf "
                            "only for a model neither static path runs; rollout/auto.py; one line says which) | hf "
                            "(transformers generate, the reference) | static (our decode loop over a preallocated "
                            "KV cache, compiled: rlhfkit's decoder for Llama, Qwen2/2.5/3, Mistral, Gemma 2/3, "
                            "Phi-3/4, else the model's own modules over the same cache) | continuous (continuous "
                            "batching: requests wait in a queue, slots decode together and take the next request as "
                            "they end, over a paged cache of generation.cache_tokens; rlhfkit's decoder's models, "
                            "else hf)")
    engine_kwargs: dict[str, Any] = f({}, "settings of the engine: hf: cache_implementation (static), compile; "
                                          "static: compile (default true), cuda_graphs (default true), sync_every "
                                          "(tokens between checks for ended rows, 8), cache_multiple (64); "
                                          "continuous: block_size (16), prefill_chunk (512), sync_every (8), "
                                          "memory_fraction (0.3), cuda_graphs (true)")
    batch_size: int | None = f(None, "generation micro-batch (continuous: the slots decoding together); null = whole "
                                     "rollout batch (continuous: every request, at most 256)", ge=1)
    cache_tokens: int | None = f(None, "continuous engine: the KV cache's budget in tokens (paged; `rlhfkit plan` "
                                       "prints it in GiB and the slots it holds at full length); null = what every "
                                       "slot needs at full length, capped on CUDA at engine_kwargs.memory_fraction "
                                       "(0.3) of the free device memory", ge=1)


@dataclass(frozen=True)
class DistributedConfig:
    strategy: str = f("ddp", "ddp (data parallel through accelerate) | fsdp2 (PyTorch fully_shard: parameters, "
                             "gradients and optimizer states sharded per layer; CPU with gloo too) | deepspeed "
                             "(accelerate's DeepSpeed ZeRO; needs CUDA and the deepspeed package; not measured here)")
    deepspeed_config: str = f("zero2", "deepspeed: zero2 | zero3 (the shipped configs/deepspeed/*.json) or a path to "
                                       "a DeepSpeed JSON file (batch sizes and clipping are filled from this config)")
    cpu_offload: bool = f(False, "fsdp2: sharded parameters, gradients and optimizer states live in CPU memory "
                                 "(needs CUDA); deepspeed: optimizer states (zero3: and parameters) offloaded to CPU")
    reshard_after_forward: bool = f(True, "fsdp2: free each layer's gathered parameters after its forward (ZeRO-3 "
                                          "like); false keeps them until backward (ZeRO-2 like: more memory, less "
                                          "communication)")
    timeout_s: float = f(1800.0, "seconds a process waits at a collective (all-reduce, barrier, checkpoint) for the "
                                 "others before it fails with one line naming this key (torch's process-group "
                                 "timeout): a rank that died or hangs never blocks the others for ever", gt=0)


# ─────────────────────────────────────────────── recipe sections ──────────────────────────────────────────────


@dataclass(frozen=True)
class RMConfig:
    margin_field: str | None = f(None, "record field holding a per-pair margin (Llama 2); null = no margin")
    center_coef: float = f(0.0, "reward-centering coefficient: adds coef * mean((r_c + r_r)^2)", ge=0)


@dataclass(frozen=True)
class RewardFunction:
    fn: str = f("", "package.module:function, file.py:function, or a built-in name (exact_match, math_answer, "
                    "code_tests, ...); a class is built once per worker")
    weight: float = f(1.0, "weight of this function in the total reward")
    name: str | None = f(None, "name in the logs (rewards/<name>/mean); default = function name")
    kwargs: dict[str, Any] = f({}, "keyword arguments passed to the function")
    convention: str = f("auto", "how it is called: rlhfkit (fn(prompts, completions, **fields), texts) | trl (TRL's "
                                "keywords: completion_ids, trainer_state, and completions as messages when the data is "
                                "conversational) | auto (trl when it names completions first or takes only **kwargs)")
    lint: bool = f(True, "called on the reward lint's and the probe's synthetic completions before the run; false "
                         "for a reward with side effects (a paid judge API, a counter): checked on the first rollout "
                         "instead. A function naming a `synthetic` parameter gets synthetic=True on those calls")


@dataclass(frozen=True)
class RemoteJudgeConfig:
    url: str | None = f(None, "remote judge: an OpenAI-compatible base URL (kind chat, e.g. http://127.0.0.1:8000/v1) "
                              "or a JSON endpoint (kind json); null = no judge")
    kind: str = f("chat", "chat (one graded chat request per completion) | json ({prompts, completions, fields} -> "
                          "{scores})")
    model: str | None = f(None, "model name sent to a chat endpoint")
    api_key_env: str | None = f(None, "NAME of the environment variable holding the API key (the key itself is never "
                                      "in the config, the logs or the report)")
    template: str | None = f(None, "grading prompt with {prompt}, {completion} and the data's columns; null = the "
                                   "built-in 0-10 grading prompt")
    grade_pattern: str | None = f(None, "regular expression whose first group is the grade in the reply; null = "
                                        "'GRADE: <number>'")
    max_grade: float = f(10.0, "the grade that scores 1 (scores are grade / max_grade)", gt=0)
    max_tokens: int = f(256, "longest reply of a chat judge", ge=1)
    batch_size: int = f(16, "completions per request (kind json)", ge=1)
    concurrency: int = f(4, "requests in flight at once", ge=1)
    retries: int = f(3, "retries of a request that timed out or got 429 / 5xx", ge=0)
    backoff_s: float = f(1.0, "wait before the first retry, doubled each time (the server's Retry-After wins)", ge=0)
    timeout_s: float = f(60.0, "seconds one try of a request may take in all (connecting, sending, the whole reply); a "
                               "request with its retries and waits ends within (retries + 1) x timeout_s", gt=0)
    weight: float = f(1.0, "weight of the judge's score in the total reward")
    name: str = f("judge", "name in the logs (rewards/<name>/mean, /timeouts, /errors, /time_s)")
    lint: bool = f(False, "call the judge on the reward lint's synthetic completions too (each a paid request)")


@dataclass(frozen=True)
class SandboxConfig:
    isolation: str = f("auto", "how model-written code (code_tests) is isolated: auto (namespaces, or a refusal naming "
                               "the cause and its fix: never a weaker level unless named) | namespaces (the boundary: "
                               "bubblewrap's mount / PID / network / user namespaces, a read-only system, a seccomp "
                               "filter, limits) | unshare (PID and network namespaces; your file system) | process "
                               "(filter and limits; your files and processes); docs/sandbox.md")
    require_boundary: bool = f(False, "refuse a weaker level even where isolation names one (one line, exit 2, before "
                                      "any weights load)")


@dataclass(frozen=True)
class RewardConfig:
    model: str | None = f(None, "reward-model directory (from `rlhfkit rm`); null = functions only")
    functions: list[RewardFunction] = f([], "rule / user reward functions combined by weight")
    missing_eos_penalty: float | None = f(1.0, "subtracted from the score of responses that never ended", ge=0)
    missing_eos_scope: str = f("all", "where the missing-EOS penalty applies: all (every response that never ended) | "
                                      "varied (only in groups whose scores before it differ: a group of equal "
                                      "scores, e.g. all wrong, would otherwise learn to end at the full advantage the "
                                      "group std gives a penalty alone; group estimators only)")
    clip: float | None = f(10.0, "clip scores to [-clip, clip] after the penalty; null = off", gt=0)
    normalize: bool = f(True, "normalise scores by running mean / std (keeps critic targets bounded)")
    batch_size: int = f(16, "reward-model scoring micro-batch", ge=1)
    workers: int = f(2, "worker processes running the reward functions, each call under timeout_s (0 = in the "
                        "trainer's process, no time limit)", ge=0)
    timeout_s: float = f(120.0, "wall-clock limit of a reward function's whole call on a batch (its chunks on the "
                                "workers side by side, retries included); the samples of a chunk past it score None "
                                "and are counted (rewards/<name>/timeouts)", gt=0)
    lint: bool = f(True, "before the run, call the rewards on adversarial completions built from the prompts and print "
                         "which score high (an empty answer paid the most first); warnings only, the run goes on. "
                         "reward.functions[].lint=false spares one function these calls")
    remote: RemoteJudgeConfig = f(RemoteJudgeConfig(), "a remote judge (HTTP) as one more reward function")
    sandbox: SandboxConfig = f(SandboxConfig(), "where code_tests runs model-written code (a code_tests kwarg "
                                                "`isolation` overrides the level for that function)")


@dataclass(frozen=True)
class KLConfig:
    coef: float = f(0.05, "KL coefficient (initial value when adaptive)", ge=0)
    estimator: str = f("k1", "per-token KL estimator: k1 (log-ratio) | k2 | k3")
    placement: str = f("auto", "auto (the estimator's default: reward for gae / rloo / reinforce_pp, loss for "
                               "grpo / dr_grpo) | reward (subtract from per-token reward) | loss (add to the loss)")
    adaptive: bool = f(False, "Ziegler et al. (2019) adaptive coefficient towards `target`")
    target: float = f(6.0, "target sequence KL for the adaptive controller", gt=0)
    horizon: int = f(10000, "adaptive controller horizon in episodes", ge=1)
    log_ratio_clip: float | None = f(20.0, "clamp log pi - log ref to [-c, c] before the KL estimator (k3 is inf "
                                           "in float32 beyond 88); null = off", gt=0)


@dataclass(frozen=True)
class IcePopConfig:
    low: float = f(0.5, "IcePop: a token whose ratio pi_old / pi_rollout is below this has its policy-gradient term "
                        "removed (the paper's alpha: 0.5)", ge=0, le=1)
    high: float = f(5.0, "a token whose ratio is above this likewise (the paper's beta: 5)", ge=1)


@dataclass(frozen=True)
class OffPolicyConfig:
    correction: str = f("auto", "rollout / trainer mismatch correction (see `algos.OFF_POLICY_CORRECTIONS`): auto "
                                "(none when algo.async.max_staleness is 0, tis when the samples may be stale) | none | "
                                "tis (weight min(pi_old / pi_rollout, cap)) | mis (drop tokens / rows outside "
                                "[low, high]) | icepop (weight 0 outside its own band, the token kept in the "
                                "normalisation: section icepop)")
    level: str = f("token", "importance ratio per token, or per sequence (product of the row's token ratios)")
    cap: float = f(2.0, "TIS: the largest importance weight", ge=1)
    low: float = f(0.5, "MIS band lower end (also the band of the metric rollout/is_ratio_outside_frac)", ge=0, le=1)
    high: float = f(2.0, "MIS band upper end (also the band of the metric rollout/is_ratio_outside_frac)", ge=1)
    icepop: IcePopConfig = f(IcePopConfig(), "settings of correction=icepop (token level): its band (IcePop, Ring-1T)")


@dataclass(frozen=True)
class AsyncConfig:
    max_staleness: int = f(0, "0 = synchronous: each process generates, scores and updates in turn (the default); "
                              "K > 0: producers generate while learners update, on separate processes under torchrun, "
                              "each batch from weights at most K updates old (needs >= 2 processes)", ge=0)
    producers: int = f(1, "with max_staleness > 0: how many of the processes generate (the last ranks); the others "
                          "learn. producers and learners must divide one another", ge=1)
    reference: str = f("auto", "with max_staleness > 0 and a reference (a KL): who computes its log-probs. producer "
                               "(the producers, after each rollout: the learners' cycle is the update alone) | learner "
                               "| auto (producer on CPU, where the learners are the busier side; learner on CUDA, "
                               "where the rollout is)")


@dataclass(frozen=True)
class OverlongConfig:
    cache_len: int = f(0, "DAPO soft overlong penalty over the last cache_len tokens before "
                          "generation.max_new_tokens (linear to -penalty at the limit); 0 = off", ge=0)
    penalty: float = f(1.0, "size of the overlong penalty at the limit (added to the score before normalisation)",
                       ge=0)
    filter: bool = f(False, "DAPO overlong filtering: responses cut at max_new_tokens leave every loss")


@dataclass(frozen=True)
class DynamicSamplingConfig:
    enabled: bool = f(False, "DAPO dynamic sampling: draw more prompts and keep only groups whose rewards differ "
                             "until rollout_batch_size groups are kept (group estimators)")
    max_draws: int = f(4, "most rollout batches drawn per step; at the cap the batch is filled with tied groups", ge=1)


# ── the settings of each policy loss: one section per `algos.POLICY_LOSSES` entry's `section`, its fields the
#    loss function's own keywords, with the paper's defaults (the loop passes the section; see algos/policy_losses.py)


@dataclass(frozen=True)
class PPOLossConfig:
    clip_low: float = f(0.2, "clip range of the token ratio below 1 (Schulman et al. 2017: 0.2)", gt=0, lt=1)
    clip_high: float | None = f(None, "clip range above 1; null = clip_low (DAPO clip-higher: 0.28)", gt=0)


@dataclass(frozen=True)
class GSPOLossConfig:
    clip_low: float = f(3e-4, "clip range of the sequence ratio below 1 (Zheng et al. 2025: 3e-4)", gt=0, lt=1)
    clip_high: float | None = f(4e-4, "clip range above 1 (Zheng et al. 2025: 4e-4); null = clip_low", gt=0)


@dataclass(frozen=True)
class CISPOLossConfig:
    clip_low: float | None = f(None, "the token IS weight is clipped below at 1 - clip_low; null = no lower bound "
                                     "(MiniMax-M1 sets none)", gt=0)
    clip_high: float | None = f(4.0, "the weight is clipped above at 1 + clip_high (MiniMax-M1 tunes only this bound "
                                     "and gives no value; 4.0, a cap of 5 on the weight, is our choice, not the "
                                     "paper's); null = no upper bound", gt=0)


@dataclass(frozen=True)
class SAPOLossConfig:
    tau_pos: float = f(1.0, "temperature of the soft gate for tokens with a positive advantage (Gao et al. 2025: 1.0); "
                            "larger = the gate closes sooner as the ratio leaves 1", gt=0)
    tau_neg: float = f(1.05, "temperature for tokens with a zero or negative advantage (Gao et al. 2025: 1.05, above "
                             "tau_pos: their updates spread over the vocabulary, so they are damped sooner)", gt=0)


@dataclass(frozen=True)
class GMPOLossConfig:
    clip_low: float = f(0.4, "each token's log-ratio is clipped below at -clip_low, in log space (Zhao et al. 2025: "
                             "0.4, a ratio of e^-0.4)", gt=0)
    clip_high: float | None = f(0.4, "clipped above at clip_high (Zhao et al. 2025: 0.4, a ratio of e^0.4); "
                                     "null = clip_low", gt=0)


@dataclass(frozen=True)
class DPPOLossConfig:
    divergence: str = f("binary_tv", "the divergence between the token distributions that bounds the update: "
                                     "binary_tv (|pi - pi_old| of the sampled token) | binary_kl (the Bernoulli KL "
                                     "of {sampled token, the rest}) (DPPO, arXiv 2602.04879)")
    delta_low: float = f(0.2, "a token with a negative advantage whose probability fell is masked once the divergence "
                              "passes this (prime-rl's default 0.2; binary_kl wants about 0.05)", gt=0)
    delta_high: float = f(0.2, "a token with a positive advantage whose probability rose is masked once the divergence "
                               "passes this (prime-rl's default 0.2)", gt=0)
    ratio_cap: float | None = f(20.0, "cap C of the detached IS weight min(r, C) (verl's default 20; the paper advises "
                                      "a large one, truncation biases rare tokens); null = no cap", gt=0)
    kl_coef: float = f(0.0, "weight of the squared log-ratio (log pi - log pi_old)^2 added per token (prime-rl's "
                            "default loss: 1e-3; the paper: 0)", ge=0)


@dataclass(frozen=True)
class VESPOLossConfig:
    k_pos: float = f(2.0, "power k of the Gamma kernel W^k exp(lambda (1 - W)) on the sequence IS ratio W, for a "
                          "sequence advantage >= 0 (TRL / VESPO: 2.0)", ge=0)
    lambda_pos: float = f(3.0, "decay lambda of the kernel for an advantage >= 0 (TRL / VESPO: 3.0); the kernel "
                               "peaks at W = k / lambda", gt=0)
    k_neg: float = f(3.0, "power k for a negative sequence advantage (TRL / VESPO: 3.0)", ge=0)
    lambda_neg: float = f(2.0, "decay lambda for a negative advantage (TRL / VESPO: 2.0)", gt=0)


@dataclass(frozen=True)
class LUSPOLossConfig:
    clip_low: float = f(2e-3, "clip range of the sequence ratio below 1 (LUSPO, section 5.1: 2e-3)", gt=0, lt=1)
    clip_high: float | None = f(2.5e-3, "clip range above 1 (LUSPO: 2.5e-3); null = clip_low", gt=0)


@dataclass(frozen=True)
class OnlinePreferenceConfig:
    loss: str = f("dpo", "the loss on each fresh pair (a paired entry of `algos.PREFERENCE_LOSSES`): dpo | ipo | cdpo "
                         "| simpo | orpo")
    beta: float = f(0.1, "inverse temperature beta of the pair loss (TRL OnlineDPOConfig.beta: 0.1; SimPO: its reward "
                         "scale)", gt=0)
    label_smoothing: float = f(0.0, "conservative DPO: the assumed fraction of flipped preferences", ge=0, lt=0.5)
    simpo_gamma: float = f(0.5, "SimPO target reward margin gamma", ge=0)
    orpo_lambda: float = f(0.1, "ORPO weight of the odds-ratio term", ge=0)


@dataclass(frozen=True)
class WReinforceConfig:
    positive_weight: float = f(0.1, "lambda: a positive sample's advantage is lambda x (score - center) (Zhu et al. "
                                    "2025: 0.1; 0 = wrong answers only, their NSR)", ge=0)
    center: float = f(0.5, "the score that splits positive from negative samples: 0.5 for a 0 / 1 verifier (the "
                           "paper's +1 / -1 rewards: 0)")
    negative_weight: float = f(1.0, "a negative sample's advantage is negative_weight x (score - center) (Zhu et "
                                    "al. 2025: 1; 0 = right answers only, their PSR)", ge=0)


@dataclass(frozen=True)
class OnlineAlgoConfig:
    advantage: str = f("gae", "gae (PPO) | grpo | dr_grpo | rloo | reinforce_pp | w_reinforce (no baseline, positive "
                              "samples down-weighted: algo.w_reinforce) | distill (needs teacher.model)")
    num_generations: int = f(1, "completions per prompt (k); group estimators need k >= 2", ge=1)
    rollout_batch_size: int = f(16, "prompts per rollout step (times num_generations responses)", ge=1)
    ppo_epochs: int = f(2, "passes over each rollout batch", ge=1)
    mini_batch_size: int = f(16, "responses per optimizer update (split in micro-batches of train.batch_size)",
                             ge=1)
    value_clip: float | None = f(0.2, "value clipping range; null = off", gt=0)
    vf_coef: float = f(0.5, "value-loss weight (critic has its own optimizer; scales its loss)", ge=0)
    entropy_coef: float = f(0.0, "entropy bonus coefficient")
    top_entropy_quantile: float = f(1.0, "the policy loss only on this top fraction of each micro-batch's tokens "
                                         "by entropy (Wang et al. 2025, Beyond the 80/20 rule; TRL's "
                                         "top_entropy_quantile; the paper: 0.2); 1 = every token", ge=0, le=1)
    gamma: float = f(1.0, "discount (GAE, REINFORCE++, distill)", ge=0, le=1)
    lam: float = f(0.95, "GAE lambda", ge=0, le=1)
    whiten_advantages: bool = f(True, "normalise advantages over the batch")
    loss_aggregation: str = f("token_mean", "token_mean | seq_mean_token_mean | seq_mean_token_sum_norm")
    objective: str = f("policy", "what a step learns from: policy (the policy loss on advantages: PPO, GRPO, RLOO, "
                                 "...) | preference (online DPO: each prompt's best and worst completion by score "
                                 "form a pair, the loss of algo.preference on it; no advantages, no policy loss)")
    preference: OnlinePreferenceConfig = f(OnlinePreferenceConfig(), "settings of objective=preference (online DPO): "
                                           "the pair loss and its hyper-parameters")
    policy_loss: str = f("ppo", "policy loss (see `algos.POLICY_LOSSES`): ppo | gspo | gspo_token | cispo | sapo | "
                                "gmpo | dppo | vespo | luspo; it reads its settings from its own section below (each "
                                "section's comment names the losses that read it)")
    ppo: PPOLossConfig = f(PPOLossConfig(), "settings of policy_loss=ppo: the token ratio, clipped (PPO)")
    gspo: GSPOLossConfig = f(GSPOLossConfig(), "settings of policy_loss=gspo / gspo_token: the length-normalised "
                             "sequence ratio, clipped per sequence (GSPO)")
    cispo: CISPOLossConfig = f(CISPOLossConfig(), "settings of policy_loss=cispo: the token IS weight, clipped and "
                               "detached, times log pi, so no token's gradient is dropped (CISPO)")
    sapo: SAPOLossConfig = f(SAPOLossConfig(), "settings of policy_loss=sapo: a smooth temperature-controlled gate on "
                             "the token ratio in place of the hard clip (SAPO)")
    gmpo: GMPOLossConfig = f(GMPOLossConfig(), "settings of policy_loss=gmpo: the geometric mean of the token ratios "
                             "per sequence, each clipped in log space (GMPO)")
    dppo: DPPOLossConfig = f(DPPOLossConfig(), "settings of policy_loss=dppo: a trust region on a divergence between "
                             "the token distributions in place of the ratio clip; the detached IS weight times log pi "
                             "(DPPO)")
    vespo: VESPOLossConfig = f(VESPOLossConfig(), "settings of policy_loss=vespo: the sequence IS ratio reshaped by a "
                               "smooth Gamma kernel, detached, times log pi (VESPO)")
    luspo: LUSPOLossConfig = f(LUSPOLossConfig(), "settings of policy_loss=luspo: GSPO's clipped sequence loss "
                               "scaled by the sequence's length (LUSPO)")
    w_reinforce: WReinforceConfig = f(WReinforceConfig(), "settings of advantage=w_reinforce: REINFORCE without a "
                                      "baseline, each sample's score less a fixed center, the positive ones weighted "
                                      "lambda (W-REINFORCE, Zhu et al. 2025)")
    filter_tied_groups: bool = f(False, "drop groups whose rewards all tie (no learning signal)")
    kl: KLConfig = f(KLConfig(), "KL control to the reference model")
    overlong: OverlongConfig = f(OverlongConfig(), "DAPO overlong reward shaping and filtering")
    dynamic_sampling: DynamicSamplingConfig = f(DynamicSamplingConfig(), "DAPO dynamic sampling")
    async_: AsyncConfig = f(AsyncConfig(), "rollouts and updates at once on separate processes (key: algo.async)")
    off_policy: OffPolicyConfig = f(OffPolicyConfig(), "correction for the gap between the rollout engine's sampling "
                                    "log-probs and the trainer's (metrics rollout/* are always logged)")
    total_episodes: int | None = f(1024, "samples (responses) to generate over the whole run, every process together; "
                                         "null = train.epochs passes over the prompts (train.max_steps > 0, in "
                                         "optimizer updates, wins over both)", ge=1)

    @property
    def correction(self) -> str:
        """The off-policy correction that runs: ``off_policy.correction``, with ``auto`` resolved (``tis`` when the
        samples may be stale, ``algo.async.max_staleness`` > 0; else ``none``)."""
        name = self.off_policy.correction
        return name if name != "auto" else ("tis" if self.async_.max_staleness > 0 else "none")


@dataclass(frozen=True)
class EnvConfig:
    name: str | None = f(None, "multi-turn environment: null = single-turn (reward model / functions) | calculator "
                               "(built-in) | openenv (an OpenEnv environment, named in env.kwargs) | "
                               "package.module:Class | path/to/file.py:Class")
    kwargs: dict[str, Any] = f({}, "keyword arguments of the environment class")
    max_turns: int = f(4, "most assistant turns per episode", ge=1)
    max_total_tokens: int = f(256, "most tokens per episode after the first prompt (model + environment)", ge=1)
    workers: int = f(2, "worker processes running the environments' reset / step / metrics, each call under "
                        "timeout_s (0 = in the trainer's process, no time limit)", ge=0)
    timeout_s: float = f(60.0, "wall-clock limit of one reset / step / metrics call; an episode whose call passes it "
                               "is dropped from the step and counted (env/timeouts, env/dropped)", gt=0)


@dataclass(frozen=True)
class CriticConfig:
    init: str = f("reward", "reward (from the reward model, DeepSpeed-Chat) | policy (from the policy)")
    model: str | None = f(None, "explicit critic initialisation directory (overrides init)")
    lr: float = f(1e-5, "critic learning rate", ge=0)


@dataclass(frozen=True)
class MemoryConfig:
    offload_reference: bool = f(False, "keep the reference model on CPU between uses")
    offload_reward: bool = f(False, "keep the reward model on CPU between uses")
    offload_teacher: bool = f(False, "keep the distillation teacher on CPU between uses")
    offload_optimizer: bool = f(False, "the trained models' optimizer states (AdamW: 8 bytes per trained parameter "
                                       "+ the step) in host memory while the engine generates, back on the device "
                                       "for the update: one copy out and one back per step, the same updates "
                                       "(ddp; fsdp2 / deepspeed offload with distributed.cpu_offload)")
    release_engine_cache: bool = f(True, "free the rollout engine's caches (KV cache of each batch bucket, CUDA "
                                         "graphs) after each rollout, for the forwards and the update; the next "
                                         "rollout allocates them again (and re-captures its CUDA graphs)")
    forward_tokens: int = f(8192, "token budget of one no-grad forward of the online step (old policy, reference, "
                            "teacher, critic values): rows sorted by length, batched so rows x (longest prompt + "
                            "longest response) stays within it (a longer row goes alone)", ge=1)

@dataclass(frozen=True)
class TeacherConfig:
    model: str | None = f(None, "frozen teacher for on-policy distillation: HF directory, run directory or .gguf file; "
                                "a tokenizer other than the student's is aligned to it by character spans "
                                "(cross-tokenizer); null = no teacher")
    coef: float = f(1.0, "weight of the teacher's per-token reward (teacher - student log-prob of the sampled token) "
                         "against the task rewards", ge=0)
    log_ratio_clip: float | None = f(20.0, "clamp of the per-token teacher - student log-ratio (a token the teacher "
                                           "gives ~0 probability); null = none", gt=0)


@dataclass(frozen=True)
class PreferenceAlgoConfig:
    loss: str = f("dpo", "dpo | ipo | cdpo | simpo | orpo | kto")
    beta: float = f(0.1, "inverse temperature beta (SimPO: reward scale)", gt=0)
    label_smoothing: float = f(0.0, "conservative DPO: assumed fraction of flipped labels", ge=0, lt=0.5)
    simpo_gamma: float = f(0.5, "SimPO target reward margin gamma", ge=0)
    orpo_lambda: float = f(0.1, "ORPO weight of the odds-ratio term", ge=0)
    kto_desirable_weight: float = f(1.0, "KTO weight of desirable examples", gt=0)
    kto_undesirable_weight: float = f(1.0, "KTO weight of undesirable examples", gt=0)
    reference: str = f("precompute", "precompute (once, cached in the run) | on_the_fly")

# ─────────────────────────────────────────────────── recipes ──────────────────────────────────────────────────


@dataclass(frozen=True)
class SFTConfig:
    recipe: str = f("sft", "recipe name")
    defaults: str = f("rlhfkit", "rlhfkit | trl: TRL 1.16's defaults (docs/coming-from-trl.md) under the config file; "
                                 "chosen by itself when the run is configured through TRL's interface (a TRL config "
                                 "object, TRL names in the file or args, a TRL-named trainer without args)")
    output_dir: str = f("runs/sft", "run directory (checkpoints, metrics, final model)")
    model: ModelConfig = f(ModelConfig(), "policy model")
    data: DataConfig = f(DataConfig(), "data")
    optim: OptimConfig = f(OptimConfig(lr=2e-5), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")

    def check(self) -> None:
        _check_common(self)
        _check_data_format(self, "sft")

    def check_inputs(self) -> None:
        _inputs_common(self)


@dataclass(frozen=True)
class RewardModelConfig:
    recipe: str = f("rm", "recipe name")
    defaults: str = f("rlhfkit", "rlhfkit | trl: TRL 1.16's defaults (docs/coming-from-trl.md) under the config file; "
                                 "chosen by itself when the run is configured through TRL's interface (a TRL config "
                                 "object, TRL names in the file or args, a TRL-named trainer without args)")
    output_dir: str = f("runs/rm", "run directory")
    model: ModelConfig = f(ModelConfig(), "model the reward model is initialised from (a causal LM)")
    data: DataConfig = f(DataConfig(format="preference"), "preference pairs")
    optim: OptimConfig = f(OptimConfig(lr=1e-5), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")
    rm: RMConfig = f(RMConfig(), "reward-model loss")

    def check(self) -> None:
        _check_common(self)
        _check_data_format(self, "preference")

    def check_inputs(self) -> None:
        _inputs_common(self)


@dataclass(frozen=True)
class OnlineConfig:
    recipe: str = f("ppo", "ppo | grpo | rloo | reinforce | distill | online-dpo")
    defaults: str = f("rlhfkit", "rlhfkit | trl: TRL 1.16's defaults (docs/coming-from-trl.md) under the config file; "
                                 "chosen by itself when the run is configured through TRL's interface (a TRL config "
                                 "object, TRL names in the file or args, a TRL-named trainer without args)")
    output_dir: str = f("runs/ppo", "run directory")
    model: ModelConfig = f(ModelConfig(), "policy (actor)")
    ref_model: str | None = f(None, "reference model; null = the initial policy (LoRA: adapter disabled)")
    data: DataConfig = f(DataConfig(format="prompt"), "prompts (extra fields go to reward functions)")
    optim: OptimConfig = f(OptimConfig(lr=1e-6, schedule="constant"), "actor optimizer")
    train: TrainConfig = f(TrainConfig(), "loop (batch_size = micro-batch of forward/backward; max_steps = optimizer "
                                          "updates, rounded up to whole rollout steps; epochs = passes over the "
                                          "prompts when algo.total_episodes is null)")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")
    generation: GenerationConfig = f(GenerationConfig(), "rollout sampling")
    reward: RewardConfig = f(RewardConfig(), "reward model and / or functions")
    algo: OnlineAlgoConfig = f(OnlineAlgoConfig(), "PPO / GRPO / RLOO / REINFORCE++")
    critic: CriticConfig = f(CriticConfig(), "value model (PPO only)")
    memory: MemoryConfig = f(MemoryConfig(), "memory savers")
    env: EnvConfig = f(EnvConfig(), "multi-turn environment (tool calls); its rewards add to the reward's")
    teacher: TeacherConfig = f(TeacherConfig(), "on-policy distillation: a frozen teacher whose per-token log-ratio "
                               "to the student adds to the token rewards (algo.advantage=distill, or a term in GRPO)")

    def check(self) -> None:
        _check_online(self)

    def check_inputs(self) -> None:
        _inputs_online(self)


@dataclass(frozen=True)
class PreferenceConfig:
    recipe: str = f("dpo", "dpo | ipo | kto | simpo | orpo")
    defaults: str = f("rlhfkit", "rlhfkit | trl: TRL 1.16's defaults (docs/coming-from-trl.md) under the config file; "
                                 "chosen by itself when the run is configured through TRL's interface (a TRL config "
                                 "object, TRL names in the file or args, a TRL-named trainer without args)")
    output_dir: str = f("runs/dpo", "run directory")
    model: ModelConfig = f(ModelConfig(), "policy")
    ref_model: str | None = f(None, "reference model; null = the initial policy (LoRA: adapter disabled)")
    data: DataConfig = f(DataConfig(format="preference"), "preference pairs (KTO: unpaired or pairs)")
    optim: OptimConfig = f(OptimConfig(lr=5e-7), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")
    algo: PreferenceAlgoConfig = f(PreferenceAlgoConfig(), "preference loss")

    def check(self) -> None:
        _check_preference(self)

    def check_inputs(self) -> None:
        _inputs_common(self)


@dataclass(frozen=True)
class PipelineConfig:
    recipe: str = f("pipeline", "recipe name")
    output_dir: str = f("runs/pipeline", "pipeline directory; each stage writes a subdirectory")
    task: str | None = f(None, "built-in task whose data is generated first (quickstart); null = your data")
    task_size: int = f(2000, "records per generated file", ge=1)
    eval_prompts: int = f(200, "held-out prompts for the gold metric (built-in task)", ge=1)
    base_model: str | None = f(None, "model the first stage starts from (required; tiny[:...] only when named)")
    stages: list[dict[str, Any]] = f([], "ordered stages: {name, recipe, overrides of that recipe's config}")

    def check(self) -> None:
        check_output_dir(self.output_dir)

    def check_inputs(self) -> None:
        first = self.stages[0].get("config") if self.stages and isinstance(self.stages[0], dict) else None
        named = isinstance(first, dict) and isinstance(first.get("model"), dict) and first["model"].get("name")
        if self.base_model is None and not named:
            raise_no_model("base_model")
        if not self.stages:
            raise ConfigError("the pipeline has no stages", where="stages",
                              fix="list stages, see configs/pipeline.yaml")
