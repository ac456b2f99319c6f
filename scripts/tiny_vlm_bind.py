"""An auxiliary training loss that teaches the tiny model to find each answer line's shape in
its own image, by position, not by colour.

``tiny_vlm_binding.py`` measured why same-colour requests fail: at the position that predicts
line k's colour a layer-3 head puts 0.98 of its weight on image k, but at the next position,
which predicts the shape, no head puts more than 0.39 there: the shape is looked up again by
the colour just written, so among images of one colour the model names another one's shape.
More same-colour data, more depth and an item-per-token vocabulary did not change that
(``benchmarks/results/tiny_vlm_candidates_s8.json``). This loss asks for the lookup directly:
at every shape-predicting position, the most focused head of the chosen layers should put its
weight on image k's tokens (``-log`` of that share, averaged over answer lines).

    loss = lm_loss + weight * bind_loss(attentions, input_ids, labels, ...)
"""

from __future__ import annotations

from typing import Any

import torch


def shape_queries(ids: torch.Tensor, labels: torch.Tensor, image_pad_id: int, shape_ids: set[int],
                  ) -> list[tuple[int, int, list[int]]]:
    """(row, query position, image k's token positions) for every answer line's shape token:
    the query is the position before the shape token (the one whose logits predict it); the
    k-th shape token of a row's answer belongs to the row's k-th image."""
    out: list[tuple[int, int, list[int]]] = []
    for b in range(ids.shape[0]):
        pads = (ids[b] == image_pad_id).nonzero().flatten().tolist()
        answer = (labels[b] != -100).nonzero().flatten().tolist()
        shapes_at = [p for p in answer if int(labels[b, p]) in shape_ids]
        if not shapes_at or not pads:
            continue
        per = len(pads) // len(shapes_at) if len(pads) % len(shapes_at) == 0 else 0
        if per == 0:
            continue  # an answer that does not name one shape per image: nothing to bind
        for k, p in enumerate(shapes_at):
            out.append((b, p - 1, pads[k * per:(k + 1) * per]))
    return out


def bind_loss(attentions: tuple[torch.Tensor, ...], queries: list[tuple[int, int, list[int]]],
              layers: list[int]) -> torch.Tensor:
    """Mean over queries of ``-log`` (the largest share any head of ``layers`` puts on the
    query's image)."""
    if not queries:
        return attentions[0].new_zeros(())
    terms = []
    for b, q, own in queries:
        shares = torch.cat([attentions[layer][b, :, q, own].sum(-1) for layer in layers])
        terms.append(-torch.log(shares.max() + 1e-6))
    return torch.stack(terms).mean()


def shape_token_ids(tok: Any) -> set[int]:
    """The ids of `` circle``, `` square``... (each shape is one token after a space)."""
    from epdctl.shapes import SHAPES

    ids = set()
    for s in SHAPES:
        got = tok(" " + s, add_special_tokens=False)["input_ids"]
        if len(got) != 1:
            raise RuntimeError(f"shape {s!r} is {len(got)} tokens; the bind loss needs one")
        ids.add(got[0])
    return ids
