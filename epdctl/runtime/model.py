"""Load any local Qwen2-VL checkpoint offline, without torchvision.

The full ``Qwen2VLProcessor`` needs a video processor that imports torchvision, so the bundle
holds the tokenizer and the PIL image processor separately. A role drops the half of the model
it never runs (the encoder keeps only the vision tower, prefill/decode only the language model).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

from .errors import RuntimeWorkerError  # noqa: E402

log = logging.getLogger(__name__)

Role = Literal["encoder", "prefill", "decode", "colocated"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelBundle:
    tokenizer: Any
    image_processor: Any
    model: Qwen2VLForConditionalGeneration
    config: Any
    served_name: str
    eos_token_ids: list[int]
    dtype: torch.dtype
    path: str = ""

    @property
    def image_token_id(self) -> int:
        return int(self.config.image_token_id)

    @property
    def merge_size(self) -> int:
        return int(self.config.vision_config.spatial_merge_size)


def _check_folder(path: Path) -> None:
    if not path.is_dir():
        raise RuntimeWorkerError(f"model path {path}: not a directory; pass --model-path to a local checkpoint folder")
    missing = [n for n in ("config.json", "preprocessor_config.json") if not (path / n).is_file()]
    if missing:
        raise RuntimeWorkerError(f"model path {path}: missing {', '.join(missing)}; "
                                 "expected a Hugging Face Qwen2-VL checkpoint folder")


def _eos_ids(model: Qwen2VLForConditionalGeneration, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in (eos if isinstance(eos, list) else [eos]) + [tokenizer.eos_token_id]:
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end not in ids:
        ids.append(im_end)
    return ids


def load_bundle(path: str, *, role: Role, dtype: str = "float32") -> ModelBundle:
    """Load tokenizer, image processor and (the needed part of) the model from ``path``."""
    folder = Path(path).expanduser().resolve()
    _check_folder(folder)
    if dtype not in _DTYPES:
        raise RuntimeWorkerError(f"dtype {dtype!r}: choose one of {', '.join(_DTYPES)}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
        model = Qwen2VLForConditionalGeneration.from_pretrained(str(folder), dtype=_DTYPES[dtype])
    except Exception as exc:  # transformers raises many kinds; the worker must exit with one clear line
        raise RuntimeWorkerError(f"model path {folder}: cannot load the checkpoint "
                                 f"({type(exc).__name__}: {exc})") from exc
    model.eval()
    if role == "encoder":
        del model.model.language_model
        del model.lm_head
    elif role in ("prefill", "decode"):
        del model.model.visual
    log.info("loaded %s as %s (%s)", folder, role, dtype)
    return ModelBundle(tokenizer=tokenizer, image_processor=image_processor, model=model, config=model.config,
                       served_name=folder.name, eos_token_ids=_eos_ids(model, tokenizer), dtype=_DTYPES[dtype],
                       path=str(folder))
