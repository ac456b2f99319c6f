"""Image bytes -> vision-tower embeddings, one batched pass for all cache misses of a call."""

from __future__ import annotations

import hashlib
import io
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch
from PIL import Image

from .embed_cache import EmbedCache
from .errors import BadRequestError
from .model import ModelBundle

log = logging.getLogger(__name__)


@dataclass
class EncodedImage:
    digest: str                      # sha256 of the image bytes
    embeds: torch.Tensor             # [n_tokens, hidden]
    grid_thw: tuple[int, int, int]
    cached: bool


def image_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode_image(index: int, data: bytes) -> Image.Image:
    """Bytes -> RGB PIL image; a clear 400 naming the image when it is not a readable picture."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise BadRequestError(400, f"image {index}: cannot decode ({exc})") from exc


class VisionEncoder:
    """Encodes images with an embedding cache; returned tensors are shared with the cache, so
    callers must treat them as read-only."""

    def __init__(self, bundle: ModelBundle, cache_mb: float = 256,
                 after_pass: Callable[[int], None] = lambda pixels: None):
        """``after_pass(pixels)`` runs after each vision pass (the fast path trims the heap there)."""
        if getattr(bundle.model.model, "visual", None) is None:
            raise ValueError("VisionEncoder needs a bundle loaded with the vision tower (role encoder/colocated)")
        self.bundle = bundle
        self.visual = bundle.model.model.visual
        self.cache = EmbedCache(cache_mb)
        self.after_pass = after_pass
        self._stats = {"images": 0, "cache_hits": 0, "cache_misses": 0, "vision_passes": 0, "vision_seconds": 0.0}

    @property
    def stats(self) -> dict:
        return dict(self._stats, cache_bytes=self.cache.bytes, cache_entries=len(self.cache),
                    cache_evictions=self.cache.evictions)

    def encode(self, images: list[bytes]) -> list[EncodedImage]:
        digests = [image_digest(b) for b in images]
        found: dict[str, tuple[torch.Tensor, tuple[int, int, int]]] = {}
        misses: list[int] = []  # first index of each distinct uncached digest
        for i, d in enumerate(digests):
            if d in found or any(digests[j] == d for j in misses):
                continue
            hit = self.cache.get(d)
            if hit is not None:
                found[d] = hit
            else:
                misses.append(i)
        hit_digests = set(found)
        if misses:
            pils = [decode_image(i + 1, images[i]) for i in misses]
            decoded = sum(p.width * p.height for p in pils)
            try:
                embeds = self._vision(pils)
            finally:
                del pils
                self.after_pass(decoded)
            for i, (emb, grid) in zip(misses, embeds):
                found[digests[i]] = (emb, grid)
                self.cache.put(digests[i], emb, grid)
        self._stats["images"] += len(images)
        out = []
        for d in digests:
            cached = d in hit_digests
            self._stats["cache_hits" if cached else "cache_misses"] += 1
            emb, grid = found[d]
            out.append(EncodedImage(digest=d, embeds=emb, grid_thw=grid, cached=cached))
        return out

    @torch.inference_mode()
    def _vision(self, pils: list[Image.Image]) -> list[tuple[torch.Tensor, tuple[int, int, int]]]:
        t0 = time.perf_counter()
        try:
            feats = self.bundle.image_processor(images=pils, return_tensors="pt")
        except ValueError as exc:  # e.g. an aspect ratio the processor refuses: the client's image, not us
            raise BadRequestError(400, f"the vision processor refused the image: {exc}") from None
        grid = feats["image_grid_thw"]
        pixels = feats["pixel_values"].to(self.bundle.dtype)
        merged = self.visual(pixels, grid_thw=grid).pooler_output
        sizes = (grid.prod(-1) // self.bundle.merge_size**2).tolist()
        parts = torch.split(merged, sizes)
        self._stats["vision_passes"] += 1
        self._stats["vision_seconds"] += time.perf_counter() - t0
        return [(p.clone(), (int(t), int(h), int(w))) for p, (t, h, w) in zip(parts, grid.tolist())]
