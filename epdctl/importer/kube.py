"""Kubernetes manifests -> launch commands, one per pod and container.

Every pod is a machine of its own (its ``place``): a LeaderWorkerSet (leaderworkerset.x-k8s.io)
of ``size`` N is one leader pod (worker index 0) and N-1 worker pods per replica group, each
running its template's container command; Deployments, StatefulSets, Jobs and Pods run one pod per
replica. ``$(VAR)`` references are expanded as Kubernetes does: the container's own literal env,
and what the LeaderWorkerSet controller injects (``LWS_LEADER_ADDRESS``: the group leader's
address, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``). An address only known once the pod runs
becomes a ``${POD_NAME_HOST}`` placeholder the topology keeps.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from epdctl.importer.containers import SHELLS, ContainerError, place_ref, shell_c
from epdctl.importer.shell import Command, ScriptError

K8S_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
LINE = "__line__"


def _plain(node: yaml.Node) -> Any:
    """A composed YAML node as plain data; mappings carry the line they start on."""
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {LINE: node.start_mark.line + 1}
        for k, v in node.value:
            out[str(_plain(k))] = _plain(v)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(v) for v in node.value]
    return yaml.SafeLoader(yaml.dump("")).construct_object(node)  # scalars typed as safe_load types them


def _expand(tok: str, values: dict[str, str]) -> str:
    return K8S_REF.sub(lambda m: values.get(m.group(1), "${" + m.group(1) + "}"), tok)


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _map(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _containers(pod_spec: Any) -> list[dict[str, Any]]:
    if not isinstance(pod_spec, dict):
        return []
    spec = pod_spec.get("spec", pod_spec)
    return [c for c in _list(spec.get("containers")) if isinstance(c, dict)] if isinstance(spec, dict) else []


def _commands(template: Any, pod: str, injected: dict[str, str], source: str) -> list[Command]:
    out: list[Command] = []
    for c in _containers(template):
        argv = [str(x) for x in _list(c.get("command"))] + [str(x) for x in _list(c.get("args"))]
        if not argv:
            continue
        literal = {str(e["name"]): str(e["value"]) for e in _list(c.get("env"))
                   if isinstance(e, dict) and "name" in e and "value" in e}
        values = {**literal, **injected}
        env = {k: _expand(v, values) for k, v in literal.items()}
        argv = [_expand(t, values) for t in argv]
        where = f"{source}:{c.get(LINE, 0)}"
        if len(argv) >= 3 and argv[0] in SHELLS and argv[1] in ("-c", "-lc"):
            try:
                argv = shell_c(argv[2], env, where)
            except ContainerError as e:
                raise ScriptError(str(e)) from None
        out.append(Command(source, int(c.get(LINE, 0)), env, argv, f"pod {pod}", place=f"pod {pod}",
                           image=str(c["image"]) if c.get("image") else None))
    return out


def _count(value: Any, what: str, source: str) -> int:
    try:
        n = int(value if value is not None else 1)
    except (TypeError, ValueError):
        n = -1
    if not 0 < n <= 1024:
        raise ScriptError(f"{source}: {what} is {value!r}; it must be a whole number of pods (1..1024)")
    return n


def _lws(doc: dict[str, Any], name: str, source: str) -> list[Command]:
    spec = _map(doc.get("spec"))
    tmpl = _map(spec.get("leaderWorkerTemplate"))
    size = _count(tmpl.get("size"), f"{name}: leaderWorkerTemplate.size", source)
    worker = tmpl.get("workerTemplate")
    leader = tmpl.get("leaderTemplate") or worker
    out: list[Command] = []
    for group in range(_count(spec.get("replicas"), f"{name}: replicas", source)):
        lead_pod = f"{name}-{group}"
        for index in range(size):
            pod = lead_pod if index == 0 else f"{lead_pod}-{index}"
            injected = {"LWS_LEADER_ADDRESS": place_ref(f"pod {lead_pod}"), "LWS_GROUP_SIZE": str(size),
                        "LWS_WORKER_INDEX": str(index), "LWS_NAME": name, "LWS_GROUP_INDEX": str(group)}
            out += _commands(leader if index == 0 else worker, pod, injected, source)
    return out


def parse_manifests(text: str, source: str) -> list[Command]:
    """Every server/router container command of the manifests in ``text``, pod by pod."""
    try:
        docs = [_plain(n) for n in yaml.compose_all(text) if n is not None]
    except yaml.YAMLError as e:
        raise ScriptError(f"{source}: not a readable Kubernetes manifest ({e})") from None
    out: list[Command] = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        kind = str(doc.get("kind") or "")
        meta = _map(doc.get("metadata"))
        name = str(meta.get("name") or kind.lower())
        spec = _map(doc.get("spec"))
        if kind == "LeaderWorkerSet":
            out += _lws(doc, name, source)
        elif kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"):
            for r in range(_count(spec.get("replicas"), f"{name}: replicas", source)):
                out += _commands(spec.get("template"), f"{name}-{r}", {}, source)
        elif kind == "Job":
            out += _commands(spec.get("template"), f"{name}-0", {}, source)
        elif kind == "Pod":
            out += _commands(doc, name, {}, source)
    return out
