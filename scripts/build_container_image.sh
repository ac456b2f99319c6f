#!/usr/bin/env bash
# Build the container image the container topologies run (topologies/local-container.yaml):
# Debian bookworm from the machine's own apt sources with mmdebstrap (no registry), imported
# into podman's local storage as localhost/epdctl-runtime:bookworm. The project's venv, its
# base interpreter and the model are mounted at run time, not copied in. Idempotent: an image
# already built from the same package list (its epdctl.packages label) is kept
# (EPDCTL_IMAGE_REBUILD=1 rebuilds). Needs root, mmdebstrap and podman.
set -euo pipefail
IMAGE=${EPDCTL_IMAGE:-localhost/epdctl-runtime:bookworm}
PODMAN=(podman --cgroup-manager=cgroupfs --events-backend=file)
# python3 (not -minimal): the runtime's stdlib servers; libgomp1/libstdc++6: torch; libnuma1:
# vLLM's CPU kernels (vllm/_C.abi3.so); libibverbs1: the RDMA transports import it; procps: `ps`
# inside for diagnosis.
PACKAGES=python3,libgomp1,libstdc++6,libnuma1,libibverbs1,procps,ca-certificates
if [ "${EPDCTL_IMAGE_REBUILD:-0}" != 1 ] && [ "$("${PODMAN[@]}" image inspect --format \
    '{{index .Labels "epdctl.packages"}}' "$IMAGE" 2>/dev/null)" = "$PACKAGES" ]; then
  exit 0
fi
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
work=$(mktemp -d /tmp/epdctl-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=apt --format=tar --include="$PACKAGES" \
  bookworm "$work/rootfs.tar" "$sources"
"${PODMAN[@]}" import --quiet --change "LABEL epdctl.packages=$PACKAGES" "$work/rootfs.tar" "$IMAGE" >/dev/null
echo "built $IMAGE"
