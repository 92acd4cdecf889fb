#!/usr/bin/env bash
# Submit a dapo_verl recipe to a running Ray cluster as a Ray job (ray job submit).
#
#   bash recipes/run_ray.sh CONFIG [--dry-run] [HYDRA_ARGS...]
#
#   DAPO_MODEL_PATH  model folder, as seen from every node (shared storage)
#   DAPO_DATA_DIR    the DATA_DIR of recipes/prepare_data.sh, as seen from every node
#   DAPO_OUTPUT_DIR  absolute folder every node can write: checkpoints, and metrics in
#                    $DAPO_OUTPUT_DIR/logs/<trainer.project_name>/<trainer.experiment_name>.jsonl
#   RAY_ADDRESS      the cluster's job server, e.g. http://head:8265 (read by `ray job submit`)
#
# dapo_verl must be pip-installed on every node (no working_dir is shipped). The variables above reach the
# driver and every worker through the job's runtime environment, with VERL_USE_EXTERNAL_MODULES as a loud
# fallback for verl's plugin entry point. The paths are cluster paths, so only their presence is checked here.
# --dry-run prints the resolved config and the command and starts nothing; it needs dapo_verl on this machine
# (see recipes/_launch.sh).
# Example:
#   bash recipes/run_ray.sh dapo_qwen2.5_32b --dry-run
set -euo pipefail

LAUNCHER=run_ray.sh
# shellcheck source=_launch.sh source-path=SCRIPTDIR disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
parse_launch_args "$@"

require_var DAPO_MODEL_PATH "/shared/path/to/model (the model folder on the cluster)"
require_var DAPO_DATA_DIR "/shared/path/to/data (recipes/prepare_data.sh's DATA_DIR on the cluster)"
require_var DAPO_OUTPUT_DIR "/shared/path/to/runs (an absolute folder every node can write)"
if [[ -n "${DAPO_OUTPUT_DIR:-}" && "$DAPO_OUTPUT_DIR" != /* ]]; then
    PROBLEMS+=("DAPO_OUTPUT_DIR=$DAPO_OUTPUT_DIR is relative, but training runs on a cluster node; make it absolute.")
fi

runtime_env=$("$PYTHON" -c '
import json, sys
print(json.dumps({"env_vars": dict(arg.split("=", 1) for arg in sys.argv[1:])}))
' "DAPO_MODEL_PATH=${DAPO_MODEL_PATH:-}" "DAPO_DATA_DIR=${DAPO_DATA_DIR:-}" "DAPO_OUTPUT_DIR=${DAPO_OUTPUT_DIR:-}" \
    "VERL_FILE_LOGGER_ROOT=${DAPO_OUTPUT_DIR:-}/logs" VERL_USE_EXTERNAL_MODULES=dapo_verl.adapter.register)
command=(ray job submit --no-wait --runtime-env-json "$runtime_env"
    -- python3 -m dapo_verl.main --config-name "$CONFIG" "${HYDRA_ARGS[@]}")

if $DRY_RUN; then
    dry_run_and_exit "${command[@]}"
fi
if ((${#PROBLEMS[@]} > 0)); then
    report_problems
    exit 2
fi
command -v ray >/dev/null || launch_fail "ray is not on PATH; activate an environment with 'ray[default]' installed."
echo "$LAUNCHER: $(shell_join "${command[@]}")"
exec "${command[@]}"
