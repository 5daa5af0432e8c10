"""Per-device memory of a run, by arithmetic from the architecture alone (no weights loaded).

:func:`read_architecture` reads sizes from a model directory's ``config.json``, a hub name's cached ``config.json``,
a ``tiny:`` spec or a GGUF file's header; :func:`estimate` turns them and a :class:`Setup` (strategy, world size,
dtypes, LoRA / QLoRA, offload, batch and lengths) into the bytes each phase of a step holds on one device.

The counts, per token and decoder layer of a Llama-style block (RMSNorm, attention through SDPA / flash, SwiGLU
MLP), of the tensors autograd keeps for backward (``9H + 2*KV + 4I`` elements, H hidden, KV = kv_heads x head_dim,
I intermediate):

- each RMSNorm keeps its input, the normalised input and its output (3H; two norms per layer: 6H);
- attention keeps the rotated q (H), rotated k and v (2 KV), the SDPA output (H) and its contiguous transpose,
  the input of ``o_proj`` (H): 3H + 2KV (SDPA's log-sum-exp is heads x 1, ignored; eager attention adds the
  heads x T scores, which we do not model);
- the MLP keeps gate and up (2I), silu(gate) (I) and the product fed to ``down_proj`` (I): 4I.

With gradient checkpointing only each layer's input (H) is kept, plus one layer's full set while it is recomputed.
Under CUDA autocast the linear layers' outputs are bf16 and the norms' tensors stay in the weights' dtype; each
linear also keeps its own bf16 cast of its input (q/k/v: 3H, gate/up: 2H) and the cast weights are cached for the
step (2 bytes per parameter). Logits: the LM head output ``[B, T, V]`` is kept for backward and its gradient of the
same size exists during backward, plus one float32 softmax block (rlhfkit's chunked log-probs: at most 2**26
elements; never a float32 copy of the whole logits). With checkpointing, backward frees the logits before it
recomputes a layer, so the larger of the two counts.

Model states per device (P parameters, T trained: P less what is frozen, a VLM's tower or the embeddings; ``shard`` =
world size where the strategy shards, else 1): weights P x bytes / shard(fsdp2, zero3); gradients T x 4 / shard(fsdp2,
zero2, zero3); AdamW states T x 8 / shard(same). fp32 master weights for trained models (``model.dtype=auto``), bf16 for
frozen ones and a LoRA base, about 0.52 B a parameter for a 4-bit QLoRA base (NF4 + double-quantised scales; embeddings
stay bf16). Offload removes what it offloads; AdamW's foreach step needs a temporary copy of the trained gradients.

Validated on CPU against process RSS peaks (tests/unit/test_memory.py, table ``MEASURED``); the CUDA-only terms
(autocast copies, QLoRA, offload) follow the same arithmetic and are not measured here.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..config.checks import refuse_pickle
from ..errors import ModelError
from .tower import Tower, read_tower, tower_bytes

GiB = 1024**3
MiB = 1024**2
SOFTMAX_BLOCK_ELEMENTS = 2**26  # rlhfkit.algos.logprobs: float32 elements of one log-softmax block (from logits)
HEAD_CHUNK_ELEMENTS = 2**25  # rlhfkit.algos.logprobs.LINEAR_CHUNK_ELEMENTS: one chunk of the fused LM head
UNGATED_TYPES = frozenset({"gpt_neox", "gpt2", "gptj", "opt"})  # MLPs of two matrices, not gate / up / down
QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_vl", "qwen2_5_vl"})  # q / k / v projections with biases (Qwen2)
# models that change their logits after the LM head (soft-capping, scaling): rlhfkit computes their log-probs from
# the whole logits (train/shared/forward.py notices it at the first call); every other model goes through the fused head
PLAIN_HEAD_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma4", "vaultgemma", "cohere",
                              "cohere2", "granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "minicpm3",
                              "nanochat"})


# ───────────────────────────────────────────────── architecture ───────────────────────────────────────────────


@dataclass(frozen=True)
class Architecture:
    """The sizes of a decoder-only transformer that decide its memory."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool
    context: int
    head_dim: int = 0  # 0: hidden // heads
    model_type: str = "llama"
    source: str = ""
    tower: Tower | None = None  # a vision-language model's vision tower and projector (models/tower.py)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    @property
    def gated(self) -> bool:
        """A gated MLP (SwiGLU: gate, up, down) as Llama / Qwen / Mistral; GPT-NeoX (Pythia) has two matrices."""
        return self.model_type not in UNGATED_TYPES

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer."""
        H, q, I_ = self.hidden, self.heads * self.hd, self.intermediate
        if not self.gated:  # GPT-NeoX: fused q / k / v, a GELU MLP
            return {"query_key_value": (H, q + 2 * self.kv_dim), "dense": (q, H), "dense_h_to_4h": (H, I_),
                    "dense_4h_to_h": (I_, H)}
        return {"q_proj": (H, q), "k_proj": (H, self.kv_dim), "v_proj": (H, self.kv_dim), "o_proj": (q, H),
                "gate_proj": (H, I_), "up_proj": (H, I_), "down_proj": (I_, H)}

    def layer_params(self) -> int:
        weights = sum(i * o for i, o in self.linears().values())
        if not self.gated:  # every linear has a bias; two LayerNorms of weight and bias
            return weights + sum(o for _, o in self.linears().values()) + 4 * self.hidden
        bias = self.heads * self.hd + 2 * self.kv_dim if self.model_type in QKV_BIAS_TYPES else 0
        return weights + bias + 2 * self.hidden  # + two RMSNorm weights

    def embedding_params(self, lm_head: bool = True) -> int:  # a scalar head's model: its token embeddings only
        return self.vocab * self.hidden * (2 if lm_head and not self.tied else 1)

    def params(self) -> int:  # + the final norm (a LayerNorm's weight and bias for GPT-NeoX), + a VLM's tower
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden * (1 if self.gated else 2) \
            + (self.tower.params if self.tower else 0)

    def lora_params(self, r: int, targets: list[str] | None = None) -> int:
        """Trainable LoRA parameters: r x (in + out) per adapted linear (default: all seven of a layer)."""
        lin = self.linears()
        names = [t for t in (targets or list(lin)) if t in lin]
        return self.layers * sum(r * (lin[n][0] + lin[n][1]) for n in names)


def _arch_from_hf(cfg: dict, source: str) -> Architecture:
    if not isinstance(cfg, dict):
        raise ModelError(f"config.json holds a {type(cfg).__name__}, not an object", where=source,
                         fix="give a model's config.json")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg

    def size(key: str, default: int | None = None) -> int:
        if text.get(key) is None and default is not None:
            return default
        if key not in text:
            raise ModelError(f"config.json lacks the size {key!r}", where=source,
                             fix="give a decoder-only model's config.json (hidden_size, num_hidden_layers, ...)")
        v = text[key]
        # isfinite before int(): JSON's Infinity / NaN parse as floats and int(inf) raises OverflowError; an int is
        # whole already (math.isfinite of a 400-digit int would itself overflow; _checked bounds its size)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (
                isinstance(v, float) and (not math.isfinite(v) or not v.is_integer())):
            raise ModelError(f"{key} is {v!r:.40}, not a whole number", where=f"{source}: {key}",
                             fix="fix the file (or give the model's real config.json)")
        return int(v)

    hidden, heads = size("hidden_size"), size("num_attention_heads")
    return _checked(Architecture(
        vocab=size("vocab_size"), hidden=hidden, layers=size("num_hidden_layers"), heads=heads,
        kv_heads=size("num_key_value_heads", heads), intermediate=size("intermediate_size", 4 * hidden),
        tied=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        context=size("max_position_embeddings", 2048), head_dim=size("head_dim", 0),
        model_type=str(cfg.get("model_type", "")), source=source), "config.json")


MAX_SIZE = 2**40  # above any real model's size; keeps every byte count a finite float (no OverflowError)


def _checked(a: Architecture, what: str) -> Architecture:
    """Sizes a model can have: positive (head_dim may be 0: hidden // heads) and at most :data:`MAX_SIZE`, heads
    divisible by kv_heads, hidden by heads when head_dim is not given; anything else is one line naming the field
    (a plan of it would "fit", or the byte arithmetic would overflow a float)."""
    fields = {"vocab": a.vocab, "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads,
              "intermediate": a.intermediate, "context": a.context}
    problem = next((f"{k} = {v} (must be at least 1)" for k, v in fields.items() if v < 1), None)
    if problem is None:
        sizes = {**fields, "head_dim": a.head_dim}
        problem = next((f"{k} is about 10**{len(str(v)) - 1} (more than 2**40)" for k, v in sizes.items()
                        if v > MAX_SIZE), None)
    if problem is None and a.head_dim < 0:
        problem = f"head_dim = {a.head_dim} (must be 0 or more)"
    if problem is None and a.heads % a.kv_heads:
        problem = f"{a.heads} attention heads do not split into {a.kv_heads} key / value heads"
    if problem is None and not a.head_dim and a.hidden % a.heads:
        problem = f"hidden size {a.hidden} does not split into {a.heads} heads"
    if problem is not None:
        raise ModelError(f"{what} has an impossible size: {problem}", where=a.source,
                         fix="give the model's real config (sizes of a trained model)")
    return a


# GGUF metadata value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: str | Path) -> dict:
    """The key / value header of a GGUF file, plus ``"__tensors__"``: the tensor names (their data is not read).
    Arrays longer than 16 items are returned as their length. Own code rather than the ``gguf`` package: that is
    an optional extra, and the header is a dozen lines of ``struct`` reading."""
    p = Path(path)
    size_of_file = p.stat().st_size

    def damaged(what: str) -> ModelError:
        return ModelError(f"damaged GGUF header ({what})", where=str(p), fix="check the file (download it again)")

    with p.open("rb") as fh:
        def count(n: int, what: str) -> int:  # a length or count can never exceed what the file holds
            if n > size_of_file:
                raise damaged(f"{what} of {n} in a file of {size_of_file} bytes")
            return n

        def read(fmt: str):
            size = struct.calcsize(fmt)
            data = fh.read(size)
            if len(data) != size:
                raise ModelError("truncated GGUF header", where=str(p), fix="check the file")
            return struct.unpack(fmt, data)[0]

        def read_str() -> str:
            return fh.read(count(read("<Q"), "a string length")).decode("utf-8", errors="replace")

        def value(kind: int):
            if kind in _GGUF_SCALARS:
                return read(_GGUF_SCALARS[kind])
            if kind == 8:
                return read_str()
            if kind == 9:
                sub, n = read("<I"), count(read("<Q"), "an array length")
                items = [value(sub) for _ in range(n)]
                return items if n <= 16 else n
            raise ModelError(f"unknown GGUF value type {kind}", where=str(p), fix="check the file")

        if fh.read(4) != b"GGUF":
            raise ModelError("not a GGUF file (bad magic)", where=str(p), fix="give a .gguf file")
        version = read("<I")
        if version < 2:
            raise ModelError(f"GGUF version {version} is too old", where=str(p), fix="convert with a recent llama.cpp")
        n_tensors, n_kv = count(read("<Q"), "a tensor count"), count(read("<Q"), "a key count")
        meta = {read_str(): value(read("<I")) for _ in range(n_kv)}
        names = []
        for _ in range(n_tensors):
            names.append(read_str())
            n_dims = count(read("<I"), "a dimension count")
            fh.read(8 * n_dims + 4 + 8)  # dims, type, offset
        meta["__tensors__"] = names
        return meta


def _arch_from_gguf(path: Path) -> Architecture:
    meta = read_gguf_metadata(path)
    arch = meta.get("general.architecture", "llama")
    if not isinstance(arch, str):
        raise ModelError(f"GGUF header: general.architecture is {arch!r}", where=str(path), fix="check the file")

    def get(key, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ModelError(f"GGUF header lacks {arch}.{key}", where=str(path), fix="give a decoder-only model")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelError(f"GGUF header: {arch}.{key} is {v!r:.40}, not an integer", where=str(path),
                             fix="check the file")
        return v

    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = tokens if isinstance(tokens, int) else len(tokens or []) or get("vocab_size")
    heads = get("attention.head_count")
    hidden = get("embedding_length")
    return _checked(Architecture(
        vocab=vocab, hidden=hidden, layers=get("block_count"), heads=heads,
        kv_heads=get("attention.head_count_kv", heads), intermediate=get("feed_forward_length"),
        tied="output.weight" not in meta["__tensors__"], context=get("context_length", 2048),
        head_dim=get("attention.key_length", 0), model_type=arch, source=str(path)), "GGUF header")


def read_architecture(name: str, gguf_file: str | None = None) -> Architecture:
    """Sizes of ``model.name`` without loading weights: ``tiny:`` spec, model directory / ``config.json`` path,
    a ``.gguf`` file (its header), or a hub name whose ``config.json`` is in the local cache."""
    from .tiny import CHARS, SPECIAL_TOKENS, parse_tiny_spec

    if name == "tiny" or name.startswith("tiny:"):
        s = parse_tiny_spec(name)
        from .tiny_vlm import extra_tokens  # a tiny VLM's image tokens follow the characters

        return _checked(Architecture(
            vocab=len(SPECIAL_TOKENS) + len(CHARS) + len(extra_tokens(s["arch"])), hidden=s["hidden"],
            layers=s["layers"], heads=s["heads"], tower=read_tower(name), kv_heads=s["kv_heads"],
            intermediate=s["intermediate"], tied=True, context=s["context"],
            model_type={"gemma3": "gemma3_text"}.get(s["arch"], s["arch"]), source=name), "the tiny model spec")
    path = Path(name).expanduser()
    if gguf_file:
        path = path / gguf_file
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}", where="model.name", fix="check the path")
        return _arch_from_gguf(path)
    refuse_pickle(str(path))  # a pickled weights file: refused with why, as everywhere else
    cfg_path = path if path.name == "config.json" else path / "config.json"
    if not cfg_path.is_file() and not path.exists() and name.count("/") == 1:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
            if isinstance(cached, str):
                cfg_path = Path(cached)
        except ImportError:  # pragma: no cover - a dependency of transformers
            pass
    if not cfg_path.is_file():
        raise ModelError(f"no config.json for {name!r}", where="model.name",
                         fix="give a model directory (or its config.json), a .gguf file, a cached hub name or tiny:")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(f"invalid JSON ({exc.msg})", where=f"{cfg_path}:{exc.lineno}", fix="fix the file") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise ModelError(f"cannot read config.json ({type(exc).__name__})", where=str(cfg_path),
                         fix="give a model's config.json (UTF-8 JSON)") from None
    arch = _arch_from_hf(cfg, str(cfg_path))
    if isinstance(cfg, dict) and isinstance(cfg.get("vision_config"), dict):  # a VLM: its tower too
        import dataclasses

        arch = dataclasses.replace(arch, tower=read_tower(str(cfg_path.parent)))
    return arch


# ───────────────────────────────────────────────── estimate ───────────────────────────────────────────────────


@dataclass(frozen=True)
class ModelRole:
    """One model of a run: its architecture and how it is held."""

    name: str  # policy | reference | reward | critic
    arch: Architecture
    trainable: str  # full | lora | frozen
    weight_bytes: float  # per parameter (fp32 4, bf16 2, 4-bit ~0.52)
    head: str = "lm"  # lm (vocabulary logits) | scalar (reward / value head)
    sharded: bool = True  # frozen models under fsdp2 / zero3: sharded or replicated
    offloaded: bool = False  # not on the device during training (offloaded between uses, or freed)
    note: str = "kept in CPU memory between uses"  # why it is not on the device, when ``offloaded``


@dataclass(frozen=True)
class Setup:
    """What decides memory besides the architectures."""

    strategy: str = "ddp"  # ddp | fsdp2 | zero2 | zero3
    world: int = 1
    device: str = "cuda"  # cuda | cpu (cpu: no autocast, everything fp32)
    autocast: bool = True  # bf16 autocast of a fp32 model (train.mixed_precision bf16 / auto on CUDA)
    gradient_checkpointing: bool = False
    offload: bool = False
    lora_r: int = 16
    lora_targets: tuple[str, ...] | None = None
    micro_batch: int = 8  # sequences per forward / backward
    seq_len: int = 512  # tokens per sequence (prompt + response)
    # online recipes
    rollout_batch: int = 0  # sequences generated at once (0: not an online run); continuous engine: its slots
    prompt_len: int = 0
    new_tokens: int = 0
    cache_tokens: int = 0  # continuous engine: the paged KV cache's token budget (0: another engine's cache)
    requests: int = 0  # continuous engine: requests of one rollout (prompts x samples)
    offload_optimizer: bool = False  # memory.offload_optimizer: AdamW states in host memory outside the update
    release_engine_cache: bool = True  # memory.release_engine_cache: the engine's KV cache freed after the rollout
    entropy_grad: bool = False  # algo.entropy_coef > 0: the entropy's gradient through the LM head too
    train_vision: bool = False  # model.train_vision: a VLM's tower trained (else frozen: weights only)
    train_embeddings: bool = True  # model.train_embeddings=false: token embeddings and LM head frozen (weights only)
    images: int = 0  # a VLM's images encoded by the rollout's prefill (0: one per prompt of the rollout batch)


@dataclass
class Phase:
    """Bytes one device holds at the peak of one phase, by item, with how each figure is computed."""

    name: str
    items: dict[str, float] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.items.values())

    def add(self, key: str, value: float, how: str = "") -> None:
        self.items[key] = float(value)
        self.how[key] = how

    def extend(self, other: dict[str, tuple[float, str]], prefix: str = "") -> None:
        for k, (v, how) in other.items():
            self.add(prefix + k, v, how)


SHARDS_WEIGHTS = {"ddp": False, "fsdp2": True, "zero2": False, "zero3": True}
SHARDS_STATES = {"ddp": False, "fsdp2": True, "zero2": True, "zero3": True}  # gradients and optimizer states


def _div(setup: Setup, sharded: bool) -> int:
    return setup.world if sharded else 1


def _n(x: float) -> str:
    """1234567 -> 1.23M (parameter and token counts in the formulas)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:g}"


