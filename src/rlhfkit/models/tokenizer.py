"""Tokenizer loading and the two fixes every stage needs: a pad token and a chat template.

* **Pad token.** A tokenizer without one gets ``unk`` as pad when it has an unk token, else its EOS token. No new
  token is added, so embeddings never need resizing. rlhfkit never finds padding by comparing ids with the pad id
  (it always carries attention / response masks), so pad == EOS is safe here.
* **Chat template.** A tokenizer without one gets :data:`DEFAULT_CHAT_TEMPLATE` (ChatML:
  ``<|im_start|>role\\ncontent<|im_end|>\\n``), and every model directory rlhfkit writes saves the tokenizer with
  it, so SFT, RM, PPO and DPO all format prompts identically. The template's end-of-turn marker must be a token the
  tokenizer knows (for the built-in tiny tokenizer it is; for others we check and fail with a clear message).
"""

from __future__ import annotations

from pathlib import Path

from ..data.chat import stop_token_ids
from ..errors import ModelError, say
from .tiny import ASSET_DIR

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# files that hold a tokenizer's vocabulary (one of them must be there); the JSON files a tokenizer is read from
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
               "sentencepiece.bpe.model", "tokenizer.tiktoken")
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json")
COPY_FIX = "copy the tokenizer files (tokenizer.json, tokenizer_config.json) of the model it came from into {dir}"


def check_tokenizer_files(directory: Path, where: str = "model.name") -> None:
    """One line (``ModelError``) for a local model directory whose tokenizer cannot be read, before transformers
    tries: a JSON file among :data:`JSON_FILES` that is not valid JSON (file, line and column), or no vocabulary
    file at all (naming what ``tokenizer_config.json`` points at that is not there)."""
    import json

    fix = COPY_FIX.format(dir=directory)
    config: dict = {}
    for name in JSON_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_bytes())
        except (ValueError, OSError) as exc:
            raise ModelError(f"{path} is damaged: not valid JSON ({exc})", where=where, fix=fix) from None
        if name == "tokenizer.json" and not (isinstance(data, dict) and isinstance(data.get("model"), dict)):
            raise ModelError(f"{path} is damaged: not a tokenizers file (no 'model' section)", where=where, fix=fix)
        if name == "tokenizer_config.json" and isinstance(data, dict):
            config = data
    if any((directory / name).is_file() for name in VOCAB_FILES):
        return
    named = [f"{k}={v}" for k in ("tokenizer_file", "vocab_file", "merges_file")
             if isinstance(v := config.get(k), str) and not (directory / v).is_file() and not Path(v).is_file()]
    pointed = (f"; its tokenizer_config.json names {', '.join(named)}, which {'is' if len(named) == 1 else 'are'} not "
               "there") if named else ""
    raise ModelError(f"{directory} holds no tokenizer (none of {', '.join(VOCAB_FILES[:4])}){pointed}", where=where,
                     fix=fix)


def load_tokenizer(name_or_path: str, *, gguf_file: str | None = None, where: str = "model.name"):
    """Load a tokenizer (``tiny`` specs use the shipped one) and apply :func:`prepare_tokenizer`. A local directory's
    files are checked first (:func:`check_tokenizer_files`); any error transformers / tokenizers raise is one line
    with the whole of its message (``where``: the key that named the model)."""
    from transformers import AutoTokenizer

    if name_or_path.startswith("tiny"):
        source = str(ASSET_DIR)
    else:
        source = name_or_path
    if not gguf_file and Path(source).expanduser().is_dir():
        check_tokenizer_files(Path(source).expanduser(), where)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception as exc:  # OSError, ValueError, KeyError of a torn tokenizer.json, tokenizers' own Exception
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelError(
            f"cannot load a tokenizer from {source!r}: {type(exc).__name__}: {text}", where=where,
            fix="give a local Hugging Face model directory (with its tokenizer files), a cached hub name, a .gguf "
                "file or 'tiny'",
        ) from None
    name = None if name_or_path.startswith("tiny") else gguf_file or name_or_path
    check_encodes(tok, name or name_or_path, where)
    return prepare_tokenizer(tok, name=name, where=where)


