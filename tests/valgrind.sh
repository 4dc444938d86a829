#!/bin/sh
# valgrind memcheck on the tests that exercise allocation, the API surface and
# a few protocol rounds; fails on any error or definite leak.
set -e
build=${1:-build}
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)"; exit 1; }
for t in version_and_strings comm_rules a2a_config_rules experts_not_divisible create_destroy_loop \
         group_sizes bad_calls_change_nothing stall_thread wire_bytes buffer_memory oob_socket_bad_args \
         use_after_destroy early_destroy oob_socket_fake_root; do
  valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    "$build/mc_tests" "$t" > "$build/valgrind-$t.log" 2>&1 || { cat "$build/valgrind-$t.log"; echo "valgrind: $t FAILED"; exit 1; }
  echo "valgrind: $t clean"
done
