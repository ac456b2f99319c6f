"""container: blocks: layering, validation (YAML path and line, what to do), and the command each
runtime's record writes: docker/podman run, apptainer exec (flags checked against apptainer's own
flag definitions), pyxis srun options (checked against pyxis's spank_opts table)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.topology import require_artifacts, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "containers"
QWEN = (ROOT / "topologies" / "qwen2vl-epd.yaml").read_text()


def _with(text: str, **blocks: object) -> str:
    doc = yaml.safe_load(text)
    for key, value in blocks.items():
        node = doc
        *path, last = key.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    return yaml.safe_dump(doc, sort_keys=False)


def _problems(text: str) -> str:
    with pytest.raises(TopologyError) as e:
        topology_from_text(text, ROOT / "topologies" / "t.yaml")
    return str(e.value)


def test_layers_merge_like_other_settings() -> None:
    text = _with(QWEN, container={"image": "lmsysorg/sglang:v0.5.3", "mounts": ["/data:/data"],
                                  "env": {"A": "1"}},
                 roles__prefill__container={"mounts": ["/logs:/logs"], "env": {"B": "2"}, "shm_size": "32g"},
                 roles__decode__container=False)
    topo = topology_from_text(text, ROOT / "topologies" / "t.yaml")
    pre = next(w for w in topo.workers if w.role.value == "prefill").settings.container
    enc = next(w for w in topo.workers if w.role.value == "encoder").settings.container
    dec = next(w for w in topo.workers if w.role.value == "decode").settings.container
    assert pre is not None and enc is not None and dec is None
    assert [m.source for m in pre.mounts] == ["/data", "/logs"] and pre.env == {"A": "1", "B": "2"}
    assert pre.shm_size == "32g" and enc.shm_size is None and pre.image == enc.image


def test_container_false_opts_a_worker_out_and_the_schema_allows_it() -> None:
    """`container: false` on one worker runs it bare while its role's others stay boxed; the JSON
    schema takes false (and only false) where a container block goes."""
    import jsonschema

    from epdctl.topology.jsonschema_gen import generate

    doc = yaml.safe_load(_with(QWEN, container={"image": "lmsysorg/sglang:v0.5.3"}))
    role = doc["roles"]["decode"]
    del role["count"]
    role["workers"] = [{"nodes": ["d0"], "container": False}, {"nodes": ["d0"]}]
    plan = build_plan(topology_from_text(yaml.safe_dump(doc, sort_keys=False), ROOT / "topologies" / "t.yaml"))
    bare = {w.name: w.container is None for w in plan.workers}
    assert bare["decode-0"] and not bare["decode-1"] and not bare["prefill-0"], bare
    assert plan.workers[[w.name for w in plan.workers].index("decode-0")].argv[0] != "docker"
    validator = jsonschema.Draft202012Validator(generate())
    doc["roles"]["encoder"]["container"] = False
    assert not list(validator.iter_errors(doc))
    doc["roles"]["encoder"]["container"] = True
    assert list(validator.iter_errors(doc))


def test_docker_defaults_follow_the_anchors() -> None:
    """--network host --ipc host, the worker's GPUs, memlock=-1, /dev/infiniband and IPC_LOCK on ib
    NICs, a per-process name with the cluster and labels; the model's HF repository root mounted."""
    snap = "/hf/hub/models--Qwen--Qwen2-VL-7B-Instruct/snapshots/51c47430f97dd7c74aa1fa6825e68a813478097f"
    text = _with(QWEN, container={"image": "lmsysorg/sglang:v0.5.3-cu126", "shm_size": "32g"},
                 model={"path": snap, "served_name": "qwen2-vl-7b", "architecture": "Qwen2VLForConditionalGeneration"})
    plan = build_plan(topology_from_text(text, ROOT / "topologies" / "t.yaml"))
    w = next(s for s in plan.workers if s.name == "prefill-1")
    argv = list(w.argv)
    i = argv.index("lmsysorg/sglang:v0.5.3-cu126")
    opts, inner = argv[:i], argv[i + 1:]
    assert opts[:6] == ["docker", "run", "--rm", "--init", "--name", "epdctl-qwen2vl-epd-prefill-1"]
    for flag in ("--network=host", "--ipc=host", "--gpus", '"device=4,5,6,7"', "/dev/infiniband", "IPC_LOCK",
                 "memlock=-1:-1", "32g", "/hf/hub/models--Qwen--Qwen2-VL-7B-Instruct:/hf/hub/models--Qwen--"
                 "Qwen2-VL-7B-Instruct:ro", "epdctl.cluster=qwen2vl-epd", f"epdctl.node={w.node}", "epdctl.process=prefill-1"):
        assert flag in opts, flag
    assert inner[:3] == ["python3", "-m", "sglang.launch_server"] and snap in inner
    assert w.container is not None and w.container_name == "epdctl-qwen2vl-epd-prefill-1"
    for name in w.env:  # every variable goes in by name: values (and secrets) never on the command line
        assert name in opts and not any(o.startswith(f"{name}=") for o in opts)