def check_encodes(tok, name: str, where: str = "model.name") -> None:
    """One line (``ModelError``) for a tokenizer that loads but cannot turn text into ids: an empty vocabulary (only
    special tokens), a model section that lost its vocabulary or its unknown token. Found here, when it loads, not as
    a ``tokenizers`` exception in the middle of a run (a teacher's re-tokenisation of the student's text)."""
    text = "The answer is 42."
    try:
        ids = tok(text, add_special_tokens=False)["input_ids"]
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own bare Exception
        problem = " ".join(str(exc).split()) or type(exc).__name__
    else:
        if ids:
            return
        problem = "it encodes text as no ids at all"
    special = set(getattr(tok, "all_special_tokens", []))
    plain = [t for t in tok.get_vocab() if t not in special]
    raise ModelError(f"the tokenizer of {name} cannot encode text ({problem}): its vocabulary holds {len(tok)} tokens, "
                     f"{len(plain)} of them not special", where=where,
                     fix="give the model's own tokenizer files (a tokenizer.json whose model section holds its "
                         "vocabulary)")


_FALLBACK_SAID: set[str] = set()  # models whose missing chat template this process has named


def prepare_tokenizer(tok, name: str | None = None, where: str = "model.name"):
    """Give ``tok`` a pad token and a chat template when it lacks them (see module docstring). Returns ``tok``.
    ``name``: the model the tokenizer is of; when it gets rlhfkit's ChatML template, one line says so (once per
    model and process), since a chat model's own template may differ (system prompt, tool format, spacing).
    ``where``: the key that named the model (``teacher.model`` for a teacher), named by the errors."""
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token if tok.unk_token is not None else tok.eos_token
        if tok.pad_token is None:
            raise ModelError(
                f"the tokenizer{_of(name)} has no pad, unk or EOS token",
                where=where,
                fix="use a tokenizer with an EOS token (a chat model's), or set one before training",
            )
    if not getattr(tok, "chat_template", None):
        if "<|im_end|>" not in tok.get_vocab():
            raise ModelError(
                f"the tokenizer{_of(name)} has no chat template and no '<|im_end|>' token for rlhfkit's default ChatML "
                "template", where=where,
                fix="use a tokenizer that has a chat template (an instruct model's), or set model.chat_template",
            )
        tok.chat_template = DEFAULT_CHAT_TEMPLATE
        if name is not None and name not in _FALLBACK_SAID:
            _FALLBACK_SAID.add(name)
            say(f"[model] {name} has no chat template: rlhfkit's ChatML template is used (<|im_start|>role ... "
                "<|im_end|>); a chat model trained with another template answers worse with it: set "
                "model.chat_template to its own (a Jinja file or text)")
    if tok.eos_token is None:
        raise ModelError(f"the tokenizer{_of(name)} has no EOS token: nothing would end its replies", where=where,
                         fix="give a tokenizer whose tokenizer_config.json names its eos_token (a chat model's)")
    return tok


def _of(name: str | None) -> str:
    return f" of {name}" if name else ""


# What ends a reply is defined once, in data/chat.py; the name is kept for the loaders.
eos_token_ids = stop_token_ids


def _tokenizer_from_files(name: str, where: str = "model.name"):
    """The tokenizer of ``name`` (a model / run directory, a ``.gguf`` file, ``tiny``) read from its files alone: a
    GGUF file's tokenizer comes from its metadata (no dequantisation), a directory's from its tokenizer files; and
    the stop ids its chat model ends a reply with (``generation_config.json`` when there is one). No weights load."""
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        tok = load_tokenizer(str(path.parent), gguf_file=path.name, where=where)
        return tok, stop_token_ids(tok)
    tok = load_tokenizer(name, where=where)
    gen = None
    if (path / "generation_config.json").is_file():
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(str(path))
    return tok, stop_token_ids(tok, gen)


