#!/bin/sh
# Builds the libFuzzer target (clang; not part of the CMake build):
#   test/fuzz/build.sh [outdir]        -> outdir/fuzz_store_server (default build-fuzz)
# Run it, e.g. 10 minutes on one core:
#   build-fuzz/fuzz_store_server -max_total_time=600 -jobs=1 corpus/ test/fuzz/seeds/
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-fuzz}
mkdir -p "$out"
clang -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Wall -Wextra -Werror -Wno-unused-command-line-argument \
  -DC10D_VERSION_STRING='"fuzz"' -I"$root" -I"$root/include" \
  "$root/test/fuzz/fuzz_store_server.c" \
  "$root/store_server/wire/codec.c" "$root/store_server/table/table.c" "$root/store_server/server/session.c" \
  "$root/engine/error.c" "$root/engine/log.c" "$root/engine/env.c" "$root/engine/token.c" \
  $(pkg-config --cflags --libs libuv) -o "$out/fuzz_store_server"
echo "$out/fuzz_store_server"