def role_params(role: ModelRole) -> int:
    """Parameters of a role's model: a scalar head (reward model, critic) replaces the LM head by hidden x 1."""
    a = role.arch
    if role.head == "scalar":
        return a.params() - (0 if a.tied else a.vocab * a.hidden) + a.hidden
    return a.params()


def model_states(role: ModelRole, setup: Setup) -> dict[str, tuple[float, str]]:
    """Weights, gradients, optimizer states of one model on one device (resident between phases)."""
    P, out = role_params(role), {}
    shard_w = SHARDS_WEIGHTS[setup.strategy] and (role.trainable != "frozen" or role.sharded)
    d = _div(setup, shard_w)
    offload_params = setup.offload and setup.strategy in ("fsdp2", "zero3") and role.trainable == "full"
    if role.offloaded:
        out[f"{role.name} weights"] = (0.0, role.note)
    elif offload_params:
        out[f"{role.name} weights"] = (0.0, "offloaded to CPU memory")
    else:
        out[f"{role.name} weights"] = (P * role.weight_bytes / d, f"{_n(P)} x {role.weight_bytes:g} B" +
                                       (f" / {d}" if d > 1 else ""))
    if role.trainable == "frozen":
        return out
    frozen = role.arch.tower.params if role.arch.tower is not None and not setup.train_vision else 0  # a VLM's tower
    frozen += 0 if setup.train_embeddings else role.arch.embedding_params(lm_head=role.head != "scalar")
    T = P - frozen if role.trainable == "full" else role.arch.lora_params(setup.lora_r,
                                                                          list(setup.lora_targets or []) or None)
    ds = _div(setup, SHARDS_STATES[setup.strategy])
    shard = f" / {ds}" if ds > 1 else ""
    offload_states = setup.offload and setup.strategy != "ddp"
    if role.trainable == "lora":
        out[f"{role.name} LoRA adapters"] = (T * 4, f"{_n(T)} x 4 B (r={setup.lora_r})")
    # gradients and AdamW's two moments take the trained parameters' dtype (fp32 adapters; a full model's own)
    gb = 4 if role.trainable == "lora" else role.weight_bytes
    if offload_states and setup.strategy == "fsdp2":
        out[f"{role.name} gradients"] = (0.0, "offloaded to CPU memory")
    else:
        out[f"{role.name} gradients"] = (T * gb / ds, f"{_n(T)} x {gb:g} B{shard}")
    if offload_states:
        out[f"{role.name} optimizer (AdamW)"] = (0.0, "offloaded to CPU memory")
    else:
        out[f"{role.name} optimizer (AdamW)"] = (T * 2 * gb / ds, f"{_n(T)} x 2 states x {gb:g} B{shard}")
    return out


