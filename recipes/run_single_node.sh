#!/usr/bin/env bash
# Run a dapo_verl recipe on this machine: Ray starts here and uses this node's GPUs.
#
#   bash recipes/run_single_node.sh CONFIG [--dry-run] [HYDRA_ARGS...]
#
#   DAPO_MODEL_PATH  local Hugging Face model folder, e.g. a Qwen2.5-Math-1.5B snapshot
#   DAPO_DATA_DIR    the DATA_DIR of recipes/prepare_data.sh: train.parquet and aime-2024.parquet
#   DAPO_OUTPUT_DIR  checkpoints and metrics (default: ./runs); metrics go to
#                    $DAPO_OUTPUT_DIR/logs/<trainer.project_name>/<trainer.experiment_name>.jsonl
#   PYTHON           the interpreter with dapo_verl installed (default: python3)
#
# --dry-run prints the resolved config and the command and starts nothing (see recipes/_launch.sh).
# Examples:
#   bash recipes/run_single_node.sh dapo_qwen2.5_math_1.5b --dry-run
#   bash recipes/run_single_node.sh dapo_clip_ablation -m actor_rollout_ref.actor.clip_ratio_high=0.2,0.28
set -euo pipefail

LAUNCHER=run_single_node.sh
# shellcheck source=_launch.sh source-path=SCRIPTDIR disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
parse_launch_args "$@"

require_var DAPO_MODEL_PATH "/path/to/model (a local Hugging Face model folder)"
require_var DAPO_DATA_DIR "/path/to/data (the DATA_DIR given to recipes/prepare_data.sh)"
require_path DAPO_MODEL_PATH "${DAPO_MODEL_PATH:-}" -d "point it at a local model folder"
for file in train.parquet aime-2024.parquet; do
    require_path DAPO_DATA_DIR "${DAPO_DATA_DIR:-}/$file" -f "run recipes/prepare_data.sh with DATA_DIR=\$DAPO_DATA_DIR"
done
DAPO_OUTPUT_DIR=$(realpath -m "${DAPO_OUTPUT_DIR:-runs}")
export DAPO_OUTPUT_DIR

# dapo_verl registers itself through verl's plugin entry point; VERL_USE_EXTERNAL_MODULES imports it loudly too.
command=(env "DAPO_MODEL_PATH=${DAPO_MODEL_PATH:-}" "DAPO_DATA_DIR=${DAPO_DATA_DIR:-}"
    "DAPO_OUTPUT_DIR=$DAPO_OUTPUT_DIR" "VERL_FILE_LOGGER_ROOT=$DAPO_OUTPUT_DIR/logs"
    VERL_USE_EXTERNAL_MODULES=dapo_verl.adapter.register
    "$PYTHON" -m dapo_verl.main --config-name "$CONFIG" "${HYDRA_ARGS[@]}")

if $DRY_RUN; then
    dry_run_and_exit "${command[@]}"
fi
if ((${#PROBLEMS[@]} > 0)); then
    report_problems
    exit 2
fi
echo "$LAUNCHER: $(shell_join "${command[@]}")"
exec "${command[@]}"
