#!/bin/sh
# An installed libc10d is usable from a user's C program through pkg-config
# (shared and static) and through CMake's find_package; an uninstalled one
# through the build tree's pkg-config file.
#   test_install.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cat >"$tmp/user.c" <<'C'
#include <c10d.h>
#include <stdio.h>
int main(void)
{
    c10d_work *w;
    if (c10d_work_create("user", 10, &w) != 0)
        return 1;
    int rc = c10d_work_wait(w, 5000);
    c10d_work_release(w);
    printf("%s: %s\n", c10d_build_info(), c10d_status_name(rc));
    return rc == C10D_ETIMEDOUT && c10d_shutdown() == 0 ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig"
cc -std=c11 -Wall -Werror ${USER_CFLAGS:-} "$tmp/user.c" -o "$tmp/user_shared" $(pkg-config --cflags --libs c10d)
libdir=$(pkg-config --variable=libdir c10d)
LD_LIBRARY_PATH="$libdir" "$tmp/user_shared"
cc -std=c11 -Wall -Werror ${USER_CFLAGS:-} "$tmp/user.c" -o "$tmp/user_static" $(pkg-config --cflags c10d) \
    "$libdir/libc10d.a" $(pkg-config --static --libs-only-L --libs-only-other c10d) \
    $(pkg-config --static --libs c10d | tr ' ' '\n' | grep -v -- '-lc10d$' | tr '\n' ' ')
"$tmp/user_static"

# The build tree, uninstalled: its c10d-uninstalled.pc (no LD_LIBRARY_PATH:
# it links with an rpath to the build folder).
PKG_CONFIG_PATH="$build" cc -std=c11 -Wall -Werror ${USER_CFLAGS:-} "$tmp/user.c" \
    -o "$tmp/user_build_tree" $(PKG_CONFIG_PATH="$build" pkg-config --cflags --libs c10d)
"$tmp/user_build_tree"

mkdir -p "$tmp/cm"
cp "$tmp/user.c" "$tmp/cm/user.c"
cat >"$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(user C)
find_package(c10d REQUIRED)
add_executable(user user.c)
target_link_libraries(user PRIVATE c10d::c10d)
CM
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DCMAKE_C_FLAGS="${USER_CFLAGS:-}" -DCMAKE_EXE_LINKER_FLAGS="${USER_CFLAGS:-}" >/dev/null
cmake --build "$tmp/cm/build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cm/build/user"
echo "install test: pkg-config (shared, static, build tree) and find_package all work"