def same_ids(tok_a, stop_a: list[int], tok_b, stop_b: list[int]) -> bool:
    """Two loaded tokenizers (with the ids that end a reply) give the same ids: :func:`tokenizer_difference`'s test."""
    return _identity(tok_a, stop_a) == _identity(tok_b, stop_b)


def _identity(tok, stop_ids: list[int]) -> dict:
    """What must be equal for two tokenizers to give the same ids: vocabulary (added tokens included), the special
    tokens' ids and the ids that end a reply."""
    special = {name: getattr(tok, f"{name}_token_id", None) for name in ("bos", "eos", "unk", "pad")}
    return {"vocab": tok.get_vocab(), "special": special, "stop": stop_ids}


def config_vocab_size(name: str) -> int | None:
    """``vocab_size`` of a model directory's ``config.json`` (a multimodal model's ``text_config`` when it holds
    it), None when there is none to read (a GGUF file, ``tiny``, a hub name not cached)."""
    import json

    path = Path(name).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    size = config.get("vocab_size")
    if size is None and isinstance(config.get("text_config"), dict):
        size = config["text_config"].get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def check_vocab_fits(name: str, tok, where: str = "model.name", role: str = "model") -> None:
    """One line (``ModelError``) when ``name``'s ``config.json`` declares fewer embeddings (``vocab_size``) than its
    tokenizer has ids: the first id past the table is an index error deep in transformers, after the weights load.
    More embeddings than tokens (padded tables) are fine."""
    size = config_vocab_size(name)
    ids = max(tok.get_vocab().values(), default=-1) + 1
    if size is not None and size < ids:
        raise ModelError(
            f"the {role} {name} has vocab_size={size} in its config.json but its tokenizer has {ids} token ids "
            f"(up to {ids - 1}): ids {size} and above have no embedding", where=where,
            fix=f"give the {role}'s own tokenizer files (those it was trained with), or a {role} whose config.json "
                "vocab_size covers its tokenizer")


def tokenizer_difference(student: str, teacher: str, *, student_gguf: str | None = None,
                         where: str = "teacher.model") -> str | None:
    """How ``teacher``'s tokenizer differs from ``student``'s, in one line, or None when it gives the same ids: equal
    vocabularies (token -> id), special-token ids and stop ids. Each model's ``config.json`` must declare an
    embedding for every id of its tokenizer (:func:`check_vocab_fits`, a ``ModelError`` otherwise). Reads tokenizer
    files and ``config.json`` only, before any weights load
    (``student_gguf``: the student's GGUF file inside the ``student`` directory, as ``model.gguf_file``); a tokenizer
    that cannot be read is a ``ModelError`` naming ``where``. A teacher whose tokenizer differs is distilled across
    tokenizers (``train/online/teacher.py``); :func:`same_ids` is the same test on tokenizers already loaded."""
    if student_gguf:
        student = f"{student.rstrip('/')}/{student_gguf}"
    (s_tok, s_stop), (t_tok, t_stop) = _tokenizer_from_files(student), _tokenizer_from_files(teacher, where)
    check_vocab_fits(teacher, t_tok, where, "teacher")
    if not student_gguf:
        check_vocab_fits(student, s_tok, "model.name", "student")
    a, b = _identity(s_tok, s_stop), _identity(t_tok, t_stop)
    if a == b:
        return None
    if a["vocab"] != b["vocab"]:
        only = sorted(set(b["vocab"].items()) ^ set(a["vocab"].items()), key=lambda kv: kv[1])[:1]
        detail = f"vocabularies differ (e.g. {only[0][0]!r} -> {only[0][1]})" if only else "vocabularies differ"
    elif a["special"] != b["special"]:
        detail = f"special token ids differ (student {a['special']}, teacher {b['special']})"
    else:
        detail = f"the ids that end a reply differ (student {a['stop']}, teacher {b['stop']})"
    return f"student {student} ({len(a['vocab'])} tokens), teacher {teacher} ({len(b['vocab'])} tokens): {detail}"
