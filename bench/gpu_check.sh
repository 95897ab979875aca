#!/usr/bin/env bash
# The GPU check, in one script, for a machine with a GPU (a lent device machine or your own):
# the gpu test tier, then bench/gpu.py, both unbuffered, with their logs in $OUT (default
# /tmp/flowlab-gpu-check). Wheels in .whl/ (packages that machine lacks, pyzmq and pycparser
# among them) are installed first into /tmp/site. Arguments go to bench/gpu.py (e.g. --quick).
# Exit status: 0 only if both the tests and the benchmark's value checks passed.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flowlab-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}     # a folder of wheels to install first (absent or empty: none)
export PYTHONUNBUFFERED=1
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        || { echo "gpu_check: installing $WHEELS/*.whl failed" | tee "$OUT/summary.log"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi -L 2>&1; "$PY" -c "import sys, numpy, cupy, torch; from cupy.cuda import nccl
print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__,
      'nccl', nccl.get_version() if nccl.available else 'missing', 'gpus', cupy.cuda.runtime.getDeviceCount())" 2>&1
} | tee "$OUT/env.log"
timeout 330 "$PY" -m pytest -p no:nbval -p no:cacheprovider -q -rs -m gpu tests/gpu 2>&1 | tee "$OUT/gpu_tier.log"
tier=${PIPESTATUS[0]}
timeout 250 "$PY" bench/gpu.py "$@" 2>&1 | tee "$OUT/bench_gpu.log"
bench=${PIPESTATUS[0]}
echo "gpu_check: gpu tier exit $tier, bench/gpu.py exit $bench" | tee "$OUT/summary.log"
[ "$tier" -eq 0 ] && [ "$bench" -eq 0 ]