def host_bytes(roles: list[ModelRole], setup: Setup) -> dict[str, tuple[float, str]]:
    """What the run keeps in host memory instead of on the device, per model (the same on every process): the
    weights of a frozen model offloaded between uses, the state CPU offload keeps there (``distributed.cpu_offload``),
    the optimizer's state while the engine generates (``memory.offload_optimizer``)."""
    out = {}
    plain = Setup(**{**setup.__dict__, "offload": False})
    for role in roles:
        on = model_states(role, setup)
        off = model_states(ModelRole(**{**role.__dict__, "offloaded": False}), plain)
        moved = sum(v for v, _ in off.values()) - sum(v for v, _ in on.values())
        if role.trainable != "frozen" and setup.offload_optimizer and setup.rollout_batch:
            moved += on.get(f"{role.name} optimizer (AdamW)", (0.0, ""))[0]
        if moved > 0:
            out[role.name] = (moved, ", ".join(k.removeprefix(f"{role.name} ") for k, (v, _) in off.items()
                                               if v and (on[k][0] == 0 or "optimizer" in k and
                                                         setup.offload_optimizer and setup.rollout_batch)))
    return out


def _dtypes(setup: Setup) -> tuple[int, int]:
    """(c, r): bytes of linear outputs (bf16 on CUDA) and of the residual stream / norms (the weights' dtype:
    fp32 on CPU and under autocast of fp32 weights, bf16 for a bf16 model)."""
    if setup.device == "cpu":
        return 4, 4
    return 2, (4 if setup.autocast else 2)


