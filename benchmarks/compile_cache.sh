#!/usr/bin/env bash
# torch.compile's caches kept from one GPU visit to the next. Each visit's machine starts bare, so every row
# compiled again (about a minute for base's step, two for big's) and Inductor's kernel tuning, longer than one
# call, never finished. gpu_visit.sh keeps Inductor's and Triton's caches in one folder, starts it from the
# carried runs/gpu/inductor.tgz and packs it into $OUT as it goes; gpu_prepare.sh takes what a visit brought
# back as the next visit's runs/gpu/inductor.tgz. The next visit then loads each graph and each tuned kernel it
# has met instead of building it again (a changed graph or kernel still compiles).
#   bash benchmarks/compile_cache.sh pack DIR ARCHIVE     # DIR into ARCHIVE (.tgz, its entries under DIR's
#                                                         # name), replaced whole or left as it was; not over LIMIT_MIB
#   bash benchmarks/compile_cache.sh check ARCHIVE NAME   # whether ARCHIVE is whole and holds NAME/'s entries only
#   bash benchmarks/compile_cache.sh unpack ARCHIVE DIR   # ARCHIVE, if check passes for DIR's name, replaces DIR
set -euo pipefail
LIMIT_MIB=${LIMIT_MIB:-15}  # one file a visit brings back is at most 16 MiB

check() {  # ARCHIVE NAME
  local entries
  if ! entries=$(tar -tzf "$1" 2>/dev/null); then
    echo "compile_cache: $1 is not a whole .tgz (a visit cut while packing?)" >&2
    return 1
  fi
  if grep -qvE "^$2(/|$)" <<<"$entries" || grep -qE '(^|/)\.\.(/|$)' <<<"$entries"; then
    echo "compile_cache: $1 holds entries outside $2/" >&2
    return 1
  fi
}

case "${1:-}" in
  pack)
    dir=${2:?pack DIR ARCHIVE} archive=${3:?pack DIR ARCHIVE}
    [ -d "$dir" ] || exit 0  # nothing compiled yet
    tmp=$(mktemp /tmp/compile_cache.XXXXXX)
    trap 'rm -f "$tmp"' EXIT
    # exit status 1: a file changed while it was read (a compile running beside the packing): packed as it was
    tar -czf "$tmp" --exclude=locks -C "$(dirname "$dir")" "$(basename "$dir")" 2>/dev/null || [ $? = 1 ]
    size=$(stat -c %s "$tmp")
    if [ "$size" -gt $((LIMIT_MIB << 20)) ]; then
      echo "compile_cache: $dir packs to $((size >> 20)) MiB, over $LIMIT_MIB: not packed" >&2
      exit 0
    fi
    cp "$tmp" "$archive.$$" && mv "$archive.$$" "$archive" ;;  # one packing beside another: each whole
  check)
    check "${2:?check ARCHIVE NAME}" "${3:?check ARCHIVE NAME}" ;;
  unpack)
    archive=${2:?unpack ARCHIVE DIR} dir=${3:?unpack ARCHIVE DIR}
    check "$archive" "$(basename "$dir")" || { echo "compile_cache: $dir left as it was" >&2; exit 1; }
    rm -rf "$dir" && mkdir -p "$(dirname "$dir")"
    tar -xzf "$archive" --no-same-owner -C "$(dirname "$dir")"
    echo "compile_cache: $dir from $archive ($(du -sh "$dir" | cut -f1))" ;;
  *) echo "usage: bash benchmarks/compile_cache.sh pack DIR ARCHIVE | check ARCHIVE NAME | unpack ARCHIVE DIR" >&2
     exit 2 ;;
esac
