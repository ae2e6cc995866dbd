#!/usr/bin/env bash
# Run every GPU-marked test in the repository, a CUDA-graph capture/replay check of the
# Triton attention, then the KV-write, attention and engine benchmarks if present.
# Usage: scripts/gpu_checks.sh   (from anywhere; uses .venv/bin/python when it exists)
# With $OUT set, results go under it: pytest.txt, junit.xml, attention_graph.txt,
# bench_kv_write.json, bench_attention.json, bench_engine.json, conformance.json,
# nvidia-smi.txt.
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
[ -x .venv/bin/python ] && PYTHON=.venv/bin/python
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-}"
[ -n "$OUT_DIR" ] && mkdir -p "$OUT_DIR"

save() {  # save NAME: tee stdin to $OUT/NAME when $OUT is set
    if [ -n "$OUT_DIR" ]; then tee "$OUT_DIR/$1"; else cat; fi
}

status=0
{ nvidia-smi || rocm-smi || true; } 2>&1 | save nvidia-smi.txt >/dev/null
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda available:', torch.cuda.is_available())" 2>&1 | save env.txt

junit=()
[ -n "$OUT_DIR" ] && junit=(--junitxml "$OUT_DIR/junit.xml")
"$PYTHON" -m pytest -m gpu -q -rA -p no:cacheprovider "${junit[@]}" tests 2>&1 | save pytest.txt
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# the Triton attention forward captured in a CUDA graph and replayed on a new step
if [ -f tests/attention/test_gpu.py ]; then
    "$PYTHON" -m pytest -q -rA -p no:cacheprovider tests/attention/test_gpu.py \
        -k "cuda_graph or synchronises" 2>&1 | save attention_graph.txt
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -f benchmarks/bench_kv_write.py ]; then
    "$PYTHON" benchmarks/bench_kv_write.py 2>&1 | save bench_kv_write.json
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

# exits 1 when its own CUDA-graph replay differs from an eager forward
if [ -f benchmarks/bench_attention.py ]; then
    "$PYTHON" benchmarks/bench_attention.py 2>&1 | save bench_attention.json
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

# tiny_engine on the GPU (piecewise compilation, real CUDA graphs, Triton attention)
# against transformers' generate() on the GPU
if [ -f benchmarks/bench_engine.py ]; then
    "$PYTHON" benchmarks/bench_engine.py --device cuda 2>&1 | save bench_engine.json
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

# the conformance kit on the real GPU (exits 1 when a check fails)
"$PYTHON" -m hwplug conformance cuda --json | save conformance.json; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "gpu_checks: exit status $status" | save status.txt
exit "$status"