def activation_bytes(arch: Architecture, setup: Setup, tokens: int, *, grad: bool, head: str = "lm",
                     head_trained: bool = True) -> dict[str, tuple[float, str]]:
    """Bytes of the activations of a forward of ``tokens`` tokens (``grad``: kept for backward) and its logits."""
    H, KV, I_, L = arch.hidden, arch.kv_dim, arch.intermediate, arch.layers
    c, r = _dtypes(setup)
    casts = (5 if arch.gated else 2) * H if (setup.device == "cuda" and setup.autocast) else 0
    mlp = 4 if arch.gated else 2  # gate, up, silu(gate), product | up, gelu(up)
    per_layer = r * 6 * H + c * (3 * H + 2 * KV + mlp * I_ + casts)
    formula = (f"{r}x6H + {c}x(3H + 2KV + {mlp}I{f' + {casts // H}H' if casts else ''}) = {_n(per_layer)} B per "
               "token per layer")
    out = {}
    logits = head_bytes(arch, setup, tokens, grad=grad, trained=head_trained) if head == "lm" else {}
    if grad and setup.gradient_checkpointing:
        # backward is done with the LM head (its chunk freed) before it recomputes any layer: the larger of the two
        layer = tokens * per_layer
        head_total = sum(v for v, _ in logits.values())
        out["activations (checkpointed)"] = (tokens * L * r * H + max(0.0, layer - head_total),
                                             f"{_n(tokens)} tokens x {L} layers x {r}H, + one recomputed layer "
                                             f"({formula}) beyond the logits")
    elif grad:
        out["activations"] = (tokens * L * per_layer, f"{_n(tokens)} tokens x {L} layers x ({formula})")
    else:
        out["activations (no grad, two layers live)"] = (tokens * 2 * per_layer,
                                                          f"{_n(tokens)} tokens x 2 x ({formula})")
    out.update(logits)
    return out


