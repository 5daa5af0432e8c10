"""Images in records: where each comes from, and the checks every image passes before any weights load.

A record's images are *references*, each normalised by :func:`image_ref` to one of two plain values:

* a ``str``: the absolute path of an image file (a relative path is read from the data file's directory, as TRL's
  scripts and ``datasets``' image folders have them; ``~`` expanded);
* ``bytes``: the encoded file (PNG, JPEG, ...), as a ``datasets`` ``Image`` column holds it, or a PIL image given
  in Python (encoded once, losslessly, as PNG).

URLs are refused with one line (rlhfkit reads no network at run time: download the images and give their paths);
a ``data:image/...;base64,`` URI is decoded to bytes. References are plain values, so a record pickles to a reward
worker and hashes for the fingerprint like any other.

:func:`check_images` opens every distinct image once, fully decoded, and refuses (one line naming the row, exit 2)
a missing file, a file that is not an image or is truncated, a 0x0 image, one over :data:`MAX_IMAGE_PIXELS`
(decoded only after its header says it fits), and a pixel mode a processor would misread (16- / 32-bit integer and
float images: ``I``, ``I;16``, ``F``, ...). Converting to RGB is the processor's (``do_convert_rgb``: transparency
composited as the family does), not done here.

Where a record's images go (TRL's conventions): an ``images`` column (a list) or an ``image`` column (one); images
inside the content parts of its messages (``{"type": "image", "image": ...}``, also ``url`` / ``path`` keys). Each
``{"type": "image"}`` part takes the next image in order (:func:`place_images`).
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from ..errors import DataError

MAX_IMAGE_PIXELS = 50_000_000
"""The largest image accepted (width x height): 50 megapixels; processors resize far below that (Qwen2.5-VL's
default maximum is about 12.8 megapixels), and a larger file is more likely a scan or a decompression bomb."""
# pixel modes a processor's RGB conversion reads correctly (8 bits per channel, palettes, CMYK / YCbCr / LAB)
MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"})
IMAGE_COLUMNS = ("images", "image")
_URL_SCHEMES = ("http://", "https://", "ftp://", "s3://", "gs://", "hf://")
_PART_KEYS = ("image", "url", "path", "image_url")


def _url_error(value: str, where: str, field: str) -> DataError:
    return DataError(f"'{field}' is a URL ({value[:60]}): rlhfkit reads no network at run time", where=where,
                     fix="download the images and give their paths (relative to the data file) or bytes")


def image_ref(value: Any, *, base: Path | None, where: str, field: str = "images") -> str | bytes:
    """One image reference as a path (absolute) or bytes (see the module docstring); a :class:`DataError` naming
    ``where`` / ``field`` for anything else."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return image_ref(value["bytes"], base=base, where=where, field=field)
        for key in ("path", "url", "image_url"):
            inner = value.get(key)
            if isinstance(inner, dict):
                inner = inner.get("url")
            if inner is not None:
                return image_ref(inner, base=base, where=where, field=field)
        raise DataError(f"'{field}' holds a mapping without 'bytes' or 'path' ({sorted(value)[:4]})", where=where,
                        fix="give each image as a path, bytes, or a datasets Image value")
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not len(value):
            raise DataError(f"'{field}' holds empty bytes", where=where, fix="give the image file's bytes")
        return bytes(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise DataError(f"'{field}' holds an empty path", where=where, fix="give the image file's path")
        if text.startswith("data:"):
            head, _, data = text.partition(",")
            if ";base64" not in head or not data:
                raise DataError(f"'{field}' is a data URI that is not base64 ({head[:40]})", where=where,
                                fix="give a path, or a base64 data URI (data:image/png;base64,...)")
            try:
                return base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise DataError(f"'{field}' is a data URI whose base64 does not decode", where=where,
                                fix="check the encoding, or give the image's path") from None
        if text.lower().startswith(_URL_SCHEMES):
            raise _url_error(text, where, field)
        path = Path(text).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return str(path.resolve())
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - matplotlib, a dependency, depends on Pillow
        Image = None
    if Image is not None and isinstance(value, Image.Image):
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return buf.getvalue()
    if hasattr(value, "__array__"):
        raise DataError(f"'{field}' holds an array ({type(value).__name__})", where=where,
                        fix="give the image as a PIL image, bytes or a path (PIL.Image.fromarray(array))")
    raise DataError(f"'{field}' holds a {type(value).__name__}, not an image", where=where,
                    fix="give each image as a path (relative to the data file), bytes, or a PIL image")


def describe(ref: str | bytes) -> str:
    """A reference in a message: its path, or ``<N bytes>``."""
    return ref if isinstance(ref, str) else f"<image of {len(ref):,} bytes>"


def open_image(ref: str | bytes, where: str = "image"):
    """The image of ``ref``, fully decoded and checked (see the module docstring); a :class:`DataError` naming
    ``where`` otherwise. Returns the PIL image as stored (mode unchanged)."""
    from PIL import Image

    name = describe(ref)
    if isinstance(ref, str) and not Path(ref).is_file():
        raise DataError(f"image file not found: {ref}", where=where,
                        fix="check the path (a relative path is read from the data file's directory)")
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # our own limit, checked on the header before any pixel is decoded
    try:
        img = Image.open(ref if isinstance(ref, str) else io.BytesIO(ref))
        w, h = img.size
        if w * h > MAX_IMAGE_PIXELS:
            raise DataError(f"image {name} has {w * h:,} pixels ({w}x{h}), more than {MAX_IMAGE_PIXELS:,}",
                            where=where, fix="resize it first (the processor resizes every image far below that)")
        img.load()
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError... on damaged files
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise DataError(f"cannot read image {name}: {text}", where=where,
                        fix="re-save the image (PNG or JPEG), or remove the record") from None
    finally:
        Image.MAX_IMAGE_PIXELS = saved
    if w == 0 or h == 0:
        raise DataError(f"image {name} is {w}x{h} pixels", where=where, fix="remove the empty image")
    if img.mode not in MODES:
        raise DataError(f"image {name} has pixel mode {img.mode!r} (high bit depth), which processors misread",
                        where=where, fix="save it as 8-bit RGB or grayscale (e.g. PNG)")
    return img


def load_images(refs: list, where: str = "image") -> list:
    """PIL images of ``refs`` (:func:`open_image` each)."""
    return [open_image(r, where) for r in refs]


def as_pil(value: Any) -> Any:
    """A reference (or a list of them) as PIL images, for reward functions (TRL passes them PIL images); anything
    that is not a reference is returned unchanged."""
    if isinstance(value, list):
        return [as_pil(v) for v in value]
    if isinstance(value, (str, bytes)):
        try:
            return open_image(value)
        except DataError:
            return value
    return value


def check_images(records: list) -> int:
    """Open every distinct image of ``records`` once (:func:`open_image`); the first bad one is a :class:`DataError`
    naming its record. Returns the number of distinct images checked."""
    seen: set = set()
    for r in records:
        for ref in r.get("images") or ():
            if ref not in seen:
                open_image(ref, getattr(r, "where", "record"))
                seen.add(ref)
    return len(seen)


# ─────────────────────────────────────────── images in a row ───────────────────────────────────────────


def part_image(part: dict) -> Any:
    """The image given inline in a ``{"type": "image", ...}`` content part, or None."""
    for key in _PART_KEYS:
        if part.get(key) is not None:
            return part[key]
    return None


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def row_images(row: dict, *, base: Path | None, where: str) -> list | None:
    """The references of the row's ``images`` / ``image`` column (None when it has neither; a single image or a
    list; None values in the list are an error)."""
    for column in IMAGE_COLUMNS:
        value = row.get(column)
        if value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        out = []
        for i, v in enumerate(values):
            if v is None:
                raise DataError(f"'{column}[{i}]' is empty (null)", where=where, fix="give every image, or drop it")
            out.append(image_ref(v, base=base, where=where, field=f"{column}[{i}]" if len(values) > 1 else column))
        return out
    return None


def place_images(messages: list[dict], images: list | None, *, base: Path | None, where: str,
                 field: str) -> tuple[list[dict], list]:
    """``(messages, images)`` with every image placed: images inline in content parts are taken out of them (in
    order) into the image list; a conversation with no image part but images gets them at the start of its first
    user turn (TRL's convention for a text prompt with an image column). The number of image parts must equal the
    number of images (a :class:`DataError` naming the row otherwise). ``messages``: validated messages whose
    content is text or a list of text / image parts."""
    inline, parts = [], 0
    out = []
    for m in messages:
        if isinstance(m["content"], list):
            content = []
            for p in m["content"]:
                if p["type"] == "image":
                    parts += 1
                    src = p.get("src")
                    if src is not None:
                        inline.append(image_ref(src, base=base, where=where, field=f"{field} image part"))
                    content.append({"type": "image"})
                else:
                    content.append(p)
            m = {**m, "content": content}
        out.append(m)
    if inline and images:
        raise DataError(f"the row gives images both inline in '{field}' and in an image column", where=where,
                        fix="give them in one place")
    images = inline or list(images or [])
    if parts == 0 and images:
        first = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        if first is None:
            raise DataError(f"'{field}' has no user turn to put its {len(images)} image(s) in", where=where,
                            fix="add a user turn, or place the images with {\"type\": \"image\"} content parts")
        m = out[first]
        text = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
        out[first] = {**m, "content": [{"type": "image"} for _ in images] + text}
        parts = len(images)
    if parts != len(images):
        raise DataError(f"'{field}' has {parts} image placeholder{'s' if parts != 1 else ''} "
                        f"({{\"type\": \"image\"}} parts) but the row has {len(images)} image"
                        f"{'s' if len(images) != 1 else ''}", where=where,
                        fix="give one image per {\"type\": \"image\"} part, in order")
    return out, images
