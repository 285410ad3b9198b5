#!/usr/bin/env bash
# Builds the mini-broker image without pulling anything from a registry.
#
#   docker/build.sh                 static release build of the three binaries + `docker build`
#   docker/build.sh --skip-cargo    reuse the binaries already in the static target directory
#
# 1. cargo builds `coordinator`, `partition-leader`, `minibroker` and `healthcheck` (the image's
#    Docker healthcheck, docker/healthcheck) as static glibc executables
#    (`-C target-feature=+crt-static`, explicit --target so build scripts stay dynamic) into
#    target/static (CARGO_TARGET_DIR, kept apart from the normal dev target/).
# 2. The binaries are checked to be static and staged, with docker/'s files, in a private
#    temporary build context.
# 3. `docker build` makes a FROM-scratch image (docker/Dockerfile), tagged $MINIBROKER_IMAGE
#    (default minibroker:local).
#
# Environment: MINIBROKER_IMAGE, STATIC_TARGET_DIR (default <repo>/target/static), CARGO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
image="${MINIBROKER_IMAGE:-minibroker:local}"
target_dir="${STATIC_TARGET_DIR:-$repo/target/static}"
triple="x86_64-unknown-linux-gnu"
bins=(coordinator partition-leader minibroker healthcheck)
skip_cargo=0

for arg in "$@"; do
  case "$arg" in
    --skip-cargo) skip_cargo=1 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

if [[ "$(uname -m)" != "x86_64" ]]; then
  echo "build.sh: only x86_64 hosts are supported (the static target is $triple)" >&2
  exit 2
fi

if [[ $skip_cargo -eq 0 ]]; then
  pkgs=()
  for b in "${bins[@]}"; do pkgs+=(-p "$b"); done
  echo "==> cargo build --release --target $triple ${pkgs[*]} (static, CARGO_TARGET_DIR=$target_dir)"
  # Strip symbols for a small image; the environment keeps Cargo.toml untouched.
  (cd "$repo" && \
    CARGO_TARGET_DIR="$target_dir" \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    "${CARGO:-cargo}" build --release --target "$triple" "${pkgs[@]}")
fi

# A private build context, so that concurrent runs (two CI jobs, a demo and a test) never see
# each other's half-copied files: Dockerfile, rootfs/, topology.toml and the binaries in dist/.
context="$(mktemp -d "${TMPDIR:-/tmp}/minibroker-image.XXXXXX")"
trap 'rm -rf "$context"' EXIT
cp -r "$here/Dockerfile" "$here/rootfs" "$here/topology.toml" "$context/"
mkdir -p "$context/dist"
for b in "${bins[@]}"; do
  src="$target_dir/$triple/release/$b"
  if [[ ! -x "$src" ]]; then
    echo "build.sh: $src is missing (run without --skip-cargo)" >&2
    exit 1
  fi
  # A dynamically linked binary would fail inside `scratch` with a confusing "no such file".
  if readelf -d "$src" 2>/dev/null | grep -q '(NEEDED)'; then
    echo "build.sh: $src is not statically linked; it needs:" >&2
    readelf -d "$src" | grep '(NEEDED)' >&2
    exit 1
  fi
  cp "$src" "$context/dist/$b"
done

echo "==> docker build -t $image (context: docker/ plus the static binaries)"
docker build -q -t "$image" "$context" >/dev/null
size_bytes="$(docker image inspect -f '{{.Size}}' "$image")"
echo "==> $image: $(( size_bytes / 1024 / 1024 )) MiB ($size_bytes bytes)"
for b in "${bins[@]}"; do
  printf '    %-18s %6d KiB\n' "$b" "$(( $(stat -c %s "$context/dist/$b") / 1024 ))"
done
