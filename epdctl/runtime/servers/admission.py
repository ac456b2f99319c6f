"""Admission of a chat request: every limit that can be checked before the work is allocated.

Order (cheapest first): the body size and JSON depth were checked while reading; here the
prompt's token count gets a lower bound from its text bytes (no tokeniser run: a token never
stands for more bytes than the longest vocabulary entry), then the images are fetched and
their headers checked (pixels per image and per request, aspect ratio), which gives the exact
number of vision tokens, and only then is anything decoded, encoded or tokenised.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp

from epdctl.runtime.images import load_images
from epdctl.runtime.limits import Limits, check_prompt_tokens, image_tokens, max_token_bytes, text_bytes
from epdctl.runtime.openai_api import check_context


class Admission:
    def __init__(self, limits: Limits, bundle: Any, context_length: int):
        self.limits = limits
        self.bundle = bundle
        self.context_length = context_length
        self.prompt_limit = min(limits.max_prompt_tokens or context_length, context_length)
        self.token_bytes = max_token_bytes(bundle.tokenizer)

    def text_tokens_at_least(self, req: Any) -> int:
        """A lower bound on the prompt's text tokens; raises 400 when even that is too many."""
        lower = math.ceil(text_bytes(req.messages) / self.token_bytes)
        check_prompt_tokens(lower, self.prompt_limit, exact=False)
        check_context(lower, req.max_tokens, self.context_length)
        return lower

    def text(self, text: str, max_tokens: int) -> None:
        """The same bound for a raw text prompt (``/generate``, ``/tokenize``), before tokenising it."""
        lower = math.ceil(len(text.encode("utf-8", "surrogatepass")) / self.token_bytes)
        check_prompt_tokens(lower, self.prompt_limit, exact=False)
        check_context(lower, max_tokens, self.context_length)

    async def images(self, req: Any, session: aiohttp.ClientSession) -> list[bytes]:
        """The request's images, each checked from its header; the prompt bound now counts vision tokens."""
        lower = self.text_tokens_at_least(req)
        if not req.image_refs:
            return []
        datas, sizes = await load_images(req.image_refs, self.limits, session)
        merge = int(self.bundle.config.vision_config.spatial_merge_size)
        lower += sum(image_tokens(w, h, self.bundle.image_processor, merge) for w, h in sizes)
        check_prompt_tokens(lower, self.prompt_limit, exact=False)
        check_context(lower, req.max_tokens, self.context_length)
        return datas

    def prompt(self, n_tokens: int, max_tokens: int) -> None:
        """The exact check once the prompt is tokenised."""
        check_prompt_tokens(n_tokens, self.prompt_limit, exact=True)
        check_context(n_tokens, max_tokens, self.context_length)