def head_bytes(arch: Architecture, setup: Setup, tokens: int, *, grad: bool,
               trained: bool = True) -> dict[str, tuple[float, str]]:
    """The LM head's part of a forward (``grad``: and its backward) over ``tokens`` tokens.

    rlhfkit's fused head (train/shared/forward.py, ``algos.linear_token_stats``): no logits tensor; one chunk of at most
    2^25 / V tokens at a time, whose logits (compute dtype, c B) and float32 log-softmax (4 B) live together; in
    backward the float32 softmax becomes the gradient in place, its compute-dtype copy (c B) sits beside it (+4 B for
    the entropy's gradient), and a trained float32 head weight under autocast (``trained``) is cast to the compute
    dtype for the backward and gets each chunk's gradient as a [V, H] product in it before it is added (forward
    reuses autocast's cached cast, counted with the other weights'). A model that changes its logits after the head
    (:data:`PLAIN_HEAD_TYPES`) materialises them: [tokens, V] in the compute dtype (and their gradient) + one float32
    softmax block."""
    c, _ = _dtypes(setup)
    V = arch.vocab
    if arch.model_type in PLAIN_HEAD_TYPES:
        k = 2 if grad else 1
        block = min(tokens * V, SOFTMAX_BLOCK_ELEMENTS)
        return {"logits" + (" + gradient" if grad else ""): (tokens * V * c * k, f"{_n(tokens)} tokens x {_n(V)} vocab "
                                                                                f"x {c} B" + (" x 2" if grad else "")),
                "one float32 softmax block": (block * 4, f"min({_n(tokens)} x {_n(V)}, 2^26) x 4 B")}
    chunk = min(tokens, max(1, HEAD_CHUNK_ELEMENTS // V))
    per = 4 + c + (4 if grad and setup.entropy_grad else 0)
    out = {"LM head chunk (fused log-probs, no logits)": (chunk * V * per, f"{_n(chunk)} tokens (min(tokens, 2^25 / V))"
                                                                            f" x {_n(V)} vocab x {per} B")}
    if grad and trained and setup.device == "cuda" and setup.autocast and c != 4:
        out["LM head weight cast + gradient product"] = (2 * V * arch.hidden * c, f"2 x {_n(V)} x {_n(arch.hidden)} "
                                                                                  f"x {c} B (backward)")
    return out


def kv_cache_bytes(arch: Architecture, setup: Setup, sequences: int, length: int) -> float:
    """Keys and values of every layer for ``sequences`` x ``length`` tokens, in the compute dtype."""
    c, _ = _dtypes(setup)
    return 2 * arch.layers * sequences * length * arch.kv_dim * c


def rollout_cache(arch: Architecture, setup: Setup) -> dict[str, tuple[float, str]]:
    """The rollout's KV cache and per-step sampling buffers. The static / hf engines: rows x (prompt + new) tokens,
    the whole batch's longest possible answers. The continuous engine (``setup.cache_tokens``): a paged pool of that
    many tokens whatever the batch, its slots' logits with the inverse-CDF sampling's float64 cumulative sums, and
    one float64 number per request and response token (each request's own generator, drawn up front)."""
    n, length, c = setup.rollout_batch, setup.prompt_len + setup.new_tokens, _dtypes(setup)[0]
    L, kv, V = arch.layers, arch.kv_dim, arch.vocab
    if not setup.cache_tokens:
        return {"KV cache": (kv_cache_bytes(arch, setup, n, length),
                             f"2 x {L} layers x {n} seqs x {length} tokens x {kv} x {c} B"),
                "logits of one decode step": (n * V * 4, f"{n} seqs x {_n(V)} x 4 B")}
    t = setup.cache_tokens
    return {"KV cache (paged, token budget)": (kv_cache_bytes(arch, setup, 1, t),
                                               f"2 x {L} layers x {_n(t)} tokens x {kv} x {c} B"),
            "logits and sampling of one decode step": (n * V * 16, f"{n} slots x {_n(V)} x (4 + 4 + 8) B"),
            "sampling numbers": (setup.requests * (setup.new_tokens + 1) * 8,
                                 f"{setup.requests} requests x {setup.new_tokens + 1} x 8 B")}


def cache_summary(arch: Architecture, setup: Setup) -> str:
    """One line for ``rlhfkit plan``: the continuous engine's cache in tokens and GiB and the slots it allows."""
    length = setup.prompt_len + setup.new_tokens
    t, n = setup.cache_tokens, setup.rollout_batch
    full = t // max(1, length)
    return (f"rollout cache: continuous engine, {t:,} tokens = {fmt_bytes(kv_cache_bytes(arch, setup, 1, t))} "
            f"(paged); {n} slots decode together; {full} sequences of {setup.prompt_len} + {setup.new_tokens} tokens "
            f"fit at full length at once (more while answers are shorter; past that the last admitted waits)")


def kept_engine_cache(arch: Architecture, setup: Setup) -> tuple[float, str]:
    """The engine's KV cache held between rollouts (``memory.release_engine_cache=false``): the continuous engine's
    paged pool of ``cache_tokens``; the static engine's largest bucket, the rollout batch rounded up to a power of
    two, of the sequence length rounded up to 64 columns."""
    if setup.cache_tokens:
        return kv_cache_bytes(arch, setup, 1, setup.cache_tokens), (
            f"paged pool of {_n(setup.cache_tokens)} tokens, held after the rollout "
            "(memory.release_engine_cache=false)")
    b = 1 << max(0, setup.rollout_batch - 1).bit_length()
    S = -(-(setup.prompt_len + setup.new_tokens) // 64) * 64
    return kv_cache_bytes(arch, setup, b, S), (f"bucket {b} seqs x {S} columns, held after the rollout "
                                               "(memory.release_engine_cache=false)")


def estimate(roles: list[ModelRole], setup: Setup, family: str) -> list[Phase]:
    """Per-device peak of each phase of a step. ``roles[0]`` is the trained policy (or reward model).

    supervised / reward: one ``train step``; preference: ``train step`` on chosen + rejected (2 x micro-batch);
    online: ``rollout`` (generation on full weights gathered once, KV cache), ``scoring and forward passes``,
    ``train step``.
    """
    resident = Phase("resident")
    for role in roles:
        resident.extend(model_states(role, setup))
    policy = roles[0]
    trainables = [r for r in roles if r.trainable != "frozen"]
    c, _ = _dtypes(setup)
    # sharded weights come to the device for a phase: over several devices, or from host memory (CPU offload)
    gathers = SHARDS_WEIGHTS[setup.strategy] and (setup.world > 1 or setup.offload)

    def base(name: str, keep_grads: bool, update: bool = True) -> Phase:
        ph = Phase(name)
        for k, v in resident.items.items():
            if not keep_grads and "gradients" in k:
                continue
            if not update and setup.offload_optimizer and "optimizer (AdamW)" in k and v:
                ph.add(k, 0.0, "in host memory outside the update (memory.offload_optimizer)")
                continue
            ph.add(k, v, resident.how[k])
        return ph

    def train_step(seqs: int) -> Phase:
        ph = base("train step", True)
        tokens = seqs * setup.seq_len
        # trained models step one after the other (PPO: the policy's backward, then the critic's): the largest
        # activations count, the others are noted
        acts = {role.name: activation_bytes(role.arch, setup, tokens, grad=True, head=role.head,
                                            head_trained=role.trainable == "full" and role.weight_bytes == 4)
                for role in trainables}
        largest = max(acts, key=lambda name: sum(v for v, _ in acts[name].values()))
        if policy.arch.tower is not None:  # a VLM: its images encoded (once per image set)
            ph.extend(tower_bytes(policy.arch.tower, seqs, trained=setup.train_vision, c=c,
                                  text_hidden=policy.arch.hidden, seq_len=setup.seq_len))
        for role in trainables:
            if role.name == largest:
                ph.extend(acts[role.name], f"{role.name} ")
            else:
                ph.add(f"{role.name} activations (another time)", 0.0,
                       f"{fmt_bytes(sum(v for v, _ in acts[role.name].values()))} while the {largest}'s are freed")
            if setup.device == "cuda" and setup.autocast and role.trainable == "full" and not gathers and \
                    role.weight_bytes == 4:  # autocast's cached bf16 casts of fp32 weights (none for bf16 ones)
                P = role_params(role)
                ph.add(f"{role.name} bf16 autocast copies of weights", P * 2, f"{_n(P)} x 2 B")
            if gathers:
                lp = role.arch.layer_params()
                wb = 2 if setup.device == "cuda" else role.weight_bytes
                ph.add(f"{role.name} gathered layers", 2 * lp * wb, f"2 layers x {_n(lp)} x {wb:g} B (current + next)")
                rp = role_params(role) - role.arch.layers * lp
                ph.add(f"{role.name} gathered root", rp * wb,
                       f"{_n(rp)} (embeddings, final norm, head) x {wb:g} B, forward to backward")
        # AdamW's foreach step needs temporaries about the size of the (sharded) gradients; the peak of the step
        # is the larger of backward (activations, logits) and the optimizer step (temporaries)
        act = sum(v for k, v in ph.items.items() if "activations" in k or "logits" in k or "autocast" in k)
        temps = sum(v for k, v in ph.items.items() if "gradients" in k)
        if temps > act:
            ph.add("optimizer step temporaries", temps - act, "AdamW temporaries (grad-sized) exceed activations")
        return ph

    phases = []
    if family == "online":
        length = setup.prompt_len + setup.new_tokens
        ph = base("rollout (generation)", False, update=False)
        if gathers:
            P = role_params(policy)
            wb = 2 if setup.device == "cuda" else policy.weight_bytes
            ph.add("policy weights gathered for generation", P * wb, f"{_n(P)} x {wb:g} B, gathered once per rollout")
        ph.extend(rollout_cache(policy.arch, setup))
        if policy.arch.tower is not None:  # the prefill's images, each prompt's once
            ph.extend(tower_bytes(policy.arch.tower, setup.images or setup.rollout_batch, trained=False, c=c,
                                  text_hidden=policy.arch.hidden, seq_len=setup.seq_len))
        phases.append(ph)
        ph = base("scoring and forward passes", False, update=False)
        big = max(roles, key=role_params)
        ph.extend(activation_bytes(big.arch, setup, setup.micro_batch * length, grad=False, head=big.head),
                  f"{big.name} ")
        if setup.device == "cuda" and setup.autocast and policy.trainable == "full" and not gathers and \
                policy.weight_bytes == 4:  # autocast caches a bf16 cast of each fp32 weight it meets in the pass
            P = role_params(policy)
            ph.add("policy bf16 autocast copies of weights", P * 2, f"{_n(P)} x 2 B (old log-probs' pass)")
        phases.append(ph)
        phases.append(train_step(setup.micro_batch))
        if not setup.release_engine_cache:  # the static engine keeps its buckets' caches between rollouts
            kept = kept_engine_cache(policy.arch, setup)
            for ph in phases[1:]:
                ph.add("rollout engine's KV cache (kept)", *kept)
    elif family == "preference":
        phases.append(train_step(2 * setup.micro_batch))
    else:
        phases.append(train_step(setup.micro_batch))
    return phases


def weight_bytes_of(dtype: str, *, trainable: str, device: str, qlora: bool = False) -> float:
    """Bytes per parameter as rlhfkit loads the model (``model.dtype`` and ``resolve_dtype``'s auto rule)."""
    if qlora and trainable == "lora":
        return 0.52
    named = {"float32": 4, "bfloat16": 2, "float16": 2}
    if dtype in named:
        return named[dtype]
    if device == "cpu":
        return 4
    return 4 if trainable == "full" else 2


def fmt_bytes(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"


def parse_size(text: str) -> float:
    """``80GiB``, ``80GB``, ``24 GiB``, ``512MiB``, ``1.5e9`` -> bytes (GB read as GiB, as GPUs are sold)."""
    t = str(text).strip().lower().replace(" ", "")
    mult = 1
    for suffix, m in (("gib", GiB), ("gb", GiB), ("g", GiB), ("mib", MiB), ("mb", MiB), ("m", MiB)):
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], m
            break
    value = float(t) * mult
    if not math.isfinite(value) or value < MiB:  # 0, negative, nan, inf, or less than a MiB: not a device
        raise ValueError(f"{text!r} is not a device memory size")
    return value
