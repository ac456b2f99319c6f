"""`check`'s transfer-store item (epdctl/preflight/store_check.py), run on this machine through
the local runner: where the store will be made, on which storage, and a store without room."""

from __future__ import annotations

from pathlib import Path

import yaml

from epdctl.preflight.runners import LocalRunner
from epdctl.preflight.store_check import store_items
from epdctl.topology import topology_from_text
from epdctl.topology.model import Topology

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "topologies" / "vllm-cpu-epd.yaml"


def _topo(**transfer: object) -> Topology:
    doc = yaml.safe_load(SRC.read_text())
    doc["transfer"].update(transfer)
    return topology_from_text(yaml.safe_dump(doc), SRC)


def test_the_store_is_judged_where_it_will_be_made(tmp_path: Path) -> None:
    runners = {"local": LocalRunner("local")}
    store = tmp_path / "a" / "store"
    [item] = store_items(_topo(store=str(store)), runners)
    assert item.ok and item.node == "local" and item.check == "transfer store", item
    assert item.detail.startswith(f"{store} (made by `up`) on this node's own disk, ")
    store.mkdir(parents=True)
    [item] = store_items(_topo(store=str(store)), runners)
    assert item.ok and f"{store} (there, `up` empties it)" in item.detail
    [item] = store_items(_topo(store=str(store)), runners, min_free_gb=1e9)
    assert not item.ok and f"GiB free on {store}, below 1e+09 GiB" in item.detail, item.detail


def test_no_item_when_nothing_moves_through_files() -> None:
    assert store_items(_topo(backend="nixl"), {"local": LocalRunner("local")}) == []
