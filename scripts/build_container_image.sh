#!/usr/bin/env bash
# Build the container image the container topologies run (topologies/local-container.yaml):
# Debian bookworm from the machine's own apt sources with mmdebstrap (no registry), imported
# into podman's local storage as localhost/epdctl-runtime:bookworm. The project's venv, its
# base interpreter and the model are mounted at run time, not copied in. Idempotent: an image
# already present is kept (EPDCTL_IMAGE_REBUILD=1 rebuilds). Needs root, mmdebstrap and podman.
set -euo pipefail
IMAGE=${EPDCTL_IMAGE:-localhost/epdctl-runtime:bookworm}
PODMAN=(podman --cgroup-manager=cgroupfs --events-backend=file)
if [ "${EPDCTL_IMAGE_REBUILD:-0}" != 1 ] && "${PODMAN[@]}" image exists "$IMAGE" 2>/dev/null; then
  exit 0
fi
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
work=$(mktemp -d /tmp/epdctl-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
# python3 (not -minimal): the runtime's stdlib servers; libgomp1/libstdc++6: torch; libibverbs1:
# the RDMA transports import it; procps: `ps` inside for diagnosis.
mmdebstrap --quiet --variant=apt --format=tar \
  --include=python3,libgomp1,libstdc++6,libibverbs1,procps,ca-certificates \
  bookworm "$work/rootfs.tar" "$sources"
"${PODMAN[@]}" import --quiet "$work/rootfs.tar" "$IMAGE" >/dev/null
echo "built $IMAGE"