def test_engine_venv_is_mounted_read_only_and_the_transfer_store_writable() -> None:
    """vLLM in containers: the engine's venv and its base interpreter's prefix (pyvenv.cfg home)
    at their own paths, read-only; the shared-storage store, which embeddings and KV cross,
    writable, on every worker and at the same path as bare."""
    vllm = (ROOT / "topologies" / "vllm-cpu-epd.yaml").read_text()
    text = _with(vllm, container={"runtime": "podman", "image": "localhost/epdctl-runtime:bookworm"},
                 transfer={"backend": "shared-storage", "store": "/scratch/epd-store"},
                 engine={"name": "vllm", "version": "0.32", "venv": "/opt/engines/vllm"})
    plan = build_plan(topology_from_text(text, ROOT / "topologies" / "t.yaml"))
    for w in plan.workers:
        argv = list(w.argv)
        i = argv.index("localhost/epdctl-runtime:bookworm")
        opts, inner = argv[:i], argv[i + 1:]
        assert "/scratch/epd-store:/scratch/epd-store" in opts, opts  # no :ro
        assert "/opt/engines/vllm:/opt/engines/vllm:ro" in opts, opts
        assert inner[0] == "/opt/engines/vllm/bin/vllm" and "/scratch/epd-store" in " ".join(inner)


def test_podman_passes_gpus_as_cdi_devices() -> None:
    text = _with(QWEN, container={"image": "docker.io/lmsysorg/sglang:v0.5.3", "runtime": "podman"})
    w = next(s for s in build_plan(topology_from_text(text)).workers if s.name == "decode-0")
    assert [w.argv[i + 1] for i, a in enumerate(w.argv) if a == "--device"] == [
        "nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2", "nvidia.com/gpu=3", "/dev/infiniband"]


@pytest.mark.parametrize("image, runtime, expect", [
    ("lmsysorg/SGLang:latest", "docker", "upper-case letters"),
    ("lmsysorg/sglang:", "docker", "is not an image reference"),
    ("sglang.sqsh", "pyxis", "write ./sglang.sqsh"),
    ("nvcr.io/nvidia/pytorch:24.01-py3", "pyxis", "nvcr.io#nvidia/pytorch:24.01-py3"),
    ("sglang", "apptainer", "docker://lmsysorg/sglang"),
    ("bundles/sglang", "slurm-oci", "absolute path of an OCI bundle"),
])
def test_bad_image_references_name_the_line_and_the_fix(image: str, runtime: str, expect: str) -> None:
    launcher = "slurm" if runtime in ("pyxis", "slurm-oci") else "ssh"
    text = _with(QWEN, launcher=launcher, slurm={"partition": "gpu"},
                 container={"image": image, "runtime": runtime})
    msg = _problems(text)
    assert "container.image" in msg and expect in msg and re.search(r"line \d+", msg), msg


