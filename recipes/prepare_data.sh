#!/usr/bin/env bash
# Prepare the DAPO training and validation data in verl's parquet schema, from local copies (nothing is downloaded).
#
#   DAPO_MATH_PARQUET  local copy of BytedTsinghua-SIA/DAPO-Math-17k data/dapo-math-17k.parquet
#   AIME_PARQUET       local AIME 2024 parquet: BytedTsinghua-SIA/AIME-2024 data/aime-2024.parquet,
#                      HuggingFaceH4/aime_2024 or Maxwell-Jia/AIME_2024
#   DATA_DIR           output folder; gets train.parquet, aime-2024.parquet and prepare_data.json
#
# Extra arguments go to `dapo-verl prepare-data`, e.g. --dedup-key uuid, --conflicts drop, --aime-repeat 32.
# Example:
#   DAPO_MATH_PARQUET=~/hf/dapo-math-17k.parquet AIME_PARQUET=~/hf/aime-2024.parquet DATA_DIR=~/data/dapo \
#       bash recipes/prepare_data.sh
set -euo pipefail

fail() {
    echo "prepare_data.sh: $*" >&2
    exit 2
}

require_file() {
    local name=$1
    local value=${!name:-}
    [[ -n "$value" ]] || fail "$name is not set; export $name=/path/to/file.parquet (a local copy)."
    [[ -f "$value" ]] || fail "$name=$value does not exist or is not a file; point it at the local parquet file."
}

require_file DAPO_MATH_PARQUET
require_file AIME_PARQUET
[[ -n "${DATA_DIR:-}" ]] || fail "DATA_DIR is not set; export DATA_DIR=/path/to/output/folder (created if needed)."
command -v dapo-verl >/dev/null \
    || fail "dapo-verl is not on PATH; activate the environment where dapo_verl is installed (pip install -e .)."

dapo-verl prepare-data --dapo-math "$DAPO_MATH_PARQUET" --aime "$AIME_PARQUET" --out "$DATA_DIR" "$@"
