"""Image references from chat requests → validated image bytes.

The prefill resolves every ``image_url`` before any encoder work, so a bad image is reported
as ``400 image N: ...`` (N is the 1-based position of the image in the request) instead of
failing deep inside an encoder batch shared with other requests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import os
from dataclasses import dataclass

import aiohttp
from PIL import Image, UnidentifiedImageError

from epdctl.runtime.openai_api import ApiError

DEFAULT_MAX_IMAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_PIXELS = 40_000_000


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS
    allow_local_files: bool = False
    fetch_timeout: float = 10.0


async def load_images(refs: list[str], limits: ImageLimits, session: aiohttp.ClientSession) -> list[bytes]:
    """Fetch all images concurrently and check they decode; raise ApiError(400) for the first bad one."""
    results = await asyncio.gather(*(_load_one(i + 1, ref, limits, session) for i, ref in enumerate(refs)),
                                   return_exceptions=True)
    for res in results:
        if isinstance(res, BaseException):
            raise res
    return list(results)  # type: ignore[arg-type]


async def _load_one(n: int, ref: str, limits: ImageLimits, session: aiohttp.ClientSession) -> bytes:
    if ref.startswith("data:"):
        data = _from_data_url(n, ref, limits)
    elif ref.startswith(("http://", "https://")):
        data = await _from_http(n, ref, limits, session)
    elif ref.startswith("file://") or ref.startswith("/"):
        data = await asyncio.to_thread(_from_file, n, ref, limits)
    else:
        raise ApiError(400, f"image {n}: unsupported image reference (use a data: URL, an http(s) URL "
                            "or, with --allow-local-files, a file path)", "invalid_image")
    await asyncio.to_thread(check_decodes, n, data, limits)
    return data


def _from_data_url(n: int, ref: str, limits: ImageLimits) -> bytes:
    header, sep, payload = ref.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ApiError(400, f"image {n}: data URL must look like data:image/<type>;base64,<data>", "invalid_image")
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise ApiError(400, f"image {n}: image is larger than the limit of {limits.max_bytes} bytes "
                            "(--max-image-bytes)", "image_too_large")
    try:
        return base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"image {n}: data URL payload is not valid base64", "invalid_image") from None


async def _from_http(n: int, url: str, limits: ImageLimits, session: aiohttp.ClientSession) -> bytes:
    timeout = aiohttp.ClientTimeout(total=limits.fetch_timeout)
    try:
        async with session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                raise ApiError(400, f"image {n}: fetching {url} returned HTTP {resp.status}", "image_fetch_failed")
            if resp.content_length is not None and resp.content_length > limits.max_bytes:
                raise _too_large(n, limits)
            buf = bytearray()
            async for block in resp.content.iter_chunked(65536):
                buf += block
                if len(buf) > limits.max_bytes:
                    raise _too_large(n, limits)
            return bytes(buf)
    except asyncio.TimeoutError:
        raise ApiError(400, f"image {n}: fetching {url} took longer than {limits.fetch_timeout:g} s",
                       "image_fetch_failed") from None
    except aiohttp.ClientError as exc:
        raise ApiError(400, f"image {n}: cannot fetch {url}: {exc}", "image_fetch_failed") from None


def _from_file(n: int, ref: str, limits: ImageLimits) -> bytes:
    if not limits.allow_local_files:
        raise ApiError(400, f"image {n}: local files are not allowed; start the prefill with "
                            "--allow-local-files to serve them", "local_files_disabled")
    path = ref[len("file://"):] if ref.startswith("file://") else ref
    try:
        size = os.path.getsize(path)
        if size > limits.max_bytes:
            raise _too_large(n, limits)
        with open(path, "rb") as fh:
            return fh.read(limits.max_bytes + 1)
    except OSError as exc:
        raise ApiError(400, f"image {n}: cannot read {path}: {exc.strerror or exc}", "invalid_image") from None


def _too_large(n: int, limits: ImageLimits) -> ApiError:
    return ApiError(400, f"image {n}: image is larger than the limit of {limits.max_bytes} bytes "
                         "(--max-image-bytes)", "image_too_large")


def check_decodes(n: int, data: bytes, limits: ImageLimits) -> None:
    """Decode the image fully once; truncated or non-image bytes become a 400 naming image N."""
    if not data:
        raise ApiError(400, f"image {n}: empty image", "invalid_image")
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > limits.max_pixels:
                raise ApiError(400, f"image {n}: {width}x{height} pixels is more than the limit of "
                                    f"{limits.max_pixels} pixels", "image_too_large")
            img.load()
    except ApiError:
        raise
    except UnidentifiedImageError:
        raise ApiError(400, f"image {n}: cannot decode image: not a recognised image format "
                            "(send PNG, JPEG, WebP, GIF or BMP)", "invalid_image") from None
    except Exception as exc:  # PIL raises many types (OSError for truncated files, SyntaxError ...)
        raise ApiError(400, f"image {n}: cannot decode image ({type(exc).__name__}: {exc})",
                       "invalid_image") from None
