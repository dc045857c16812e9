#!/usr/bin/env bash
# The test command: formatting, lints, unit tests, golden files, and the integration
# tests against real Envoys and a real kube-apiserver. Installs what it needs first, into
# ~/.cache/switchyard-e2e (see e2e/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# A test run builds everything once: incremental state would only double the target's
# size on disk (4 GB of 12 GB). Set CARGO_INCREMENTAL=1 to keep it while iterating.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step "provisioning Envoy, Kubernetes, etcd, CoreDNS, kubectl, helm, containerd (cached after the first run)"
# The first run on a fresh machine installs containerd, runc and the CNI plugins from
# Debian and builds Kubernetes, etcd, CoreDNS and helm from their Go modules: about
# 20-30 minutes on 2 cores. Later runs take about a second.
e2e/provision.sh

step "images for the node tests (release builds, cached in ~/.cache/switchyard-e2e)"
e2e/images.sh

for tool in rustfmt clippy-driver; do
  command -v "$tool" >/dev/null || { echo "missing $tool: rustup component add ${tool%-driver}" >&2; exit 1; }
done

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzz targets are a workspace of their own (cargo-fuzz builds them apart); linted
# against the project's build directory, whose dependencies they share.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --manifest-path fuzz/Cargo.toml --target-dir target --all-targets --locked -- -D warnings

step "the core crate knows no Kubernetes"
# The dependency direction, compiled in: model, translator and xDS server (core/) must not
# reach kube or k8s-openapi, even through another crate.
if cargo tree -p switchyard-core -e normal --locked --prefix none | grep -E '^(kube|k8s-openapi)'; then
  echo "switchyard-core depends on Kubernetes crates (above)" >&2
  exit 1
fi

step "no front-end imports another (docs/architecture.md)"
e2e/layout.sh

step "cargo test"
# Integration tests run real Envoys and bounded load; two at a time keeps a
# 2-core machine honest.
cargo test --workspace --locked -- --test-threads "${SWITCHYARD_TEST_THREADS:-2}"

step "fuzzing: every target of fuzz/ for ${SWITCHYARD_FUZZ_SECONDS:-45} s"
# The standalone file parser, TrafficRoute and ProxyConfig specs into the model, and xDS
# request sequences into the session state machine (fuzz/README.md).
e2e/fuzz.sh
