"""In-place switch clients against an SGLang-shaped server (tests/sglang_switch_fake.py follows
SGLang 0.5.23's source) and the embedded runtime's command-line contract."""

from __future__ import annotations

import pytest

from epdctl.rebalance import switch as sw
from sglang_switch_fake import FakeSGLang


@pytest.fixture
def fakes():
    made: list[FakeSGLang] = []

    def make(role: str, **kw) -> FakeSGLang:
        made.append(FakeSGLang(role, **kw))
        return made[-1]
    yield make
    for f in made:
        f.close()


def test_prefill_to_decode_sends_the_peer_graph_footprint(fakes) -> None:
    peer = fakes("decode", graph_gb=2.5)
    node = fakes("prefill")
    done = sw.switch_sglang(node.url, "decode", decode_urls=[peer.url])
    assert (done.old_role, done.new_role, node.role) == ("prefill", "decode", "decode")
    body = next(b for m, p, b in node.calls if p == "/pd_role_switch")
    assert body == {"new_role": "decode", "decode_cuda_graph_memory_gb": 2.5}


def test_decode_to_prefill_sends_only_the_role(fakes) -> None:
    node = fakes("decode")
    sw.switch_sglang(node.url, "prefill", decode_urls=[])
    assert [b for m, p, b in node.calls if p == "/pd_role_switch"] == [{"new_role": "prefill"}]
    assert node.role == "prefill"


def test_without_a_decode_peer_the_footprint_is_zero_not_missing(fakes) -> None:
    node = fakes("prefill")
    sw.switch_sglang(node.url, "decode", decode_urls=["http://127.0.0.1:9"])
    body = next(b for m, p, b in node.calls if p == "/pd_role_switch")
    assert body["decode_cuda_graph_memory_gb"] == 0.0 and node.role == "decode"


def test_a_busy_instance_refuses_and_stays_restorable(fakes) -> None:
    node = fakes("prefill")
    node.running = 2
    with pytest.raises(sw.SwitchError) as e:
        sw.switch_sglang(node.url, "decode", decode_urls=[])
    assert "not idle" in str(e.value) and e.value.restorable and node.role == "prefill"


def test_flag_missing_is_reported(fakes) -> None:
    node = fakes("decode", enabled=False)
    with pytest.raises(sw.SwitchError, match="--enable-pd-role-switch is not set"):
        sw.switch_sglang(node.url, "prefill", decode_urls=[])


def test_encoders_never_go_through_pd_role_switch(fakes) -> None:
    node = fakes("decode")
    with pytest.raises(sw.SwitchError, match="only prefill <-> decode"):
        sw.switch_sglang(node.url, "encoder", decode_urls=[])
    assert not [c for c in node.calls if c[1] == "/pd_role_switch"]


def test_api_key_goes_as_bearer(fakes, monkeypatch) -> None:
    node = fakes("decode", api_key="s3cret")
    with pytest.raises(sw.SwitchError, match="HTTP 401"):
        sw.switch_sglang(node.url, "prefill", decode_urls=[])
    monkeypatch.setenv("EPD_TEST_KEY", "s3cret")
    sw.switch_sglang(node.url, "prefill", decode_urls=[], api_key_env="EPD_TEST_KEY")
    assert node.role == "prefill"


def test_no_answer_is_not_restorable() -> None:
    with pytest.raises(sw.SwitchError) as e:
        sw.switch_sglang("http://127.0.0.1:9", "prefill", decode_urls=[], timeout=2)
    assert not e.value.restorable


def test_embedded_contract() -> None:
    argv = ["/venv/bin/python", "-m", "epdctl.runtime", "decode", "--port", "31003", "--switchable"]
    assert sw.runtime_argv(argv) == ["decode", "--port", "31003", "--switchable"]
    # the plan says whether a process starts switchable; a version-2 state (which did not
    # record it) is read from its recorded command line once, when loaded
    from epdctl.state.v1 import add_capabilities

    def started_switchable(engine: str, argv: list[str]) -> bool:
        doc = add_capabilities({"version": 2, "processes": [{"name": "w", "role": "decode", "engine": engine,
                                                       "argv": argv}]})
        return bool(doc["processes"][0]["switchable"])
    assert started_switchable("embedded", argv)
    assert not started_switchable("embedded", argv[:-1])
    assert started_switchable("sglang", ["python", "-m", "sglang.launch_server", "--enable-pd-role-switch"])
    assert not started_switchable("vllm", argv)
    with pytest.raises(sw.SwitchError):
        sw.runtime_argv(["python", "-m", "sglang.launch_server"])
