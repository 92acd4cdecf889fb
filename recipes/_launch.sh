# Shared by run_single_node.sh and run_ray.sh (sourced, not run): arguments, path checks, dry run.
# shellcheck shell=bash
#
# Both launchers take:  CONFIG [--dry-run] [HYDRA_ARGS...]
#   CONFIG       a config in dapo_verl/configs, e.g. dapo_qwen2.5_32b (see README, "Run on a cluster")
#   --follow     (run_ray.sh) wait for the submitted job to end, streaming its logs; exit 0 only if it succeeded
#   --dry-run    print the resolved config (python -m dapo_verl.main --config-name CONFIG ... --cfg job) and
#                the exact command, start nothing. The config is checked as the run checks it (one line per
#                problem; dapo_verl/adapter/preflight.py). Missing paths are reported too: the config is then
#                printed with ${oc.env:...} unresolved. Either problem makes the launcher exit with status 2.
#   HYDRA_ARGS   passed to python -m dapo_verl.main as they are, e.g. a multirun:
#                -m actor_rollout_ref.actor.clip_ratio_high=0.2,0.28

PYTHON=${PYTHON:-python3}
CONFIG=""
# shellcheck disable=SC2034  # read by the launchers that source this file
DRY_RUN=false
# shellcheck disable=SC2034  # read by the launchers that source this file
FOLLOW=false
HYDRA_ARGS=()
PROBLEMS=()
UNSET=()

launch_fail() {
    echo "$LAUNCHER: $*" >&2
    exit 2
}

parse_launch_args() {
    local arg
    for arg in "$@"; do
        if [[ "$arg" == "--dry-run" ]]; then
            # shellcheck disable=SC2034  # read by the launchers that source this file
            DRY_RUN=true
        elif [[ "$arg" == "--follow" ]]; then
            FOLLOW=true
        elif [[ -z "$CONFIG" && "$arg" != -* && "$arg" != *=* ]]; then
            CONFIG=$arg
        else
            HYDRA_ARGS+=("$arg")
        fi
    done
    [[ -n "$CONFIG" ]] || launch_fail "no config named. Usage: $LAUNCHER CONFIG [--dry-run] [HYDRA_ARGS...]," \
        "e.g. $LAUNCHER dapo_qwen2.5_math_1.5b --dry-run (configs: dapo_verl/configs/*.yaml)"
    if $FOLLOW && [[ "$LAUNCHER" != run_ray.sh ]]; then
        launch_fail "--follow is run_ray.sh's (it waits for a submitted Ray job); $LAUNCHER already runs in the" \
            "foreground until training ends."
    fi
}

# require_var NAME HINT: NAME must be set and non-empty.
require_var() {
    local name=$1 hint=$2
    if [[ -z "${!name:-}" ]]; then
        UNSET+=("$name")
        PROBLEMS+=("$name is not set; export $name=$hint.")
    fi
}

# require_path NAME PATH KIND WHAT: PATH (derived from variable NAME) must exist as a file (-f) or directory (-d).
require_path() {
    local name=$1 path=$2 kind=$3 what=$4
    [[ -n "${!name:-}" ]] || return 0
    if ! test "$kind" "$path"; then
        PROBLEMS+=("$name=${!name}: $path does not exist; $what.")
    fi
}

# shell_join WORD...: the words as one command line a shell reads back the same (quoted only where needed).
shell_join() {
    local word out=()
    for word in "$@"; do
        if [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
            out+=("$word")
        else
            out+=("${word@Q}")
        fi
    done
    echo "${out[*]}"
}

report_problems() {
    local problem
    for problem in "${PROBLEMS[@]}"; do
        echo "$LAUNCHER: $problem" >&2
    done
}

# The jobs a multirun (-m/--multirun) would start, one shell-quoted Hydra argument list per line, expanded by
# Hydra's own basic sweeper so the dry run shows every arm; a plain run is one job.
hydra_jobs() {
    local multirun=false arg overrides=()
    for arg in "${HYDRA_ARGS[@]}"; do
        case "$arg" in
            -m | --multirun) multirun=true ;;
            *) overrides+=("$arg") ;;
        esac
    done
    "$PYTHON" -c '
import shlex, sys
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

overrides = OverridesParser.create().parse_overrides(sys.argv[2:])
jobs = BasicSweeper.split_arguments(overrides, None)[0] if sys.argv[1] == "true" else [sys.argv[2:]]
for job in jobs:
    print(shlex.join(job))
' "$multirun" "${overrides[@]}"
}

# Print the config of every job: resolved when every path variable is set, else with ${oc.env:...} as written.
print_configs() {
    local resolve=() line job jobs
    ((${#UNSET[@]} > 0)) || resolve=(--resolve)
    jobs=$(hydra_jobs)
    while IFS= read -r line; do
        eval "job=($line)"
        echo "# Config: $(shell_join "$PYTHON" -m dapo_verl.main --config-name "$CONFIG" "${job[@]}" --cfg job "${resolve[@]}")"
        if ! "$PYTHON" -m dapo_verl.main --config-name "$CONFIG" "${job[@]}" --cfg job "${resolve[@]}"; then
            PROBLEMS+=("the config ${CONFIG} ${job[*]} would be refused at start-up; the lines above say why.")
        fi
    done <<<"$jobs"
}

# dry_run_and_exit COMMAND...: the dry run: configs, the command, the problems; exits 0, or 2 on a problem.
dry_run_and_exit() {
    print_configs
    echo "# Command:"
    shell_join "$@"
    if ((${#PROBLEMS[@]} > 0)); then
        report_problems
        exit 2
    fi
    exit 0
}
