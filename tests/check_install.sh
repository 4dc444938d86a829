#!/bin/sh
# Install into a scratch prefix, then build a tiny consumer twice: through the
# CMake package (find_package(moecomm)) and through pkg-config; and run the
# installed mc-bench (where the build has it) with no LD_LIBRARY_PATH.
set -e
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
mkdir -p "$tmp/app"
cat > "$tmp/app/main.c" <<'C'
#include <moecomm.h>
#include <moecomm_bench.h> /* installed beside it */
#include <stdio.h>
int main(void) {
  printf("moecomm %d: %s\n", mc_version(), mc_result_string(MC_SUCCESS));
  return mc_version() == MC_VERSION ? 0 : 1;
}
C
cat > "$tmp/app/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.18)
project(app C)
find_package(moecomm 0.5 REQUIRED)
add_executable(app main.c)
target_link_libraries(app PRIVATE moecomm::moecomm)
C
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
cmake --build "$tmp/app/build" > /dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/app/build/app"
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" cc "$tmp/app/main.c" -o "$tmp/app/app-pc" \
  $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs moecomm)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/app/app-pc"
echo "install check: CMake package and pkg-config both link"
if [ -e "$tmp/prefix/bin/mc-bench" ]; then
  LD_LIBRARY_PATH= "$tmp/prefix/bin/mc-bench" -n 2 -t 4 -r 1 -w 1 > "$tmp/bench.txt" 2>&1 ||
    { cat "$tmp/bench.txt"; echo "install check: the installed mc-bench did not run"; exit 1; }
  grep -q "verdict: PASS" "$tmp/bench.txt"
  echo "install check: the installed mc-bench runs from the prefix alone"
fi
