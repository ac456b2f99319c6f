"""Request limits of the embedded runtime, checked before any work is allocated.

Every limit has a command-line flag (the control plane renders them from the topology's
``limits:`` section; docs/limits.md lists them) and a default that is safe on a CPU host.
The checks here run on what a request *declares*: body bytes, JSON nesting, image headers
(width and height are read from the first bytes of the file, no pixels are decoded) and a
lower bound on the prompt's token count that needs no tokeniser run.
"""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass
from typing import Any, Iterable

from PIL import Image, UnidentifiedImageError

from epdctl.runtime.openai_api import ApiError

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_IMAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_REQUEST_PIXELS = 2 * 4096 * 4096
DEFAULT_MAX_IMAGES = 16
DEFAULT_FETCH_TIMEOUT_S = 10.0
# Qwen2-VL's processor refuses images whose long side is more than 200 times the short side
# (transformers qwen2_vl smart_resize: "absolute aspect ratio must be smaller than 200").
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int = 0          # 0: the model's context length
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS
    max_images_per_request: int = DEFAULT_MAX_IMAGES
    image_fetch_hosts: tuple[str, ...] = ()   # empty: no remote image fetches
    image_fetch_timeout: float = DEFAULT_FETCH_TIMEOUT_S
    allow_local_files: bool = False


def add_limit_flags(p: argparse.ArgumentParser, images: bool = True) -> None:
    """The limit flags of one role (encoders take the pixel limits, not the fetch ones)."""
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="HTTP body size limit")
    p.add_argument("--max-images-per-request", type=int, default=DEFAULT_MAX_IMAGES)
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_IMAGE_PIXELS,
                   help="width*height limit per image, checked from the image header")
    p.add_argument("--max-request-pixels", type=int, default=DEFAULT_MAX_REQUEST_PIXELS,
                   help="width*height limit summed over a request's images")
    if not images:
        return
    p.add_argument("--max-prompt-tokens", type=int, default=0, help="prompt token limit (0: context length)")
    p.add_argument("--max-image-bytes", type=int, default=DEFAULT_MAX_IMAGE_BYTES)
    p.add_argument("--image-fetch-hosts", nargs="*", default=[],
                   help="hosts http(s) image URLs may name (default: none, only data: URLs)")
    p.add_argument("--image-fetch-timeout", type=float, default=DEFAULT_FETCH_TIMEOUT_S, help="seconds per image")
    p.add_argument("--allow-local-files", action="store_true", help="accept file paths as image URLs")


def limits_from_args(args: Any) -> Limits:
    """The limits a worker's parsed command line gives (flags a role lacks keep their defaults)."""
    values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k in Limits.__dataclass_fields__ if (v := getattr(args, k, None)) is not None}
    return Limits(**values)


def image_size(n: int, data: bytes) -> tuple[int, int]:
    """(width, height) from the image header; no pixel data is decoded."""
    if not data:
        raise ApiError(400, f"image {n}: empty image", "invalid_image")
    try:
        with Image.open(io.BytesIO(data)) as img:
            return int(img.size[0]), int(img.size[1])
    except UnidentifiedImageError:
        raise ApiError(400, f"image {n}: cannot decode image: not a recognised image format "
                            "(send PNG, JPEG, WebP, GIF or BMP)", "invalid_image") from None
    except Exception as exc:  # PIL raises many types on a damaged header
        raise ApiError(400, f"image {n}: cannot decode image header ({type(exc).__name__}: {exc})",
                       "invalid_image") from None


def check_image_sizes(sizes: Iterable[tuple[int, int]], limits: Limits) -> None:
    """Per-image and per-request pixel limits and the aspect ratio the vision processor accepts."""
    total = 0
    for n, (w, h) in enumerate(sizes, start=1):
        if w < 1 or h < 1:
            raise ApiError(400, f"image {n}: {w}x{h} has no pixels", "invalid_image")
        if max(w, h) / min(w, h) > MAX_ASPECT_RATIO:
            raise ApiError(400, f"image {n}: {w}x{h} has an aspect ratio over {MAX_ASPECT_RATIO}:1, which the "
                                "vision processor refuses; pad or crop the image", "invalid_image_shape")
        if w * h > limits.max_image_pixels:
            raise ApiError(400, f"image {n}: {w}x{h} = {w * h} pixels is more than the limit of "
                                f"{limits.max_image_pixels} per image (limits.max_image_pixels)", "image_too_large")
        total += w * h
        if total > limits.max_request_pixels:
            raise ApiError(400, f"images 1-{n} hold {total} pixels, more than the limit of "
                                f"{limits.max_request_pixels} per request (limits.max_request_pixels)",
                           "image_too_large")


def image_tokens(w: int, h: int, processor: Any, merge_size: int) -> int:
    """Vision tokens Qwen2-VL will use for a w x h image, by the processor's own resize rule
    (``get_number_of_image_patches``, the method vLLM uses for the same purpose)."""
    return int(processor.get_number_of_image_patches(h, w)) // (merge_size * merge_size)


def max_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes any vocabulary entry stands for (an upper bound for byte-level BPE)."""
    try:
        return max(1, max(len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()))
    except Exception:  # no vocabulary to read: assume long tokens, which only weakens the bound
        return 64


def text_bytes(messages: list[dict[str, Any]]) -> int:
    total = 0
    for msg in messages:
        content = msg.get("content")
        parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
        total += sum(len(p.encode("utf-8", "surrogatepass")) for p in parts if isinstance(p, str))
    return total


def check_prompt_tokens(tokens: int, limit: int, exact: bool) -> None:
    if tokens > limit:
        what = "has" if exact else "has at least"
        raise ApiError(400, f"the prompt {what} {tokens} tokens, more than the limit of {limit} "
                            "(limits.max_prompt_tokens or the model's context length)", "context_length_exceeded")
