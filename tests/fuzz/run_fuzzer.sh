#!/bin/sh
# Usage: run_fuzzer.sh FUZZER SEEDER ARTIFACT_DIR [libFuzzer flags...]
# Runs the libFuzzer binary FUZZER on a fresh temporary corpus that SEEDER fills, so that the
# source tree is never written to; a crashing input is saved under ARTIFACT_DIR.
set -eu
fuzzer=$1
seeder=$2
artifacts=$3
shift 3
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
"$seeder" "$corpus"
mkdir -p "$artifacts"
"$fuzzer" -artifact_prefix="$artifacts/" "$@" "$corpus"
