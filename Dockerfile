# syntax=docker/dockerfile:1
#
# The Switchyard operator image: built with cargo, run from a distroless base (glibc, CA
# certificates, no shell) as a non-root user.
#
#   docker build -t ghcr.io/switchyard/switchyard:0.1.0 .
#
# The chart (charts/switchyard) runs it as `switchyard operator`; `switchyard rbac` and
# `switchyard crdgen` work from the same image.

# The toolchain the repository is tested with (the crate's rust-version is the minimum).
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Only what the build needs (see .dockerignore): the workspace manifests and sources.
COPY . .
# The registry and target folders are BuildKit caches: rebuilds reuse compiled
# dependencies. The binary is copied out of the cache before the step ends.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package switchyard --bin switchyard \
 && install -D -m 0755 target/release/switchyard /out/switchyard

# Debian 12, like the build stage: the same glibc.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="switchyard" \
      org.opencontainers.image.description="Shifts HTTP traffic between backends through Envoy without dropping a request" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/switchyard /usr/local/bin/switchyard
# nonroot (65532), as the chart's securityContext expects; nothing is written to disk.
USER 65532:65532
# xDS (gRPC) and admin (/healthz, /readyz, /metrics).
EXPOSE 18000 9000
ENTRYPOINT ["/usr/local/bin/switchyard"]
CMD ["operator"]
