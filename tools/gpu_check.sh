#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (CI has none): the CUDA tests of the device feed and of the SB3
# buffer, then tools/bench_gpu.py and tools/prof_feed.py on one 1M-transition store filled once.
#
#   tools/gpu_check.sh [WHEELS]        # logs under $OUT (default ./gpu_check_out)
#   CAPACITY=20000 DEVICE=cpu tools/gpu_check.sh     # a smoke run of the script itself, without a GPU
#
# WHEELS: a folder of wheels of the dependencies the machine's Python lacks (a machine without a network:
# `pip download --no-deps -d WHEELS zarr numcodecs donfig google-crc32c gymnasium farama-notifications
# stable-baselines3` where there is one), installed into a folder of their own before anything runs.
# Each step's output goes to its own log; a failing step does not stop the ones after it, and the script
# exits with the first failure's status.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu_check_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ $# -ge 1 ]; then
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$1"/*.whl || exit 1
    export PYTHONPATH="$site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
capacity=${CAPACITY:-1000000}
device=${DEVICE:-cuda}
status=0
step() {  # step NAME COMMAND...: run, log to $out/NAME.log, remember the first failure
    echo "== $1"
    local name=$1
    shift
    "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.log"
step tests python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/integrations/test_device_feed.py \
    tests/integrations/test_sb3.py -k "cuda or test_device_feed"
store=$(mktemp -d)/store
step fill python3 -c "
import sys
sys.path.insert(0, 'tools')
from _report import fill_reference, settle
fill_reference(sys.argv[1], int(sys.argv[2]))
settle()
" "$store" "$capacity"
step bench_gpu python3 tools/bench_gpu.py --device "$device" --store "$store" --rounds 3 --seconds 3 --no-write
if [ "$device" = cuda ]; then
    step prof_feed python3 tools/prof_feed.py --store "$store"
else
    step prof_feed python3 tools/prof_feed.py --store "$store" --device meta --batches 300
fi
rm -rf "$(dirname "$store")"
exit $status
