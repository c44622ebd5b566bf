#!/bin/bash
# bench/device.py on a lent accelerator machine, whose image has its own python3 with JAX for
# the device but neither this project's scikit-learn nor LightGBM: `make device-wheels` puts
# their wheels in .gpu/wheels here first; carry .gpu with the run. Results go to $OUT.
# PIPELINES, BATCHES, PLACEMENTS and BUDGET (seconds) narrow a run.
# BENCH=exactness runs bench/exactness.py instead (what exact decisions cost on the device,
# against the float32 baseline that `make device-baseline` puts in .gpu/baseline; carry .gpu):
# LOWERING (xla), ROUNDS, PIPELINES and BATCHES narrow it.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps --no-index --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site
python3 -c "import lightgbm" 2>/dev/null || { echo "lightgbm does not import: dropped"; rm -rf /tmp/site/lightgbm*; }
python3 -c "import jax, sklearn, numpy, numba; print(jax.__version__, jax.devices(), sklearn.__version__, numpy.__version__, numba.__version__)"
if [ "${BENCH:-device}" = exactness ]; then
  timeout "${BUDGET:-480}" python3 bench/exactness.py --baseline-dir .gpu/baseline \
    --lowering "${LOWERING:-xla}" --rounds "${ROUNDS:-8}" --batches "${BATCHES:-10000,100000}" \
    --pipelines "${PIPELINES:-scaled_gbc,hgb_raw,ct_hgb,lgbm_raw,scaled_rf,scaled_lr}" 2>&1 \
    | grep -v -e FutureWarning -e "warnings.warn" | tee "${OUT:-.}/exactness.txt"
  echo "exit ${PIPESTATUS[0]}"
  exit
fi
timeout "${BUDGET:-480}" python3 bench/device.py --pipelines "${PIPELINES:-e,b,a,d,i,f,g,j,c}" \
  --batches "${BATCHES:-1,100,10000,100000}" --rounds 3 --min-time 0.03 \
  --placements "${PLACEMENTS:-device,auto}" --out "${OUT:-.}/device.jsonl" 2>&1 \
  | grep -v -e FutureWarning -e "warnings.warn"
echo "exit ${PIPESTATUS[0]}"
