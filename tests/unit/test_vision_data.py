"""Images in records (data/images.py, data/formats.py, data/sources.py) and their tokenisation by a VLM's processor
(data/media.py, data/chat.py): every form users have images in (paths relative to the data file, bytes, PIL images,
``datasets`` Image columns, content parts, TRL's ``image`` / ``images`` columns), each bad image one line naming the
row, and the processor's expansion keeping the assistant mask exact (image tokens never trained)."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from rlhfkit.data import LengthPolicy, load_dataset_records, normalize_record, tokenize_dataset
from rlhfkit.data.images import image_ref, open_image
from rlhfkit.data.sources import dataset_file
from rlhfkit.errors import DataError


def png(colour=(200, 30, 30), size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def qwen_tok():
    """The tiny Qwen2.5-VL tokenizer with its processor (built offline: no weights)."""
    from rlhfkit.models.vision import load_processor

    return load_processor("tiny:arch=qwen2_5_vl").tokenizer


# ─────────────────────────────────────────── references ───────────────────────────────────────────


def test_references_normalise_every_form(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(png())
    where = dict(where="f.jsonl:1")
    assert image_ref("pics/a.png", base=tmp_path, **where) == str(tmp_path / "pics" / "a.png")
    assert image_ref(png(), base=None, **where) == png()
    pil = Image.new("RGB", (4, 4), (1, 2, 3))
    assert Image.open(io.BytesIO(image_ref(pil, base=None, **where))).getpixel((0, 0)) == (1, 2, 3)
    assert image_ref({"bytes": png(), "path": None}, base=None, **where) == png()
    assert image_ref({"bytes": None, "path": "pics/a.png"}, base=tmp_path, **where).endswith("a.png")
    import base64

    uri = "data:image/png;base64," + base64.b64encode(png()).decode()
    assert image_ref(uri, base=None, **where) == png()


@pytest.mark.parametrize("value, needle", [("https://example.com/cat.png", "URL"), ("", "empty path"),
                                           (b"", "empty bytes"), (3, "holds a int")])
def test_bad_references_are_one_line_naming_the_row(value, needle):
    with pytest.raises(DataError) as err:
        image_ref(value, base=None, where="f.jsonl:7", field="image")
    assert "f.jsonl:7" in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


def _truncated() -> bytes:
    return png(size=(64, 64))[:60]


@pytest.mark.parametrize("make, needle", [
    (lambda p: None, "image file not found"),
    (lambda p: p.write_bytes(_truncated()), "cannot read image"),
    (lambda p: p.write_bytes(b"not an image at all"), "cannot read image"),
    (lambda p: Image.new("1", (10_000, 10_000)).save(p, format="PNG"), "100,000,000 pixels"),
    (lambda p: Image.new("I;16", (8, 8)).save(p, format="PNG"), "pixel mode 'I;16'"),
])
def test_bad_images_are_one_line_naming_the_row(tmp_path, make, needle):
    path = tmp_path / "x.png"
    make(path)
    with pytest.raises(DataError) as err:
        open_image(str(path), "data.jsonl:3")
    text = str(err.value)
    assert text.startswith("data.jsonl:3: ") and needle in text and "(fix: " in text, text


def test_a_zero_pixel_image_is_refused(tmp_path):
    # PIL cannot even identify a 0-pixel file; the check on the size stands behind it for formats it can
    with pytest.raises(DataError, match="cannot read image"):
        open_image(b"P6\n0 0\n255\n", "r:1")


# ─────────────────────────────────────────── records ───────────────────────────────────────────


def test_text_prompt_with_an_image_column_gets_the_image_before_its_text():
    r = normalize_record({"prompt": "What colour?", "image": png(), "answer": "red"}, "prompt", where="r:1")
    assert r["prompt"] == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    assert r["images"] == [png()] and r["image"] == png() and r["answer"] == "red"


def test_content_parts_take_the_images_in_order_and_inline_images_are_moved_out():
    parts = [{"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "text", "text": " and "},
             {"type": "image"}]
    r = normalize_record({"prompt": [{"role": "user", "content": parts}], "images": [png(), png((1, 1, 1))]},
                         "prompt", where="r:1")
    assert [p["type"] for p in r["prompt"][0]["content"]] == ["text", "image", "text", "image"]
    assert r["images"] == [png(), png((1, 1, 1))]
    inline = [{"type": "image", "image": png()}, {"type": "text", "text": "Colour?"}]
    r = normalize_record({"messages": [{"role": "user", "content": inline}, {"role": "assistant", "content": "red"}]},
                         "sft", where="r:2")
    assert r["images"] == [png()] and r["messages"][0]["content"][0] == {"type": "image"}


@pytest.mark.parametrize("row, needle", [
    ({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "x"}]}],
      "images": [png()]}, "2 image placeholders"),
    ({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}]}, "0 images"),
    ({"prompt": "x", "chosen": [{"role": "assistant", "content": [{"type": "image"}]}], "rejected": "y",
      "image": png()}, "images in completions"),
    ({"prompt": "x", "image": "http://example.com/a.png"}, "URL"),
    ({"prompt": "x", "images": [png(), None]}, "'images[1]' is empty"),
    ({"prompt": [{"role": "user", "content": [{"type": "audio"}]}]}, "type 'audio'"),
])
def test_bad_image_rows_are_one_line_naming_the_row(row, needle):
    with pytest.raises(DataError) as err:
        normalize_record(row, "auto", where="data.jsonl:4")
    assert "data.jsonl:4" in str(err.value) and needle in str(err.value), str(err.value)


def test_relative_paths_are_read_from_the_data_files_directory(tmp_path, monkeypatch):
    (tmp_path / "data" / "pics").mkdir(parents=True)
    (tmp_path / "data" / "pics" / "a.png").write_bytes(png())
    write_jsonl(tmp_path / "data" / "p.jsonl", [{"prompt": "x", "image": "pics/a.png"}])
    monkeypatch.chdir(tmp_path)  # not the data file's directory
    [r] = load_dataset_records("data/p.jsonl", "prompt")
    assert r["images"] == [str(tmp_path / "data" / "pics" / "a.png")]
    write_jsonl(tmp_path / "data" / "bad.jsonl", [{"prompt": "x", "image": "pics/a.png"},
                                                  {"prompt": "y", "image": "pics/missing.png"}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: image file not found"):
        load_dataset_records("data/bad.jsonl", "prompt")


def test_python_data_with_pil_images_becomes_a_data_file_with_image_files(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    ds = datasets.Dataset.from_dict({"prompt": ["a", "b"], "image": [Image.new("RGB", (8, 8), (9, 9, 9)),
                                                                      Image.new("RGB", (8, 8), (200, 0, 0))]})
    path = dataset_file(ds, "train")
    assert path == dataset_file(ds, "train")  # by content: written once
    records = load_dataset_records(path, "prompt")
    assert [open_image(r["images"][0]).getpixel((0, 0)) for r in records] == [(9, 9, 9), (200, 0, 0)]
    ds.save_to_disk(str(tmp_path / "saved"))  # a datasets directory: Image columns read as bytes, not decoded
    records = load_dataset_records(str(tmp_path / "saved"), "prompt")
    assert isinstance(records[1]["images"][0], bytes) and open_image(records[1]["images"][0]).getpixel((0, 0)) == \
        (200, 0, 0)


# ─────────────────────────────────────────── tokenisation ───────────────────────────────────────────


def assert_no_image_token_is_a_label(tok, image) -> dict:
    """An SFT record with ``image``, tokenised with and without ``completion_only``: no image token (nor a marker
    around one) is ever a label, and the completion alone is when asked; returns the example of the whole text."""
    from rlhfkit.data.media import image_token_ids, processor_of

    image_ids = image_token_ids(processor_of(tok))
    sft = normalize_record({"prompt": "Describe.", "completion": "A red square.", "image": image}, "sft", where="r:1")
    for completion_only in (True, False):
        [ex], _ = tokenize_dataset([sft], "sft", tok, LengthPolicy(256), completion_only=completion_only)
        labelled = [t for t, lab in zip(ex["input_ids"], ex["labels"]) if lab != -100]
        assert not set(labelled) & image_ids
        if completion_only:
            assert tok.decode(labelled) == "A red square.<|im_end|>"
    return ex


def test_the_processor_expands_images_and_no_image_token_is_ever_a_label(qwen_tok):
    from rlhfkit.data.media import processor_of

    ex = assert_no_image_token_is_a_label(qwen_tok, png(size=(48, 40)))
    pad = processor_of(qwen_tok).image_token_id
    assert ex["input_ids"].count(pad) == ex["media"].tokens == 2  # 48 x 40 resized to 32 x 32: 2 x 2 patches
    [p], _ = tokenize_dataset([normalize_record({"prompt": "Q?", "image": png()}, "prompt", where="r:2")], "prompt",
                              qwen_tok, LengthPolicy(256))
    assert p["prompt_ids"].count(pad) == p["media"].tokens and p["media"].extras["image_grid_thw"].tolist() == \
        [[1, 4, 4]]


@pytest.mark.parametrize("size, grid", [((64, 32), (1, 2)), ((40, 48), (2, 2)), ((32, 32), (2, 2))])
def test_idefics3_splits_an_image_into_tiles_and_no_tile_marker_is_ever_a_label(size, grid):
    """Idefics3 / SmolVLM: the longest edge resized to 64 px, cut into 32 px tiles (``<row_r_col_c>`` before each)
    plus the whole image (``<global-img>``), 4 image tokens each; none of the markers is trained."""
    from rlhfkit.data.media import image_token_ids, processor_of
    from rlhfkit.models.vision import load_processor

    tok = load_processor("tiny:arch=idefics3").tokenizer
    image_ids = image_token_ids(processor_of(tok))
    rows, cols = grid
    ex = assert_no_image_token_is_a_label(tok, png(size=size))
    text = tok.decode(ex["input_ids"])
    markers = [f"<row_{r}_col_{c}>" for r in range(1, rows + 1) for c in range(1, cols + 1)]
    assert [m for m in markers if m in text] == markers and f"<row_{rows + 1}_col_1>" not in text
    assert text.count("<global-img>") == 1 and text.count("<fake_token_around_image>") == rows * cols + 2
    assert ex["media"].tokens == text.count("<image>") == (rows * cols + 1) * 4
    assert {tok.convert_tokens_to_ids(m) for m in ("<global-img>", "<fake_token_around_image>", *markers)} <= image_ids


def test_a_prompt_with_images_is_never_cut(qwen_tok):
    rec = normalize_record({"prompt": "x" * 80, "image": png()}, "prompt", where="r:1")
    text = normalize_record({"prompt": "x" * 80}, "prompt", where="r:2")
    examples, stats = tokenize_dataset([rec, text], "prompt", qwen_tok, LengthPolicy(64, 40))
    assert stats == {"kept": 1, "truncated": 1, "dropped": 1}  # the text prompt cut from the left, the other dropped
    with pytest.raises(DataError, match="r:1"):
        tokenize_dataset([rec], "prompt", qwen_tok, LengthPolicy(64, 40, on_overflow="error"))


def test_images_without_a_processor_are_one_line():
    from rlhfkit.models.tokenizer import load_tokenizer

    rec = normalize_record({"prompt": "x", "image": png()}, "prompt", where="r:9")
    with pytest.raises(DataError, match="r:9: the record has 1 image.*no image processor"):
        tokenize_dataset([rec], "prompt", load_tokenizer("tiny"), LengthPolicy(64))
