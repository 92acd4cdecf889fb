#!/usr/bin/env bash
# Submit a dapo_verl recipe to a running Ray cluster as a Ray job (ray job submit).
#
#   bash recipes/run_ray.sh CONFIG [--follow] [--dry-run] [HYDRA_ARGS...]
#
#   DAPO_MODEL_PATH  model folder, as seen from every node (shared storage)
#   DAPO_DATA_DIR    the DATA_DIR of recipes/prepare_data.sh, as seen from every node
#   DAPO_OUTPUT_DIR  absolute folder every node can write: checkpoints, and metrics in
#                    $DAPO_OUTPUT_DIR/logs/<trainer.project_name>/<trainer.experiment_name>.jsonl
#   RAY_ADDRESS      the cluster's job server, e.g. http://head:8265 (read by `ray job submit`)
#   DAPO_SUBMISSION_ID  optional: the job's submission id (default dapo-CONFIG-<time>-<random>)
#   DAPO_JOB_ENV     optional: names of more variables of this shell to send with the job, space- or
#                    comma-separated, e.g. DAPO_JOB_ENV="WANDB_API_KEY HF_TOKEN"
#
# dapo_verl must be pip-installed on every node (no working_dir is shipped). The variables above reach the
# driver and every worker through the job's runtime environment, with VERL_USE_EXTERNAL_MODULES as a loud
# fallback for verl's plugin entry point (modules already listed in this shell's VERL_USE_EXTERNAL_MODULES are
# kept after dapo_verl's). The paths are cluster paths, so only their presence is checked here.
#
# Without --follow the job is submitted and the launcher returns (ray job submit --no-wait): follow it with
# `ray job logs -f ID`, see its end with `ray job status ID`. With --follow the launcher streams the job's logs
# until it ends and exits 0 only when it SUCCEEDED (1 when it failed or was stopped); Ctrl-C or SIGTERM stops
# the job (ray job stop) before the launcher exits.
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

modules=dapo_verl.adapter.register
IFS=, read -r -a extra_modules <<<"${VERL_USE_EXTERNAL_MODULES:-}"
for module in "${extra_modules[@]}"; do
    [[ -z "$module" || "$module" == dapo_verl.adapter.register ]] || modules+=",$module"
done
job_env=("DAPO_MODEL_PATH=${DAPO_MODEL_PATH:-}" "DAPO_DATA_DIR=${DAPO_DATA_DIR:-}"
    "DAPO_OUTPUT_DIR=${DAPO_OUTPUT_DIR:-}" "VERL_FILE_LOGGER_ROOT=${DAPO_OUTPUT_DIR:-}/logs"
    "VERL_USE_EXTERNAL_MODULES=$modules")
names=${DAPO_JOB_ENV:-}
read -r -a job_env_names <<<"${names//,/ }"
for name in "${job_env_names[@]}"; do
    if [[ ! "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        PROBLEMS+=("DAPO_JOB_ENV names '$name', which is not a variable name; list names like WANDB_API_KEY.")
    elif [[ -z "${!name+set}" ]]; then
        PROBLEMS+=("DAPO_JOB_ENV names $name, which is not set in this shell; export it or drop it from DAPO_JOB_ENV.")
    else
        job_env+=("$name=${!name}")
    fi
done
runtime_env=$("$PYTHON" -c '
import json, sys
print(json.dumps({"env_vars": dict(arg.split("=", 1) for arg in sys.argv[1:])}))
' "${job_env[@]}")
submission_id=${DAPO_SUBMISSION_ID:-dapo-$CONFIG-$(date +%Y%m%d-%H%M%S)-$RANDOM}
wait_flag=(--no-wait)
if $FOLLOW; then
    wait_flag=()
fi
command=(ray job submit "${wait_flag[@]}" --submission-id "$submission_id" --runtime-env-json "$runtime_env"
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
if ! $FOLLOW; then
    exec "${command[@]}"
fi

# --follow: stream the job to its end; a stop signal stops the job too, then the launcher exits.
# shellcheck disable=SC2329  # called by the traps below
stop_job() {
    trap '' INT TERM HUP
    echo "$LAUNCHER: $1: stopping job $submission_id (ray job stop)" >&2
    ray job stop --no-wait "$submission_id" >/dev/null 2>&1 || true
    [[ -z "${follower:-}" ]] || kill "$follower" 2>/dev/null || true
    exit "$2"
}
trap 'stop_job Ctrl-C 130' INT
trap 'stop_job SIGTERM 143' TERM
trap 'stop_job SIGHUP 129' HUP
"${command[@]}" &
follower=$!
wait "$follower" || true
status=$("$PYTHON" -c '
import sys
from ray.job_submission import JobSubmissionClient
print(JobSubmissionClient().get_job_status(sys.argv[1]).value)
' "$submission_id" 2>/dev/null || echo UNKNOWN)
if [[ "$status" == SUCCEEDED ]]; then
    echo "$LAUNCHER: job $submission_id SUCCEEDED"
    exit 0
fi
echo "$LAUNCHER: job $submission_id ended $status; its log: ray job logs $submission_id" >&2
exit 1
