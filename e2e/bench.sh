#!/usr/bin/env bash
# The benchmarks: translation, push → ACK on a real Envoy, and time to Ready of rollouts on
# a real kube-apiserver with three real Envoys. Prints tables (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
e2e/provision.sh
cargo build --release --quiet -p switchyard --bin switchyard -p switchyard-e2e --bin switchyard-bench --bin switchyard-rollout-bench
target/release/switchyard-bench "$@"
echo
target/release/switchyard-rollout-bench
