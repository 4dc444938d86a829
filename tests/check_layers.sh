#!/bin/sh
# check_layers.sh ROOT - the source folders use only the layers below them:
#   common, core  <  bootstrap  <  cpu, gpu  <  api
# (include/ is the public API, usable everywhere); ref/ (the reference
# model and harness) and tools/ use the library but nothing of tests/.
# Every folder is on the include path, so a file includes another by name:
# this checks each quoted #include against the folder that holds the name.
root=${1:-.}
cd "$root" || exit 2
rank() { # the layer of a source folder
  case $1 in common | core) echo 0 ;; bootstrap) echo 1 ;; cpu | gpu) echo 2 ;; api) echo 3 ;; *) echo 9 ;; esac
}
where() { # the folder that holds header $1
  for d in include src/common src/core src/bootstrap src/cpu src/gpu src/api ref tools tests; do
    [ -f "$d/$1" ] && { echo "$d"; return; }
  done
  echo unknown
}
bad=0
for f in src/*/* ref/* tools/*; do
  case $f in *.c | *.h | *.cu | *.cuh) ;; *) continue ;; esac
  from=$(dirname "$f")
  for h in $(sed -n 's/^ *# *include "\([^"]*\)".*/\1/p' "$f"); do
    to=$(where "$h")
    case $from in
    src/*)
      [ "$to" = include ] && continue
      case $to in src/*) ;; *) echo "$f includes $h from $to"; bad=1; continue ;; esac
      if [ "$(rank "${to#src/}")" -gt "$(rank "${from#src/}")" ] ||
         { [ "$(rank "${to#src/}")" = 2 ] && [ "$to" != "$from" ]; }; then
        echo "$f ($from) includes $h from the layer above or beside it ($to)"; bad=1
      fi ;;
    *) [ "$to" = tests ] || [ "$to" = unknown ] && { echo "$f includes $h from $to"; bad=1; } ;;
    esac
  done
done
[ $bad = 0 ] && echo "ok: common, core < bootstrap < cpu, gpu < api; ref/ and tools/ use nothing of tests/"
exit $bad
