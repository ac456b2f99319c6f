"""Image references from chat requests → validated image bytes and their sizes.

The prefill resolves every ``image_url`` before any encoder work, so a bad image is reported
as ``400 image N: ...`` (N is the 1-based position of the image in the request) instead of
failing deep inside an encoder batch shared with other requests. Sizes come from the image
headers and are checked against the pixel limits before a single pixel is decoded; then the
images are decoded one at a time (so a request never holds more than one decoded image here).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import os
from urllib.parse import urlsplit

import aiohttp
from PIL import Image

from epdctl.runtime.limits import Limits, check_image_sizes, image_size
from epdctl.runtime.openai_api import ApiError


async def load_images(refs: list[str], limits: Limits,
                      session: aiohttp.ClientSession) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Fetch all images concurrently, check sizes, then check each decodes; ApiError(400) for the first bad one."""
    results = await asyncio.gather(*(_load_one(i + 1, ref, limits, session) for i, ref in enumerate(refs)),
                                   return_exceptions=True)
    for res in results:
        if isinstance(res, BaseException):
            raise res
    datas: list[bytes] = list(results)  # type: ignore[arg-type]
    sizes = [image_size(n, data) for n, data in enumerate(datas, start=1)]
    check_image_sizes(sizes, limits)
    await asyncio.to_thread(_check_all_decode, datas)
    return datas, sizes


async def _load_one(n: int, ref: str, limits: Limits, session: aiohttp.ClientSession) -> bytes:
    if ref.startswith("data:"):
        return _from_data_url(n, ref, limits)
    if ref.startswith(("http://", "https://")):
        return await _from_http(n, ref, limits, session)
    if ref.startswith("file://") or ref.startswith("/"):
        return await asyncio.to_thread(_from_file, n, ref, limits)
    raise ApiError(400, f"image {n}: unsupported image reference (use a data: URL, an http(s) URL "
                        "or, with --allow-local-files, a file path)", "invalid_image")


def _from_data_url(n: int, ref: str, limits: Limits) -> bytes:
    header, sep, payload = ref.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ApiError(400, f"image {n}: data URL must look like data:image/<type>;base64,<data>", "invalid_image")
    if len(payload) * 3 // 4 > limits.max_image_bytes:
        raise _too_large(n, limits)
    try:
        return base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"image {n}: data URL payload is not valid base64", "invalid_image") from None


def fetch_allowed(url: str, hosts: tuple[str, ...]) -> bool:
    """Only hosts the topology names (limits.image_fetch_hosts), compared case-insensitively."""
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return False
    return bool(host) and host in {h.lower().strip("[]") for h in hosts}


async def _from_http(n: int, url: str, limits: Limits, session: aiohttp.ClientSession) -> bytes:
    if not fetch_allowed(url, limits.image_fetch_hosts):
        raise ApiError(400, f"image {n}: fetching images from {urlsplit(url).hostname or url!r} is not allowed; "
                            "send the image as a data: URL (the cluster fetches only from the hosts in "
                            "limits.image_fetch_hosts)", "image_fetch_forbidden")
    timeout = aiohttp.ClientTimeout(total=limits.image_fetch_timeout)
    try:
        async with session.get(url, timeout=timeout, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ApiError(400, f"image {n}: fetching {url} returned HTTP {resp.status}", "image_fetch_failed")
            if resp.content_length is not None and resp.content_length > limits.max_image_bytes:
                raise _too_large(n, limits)
            buf = bytearray()
            async for block in resp.content.iter_chunked(65536):
                buf += block
                if len(buf) > limits.max_image_bytes:
                    raise _too_large(n, limits)
            return bytes(buf)
    except asyncio.TimeoutError:
        raise ApiError(400, f"image {n}: fetching {url} took longer than {limits.image_fetch_timeout:g} s",
                       "image_fetch_failed") from None
    except aiohttp.ClientError as exc:
        raise ApiError(400, f"image {n}: cannot fetch {url}: {exc}", "image_fetch_failed") from None


def _from_file(n: int, ref: str, limits: Limits) -> bytes:
    if not limits.allow_local_files:
        raise ApiError(400, f"image {n}: local files are not allowed; start the prefill with "
                            "--allow-local-files to serve them", "local_files_disabled")
    path = ref[len("file://"):] if ref.startswith("file://") else ref
    try:
        size = os.path.getsize(path)
        if size > limits.max_image_bytes:
            raise _too_large(n, limits)
        with open(path, "rb") as fh:
            return fh.read(limits.max_image_bytes + 1)
    except OSError as exc:
        raise ApiError(400, f"image {n}: cannot read {path}: {exc.strerror or exc}", "invalid_image") from None


def _too_large(n: int, limits: Limits) -> ApiError:
    return ApiError(400, f"image {n}: image is larger than the limit of {limits.max_image_bytes} bytes "
                         "(limits.max_image_bytes)", "image_too_large")


def _check_all_decode(datas: list[bytes]) -> None:
    for n, data in enumerate(datas, start=1):
        check_decodes(n, data)


def check_decodes(n: int, data: bytes) -> None:
    """Decode the image fully once (its size already checked); damaged bytes become a 400 naming image N."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception as exc:  # PIL raises many types (OSError for truncated files, SyntaxError ...)
        raise ApiError(400, f"image {n}: cannot decode image ({type(exc).__name__}: {exc})",
                       "invalid_image") from None