@pytest.mark.parametrize("image", ["lmsysorg/sglang:v0.5.3-cu126", "localhost:5000/epd/runtime:1",
                                   "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "a" * 64, "ubuntu"])
def test_valid_docker_references(image: str) -> None:
    topology_from_text(_with(QWEN, container={"image": image}))


def test_rdma_nics_without_the_device_is_an_error_with_the_fix() -> None:
    text = _with(QWEN, container={"image": "lmsysorg/sglang:v0.5.3", "devices": ["/dev/nvidia0"]})
    msg = _problems(text)
    assert "container.devices" in msg and "mlx5_0" in msg and "add /dev/infiniband" in msg, msg
    topology_from_text(_with(QWEN, container={"image": "lmsysorg/sglang:v0.5.3", "devices": ["/dev/infiniband"]}))
    topology_from_text(_with(QWEN, container={"image": "lmsysorg/sglang:v0.5.3", "devices": [],
                                               "privileged": True}))


def test_step_runtimes_need_the_slurm_launcher() -> None:
    msg = _problems(_with(QWEN, container={"image": "/images/sglang.sqsh", "runtime": "pyxis"}))
    assert "container.runtime" in msg and "launcher: slurm" in msg, msg


def test_bad_container_keys_are_reported_with_their_paths() -> None:
    msg = _problems(_with(QWEN, container={"image": "x", "ulimits": {"memlok": -1}, "shm_size": "lots",
                                           "mounts": ["relative/dir:/x"], "networkk": "host"}))
    for part in ("container.ulimits.memlok", "unknown ulimit 'memlok'",
                 "container.shm_size", "container.mounts[0]", "container.networkk"):
        assert part in msg, (part, msg)


def _pyxis_table() -> dict[str, int]:
    """option name -> has_arg, from pyxis's own spank_opts (args.c)."""
    text = (FIX / "pyxis_spank_opts.c").read_text()
    entries = re.findall(r'\{\s*"([a-z-]+)",\s*(?:"[^"]*"|NULL),.*?\n\s*(\d), \d+, spank_option_\w+\s*\}',
                         text, re.S)
    return {name: int(has_arg) for name, has_arg in entries}


def test_pyxis_table_is_read_from_its_source() -> None:
    table = _pyxis_table()
    assert len(table) == 16 and table["container-image"] == 1 and table["no-container-entrypoint"] == 0
    assert table["container-env"] == 1 and table["no-container-mount-home"] == 0


def _pyxis_plan(image: str = "/lustre/images/sglang+0.5.3.sqsh"):
    text = _with(QWEN, launcher="slurm", slurm={"partition": "gpu"},
                 container={"image": image, "runtime": "pyxis", "mounts": ["/lustre/logs:/logs", "/models:/models:ro"],
                            "env": {"NCCL_DEBUG": "INFO"}})
    return build_plan(topology_from_text(text))


def test_pyxis_options_are_pyxis_own_flags() -> None:
    table = _pyxis_table()
    w = next(s for s in _pyxis_plan().workers if s.name == "prefill-0")
    assert w.step_options and w.argv[:3] == ("python3", "-m", "sglang.launch_server")
    for opt in w.step_options:
        name, eq, value = opt[2:].partition("=")
        assert name in table, opt
        assert bool(eq) == bool(table[name]) and (not eq or value), opt  # =VALUE exactly when it takes one
    opts = dict(o[2:].partition("=")[::2] for o in w.step_options)
    assert opts["container-image"] == "/lustre/images/sglang+0.5.3.sqsh"
    assert opts["container-mounts"].split(",")[:2] == ["/lustre/logs:/logs", "/models:/models:ro"]
    assert "no-container-entrypoint" in opts and "no-container-mount-home" in opts
    assert opts["container-name"] == "epdctl-qwen2vl-epd-prefill-0"
    assert set(opts["container-env"].split(",")) >= {"NCCL_DEBUG", "MELLANOX_VISIBLE_DEVICES"}


def test_pyxis_lines_in_the_sbatch_script() -> None:
    from epdctl.launchers.slurm.sbatch import render_sbatch

    text = _with(QWEN, launcher="slurm", slurm={"partition": "gpu"},
                 container={"image": "/images/sglang.sqsh", "runtime": "pyxis"})
    topo = topology_from_text(text)
    script = render_sbatch(topo, build_plan(topo))
    assert re.search(r"^launch prefill-0 1 --container-image=/images/sglang\.sqsh .*--no-container-entrypoint",
                     script, re.M), script
    assert '"$@" bash -c "$cmd"' in script


def _apptainer_flags() -> dict[str, bool]:
    """flag name -> takes a value, from apptainer's own definitions (cmd/internal/cli/action_flags.go)."""
    text = (FIX / "apptainer_action_flags.go").read_text()
    return {name: default != "false" for default, name in
            re.findall(r'DefaultValue: ([^\n]+?),?(?: //[^\n]*)?\n\s*Name:\s+"([a-z-]+)"', text)}


def test_apptainer_exec_uses_apptainer_own_flags() -> None:
    flags = _apptainer_flags()
    assert flags == {"bind": True, "env": True, "nv": False, "cwd": True}
    text = _with(QWEN, container={"image": "docker://lmsysorg/sglang:v0.5.3", "runtime": "apptainer",
                                  "mounts": ["/models:/models:ro"], "env": {"NCCL_DEBUG": "INFO"}, "workdir": "/tmp"})
    w = next(s for s in build_plan(topology_from_text(text)).workers if s.name == "encoder-0")
    argv = list(w.argv)
    i = argv.index("docker://lmsysorg/sglang:v0.5.3")
    assert argv[:3] == ["apptainer", "exec", "--nv"] and argv[i + 1:i + 4] == ["python3", "-m", "sglang.launch_server"]
    j = 2
    while j < i:
        name = argv[j][2:]
        assert name in flags, argv[j]
        j += 2 if flags[name] else 1
    assert "/models:/models:ro" in argv and "NCCL_DEBUG=INFO" in argv


def test_import_keeps_the_docker_run_around_a_server() -> None:
    from epdctl.importer.launches import classify
    from epdctl.importer.shell import parse_script

    path = FIX / "import" / "docker_run_sglang.sh"
    launches = [x for c in parse_script(path.read_text(), path.name) if (x := classify(c)) is not None]
    assert len(launches) == 1 and launches[0].kind == "sglang"
    assert launches[0].get("--model-path") == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert launches[0].container == {"runtime": "docker", "image": "lmsysorg/sglang:v0.4.5-cu125",
                                     "shm_size": "1g", "workdir": "/code",
                                     "mounts": ["$PWD/data:/root/.cache/huggingface", "./:/code"]}


def test_import_keeps_pyxis_options_of_an_srun_line() -> None:
    """srtctl's form (docs: shared/reference containers.md): srun ... --container-image ... python3 -m ..."""
    from epdctl.importer.launches import classify
    from epdctl.importer.shell import parse_script

    line = ("srun --overlap --nodes 1 --container-image /lustre/img/sglang.sqsh --no-container-entrypoint "
            "--no-container-mount-home --container-mounts /lustre/logs:/logs,/lustre/model:/model "
            "python3 -m sglang.launch_server --model-path /model --tp 8 --port 30000\n")
    (launch,) = [x for c in parse_script(line, "srtctl.sh") if (x := classify(c)) is not None]
    assert launch.container == {"runtime": "pyxis", "image": "/lustre/img/sglang.sqsh",
                                "mounts": ["/lustre/logs:/logs", "/lustre/model:/model"]}


def test_shell_render_prints_the_srun_that_boxes_a_step() -> None:
    from epdctl.render import to_shell

    text = to_shell(_pyxis_plan(), "p0")
    assert "  srun \\\n    --container-image=/lustre/images/sglang+0.5.3.sqsh \\\n" in text, text
    assert "--no-container-entrypoint" in text and "python3 -m sglang.launch_server" in text


def test_slurm_oci_bundle_is_read_from_the_topology_folder_and_must_hold_the_mounts(tmp_path: Path) -> None:
    """A ../ bundle is found from the topology file; a missing one, or one whose config.json lacks a
    declared mount (SLURM cannot add mounts to a step), is an error of `validate` and `up` (not of
    render) with the YAML line and the build command."""
    (tmp_path / "topo").mkdir()
    bundle = tmp_path / "bundles" / "b"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"mounts": [
        {"destination": "/data", "type": "bind", "source": "/data", "options": ["rbind", "ro"]}]}))
    src = tmp_path / "topo" / "t.yaml"

    def load(container: dict) -> None:
        src.write_text(_with(QWEN, launcher="slurm", slurm={"partition": "gpu"},
                             container={"runtime": "slurm-oci", **container}))
        topo = topology_from_text(src.read_text(), src)  # renders without the bundle...
        require_artifacts(topo, src)  # ...which `validate` and `up` require

    load({"image": "../bundles/b", "mounts": ["/data:/data:ro"]})
    with pytest.raises(TopologyError) as e:
        load({"image": "../bundles/none"})
    assert f"no OCI bundle at {tmp_path / 'bundles' / 'none'} (no such directory)" in str(e.value), e.value
    assert "container.image" in str(e.value) and "line " in str(e.value), e.value
    assert f"build_oci_bundle.py --image IMAGE --out {tmp_path / 'bundles' / 'none'}" in str(e.value), e.value
    with pytest.raises(TopologyError) as e:
        load({"image": str(bundle), "mounts": ["/data:/data:ro", "/models:/m:ro"]})
    assert "does not mount /models:/m:ro" in str(e.value) and "--mount /models:/m:ro" in str(e.value), e.value
