#!/usr/bin/env bash
# The GPU checks in one command: the CUDA tests (pytest -m cuda) and the T-preset benchmark, results in one folder.
#
#   bash tools/gpu_check.sh wheels [DIR]   on a machine with the project's set-up and pip access: the packages a
#                                           GPU image with torch, timm and opencv but no OpenMMLab lacks, as wheels
#                                           in DIR (default .whl): mmengine 0.10.7, mmcv 2.1.0 built without its ops
#                                           (MMCV_WITH_OPS=0: pure Python, enough for the backbones) and their small
#                                           pure-Python dependencies
#   bash tools/gpu_check.sh run [--device cpu] [--quick]
#                                           on the GPU machine, from the repository root: installs the wheels of
#                                           .whl (if any) into /tmp/site with pip --no-index, then runs
#                                           pytest tests/test_cuda.py -m cuda,
#                                           tools/analysis/benchmark.py --suite t-presets (1333x800, batch 2, bf16)
#                                           and tools/analysis/decay_attention.py (the same setting);
#                                           everything is written to $OUT (where set) or work_dirs/gpu_check:
#                                           env.txt, cuda_tests.log, cuda_tests.xml, benchmark.json, benchmark.md,
#                                           benchmark.log, decay_attention.json (RMT/EVT decay mask + SDPA
#                                           against FlexAttention). --device cpu runs the same steps on the CPU
#                                           (the CUDA tests skip, the benchmarks run at 224x320 in float32 without
#                                           memory passes, flex uncompiled) to check the script itself; --quick
#                                           benchmarks fewer passes (on the CPU: one, at 64x96).
#
# GPU_CHECK_PYTHON picks the interpreter (default: python3). docs/benchmarks.md ("On a GPU") has the whole
# procedure and the measured table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${GPU_CHECK_PYTHON:-python3}
# absolute, so that it still names the same interpreter after a cd (a venv's python is known by its path)
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac

wheels() {
  local dir=${1:-.whl}
  local pip=("$py" -m pip --disable-pip-version-check)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local build
  build=$(mktemp -d)
  trap 'rm -rf "$build"' RETURN
  # pure-Python wheels, so any interpreter and platform takes them
  "${pip[@]}" download -q --no-deps --only-binary=:all: -d "$dir" mmengine==0.10.7 addict termcolor yapf platformdirs
  "${pip[@]}" download -q --no-deps --no-binary :all: --no-build-isolation mmcv==2.1.0 -d "$build"
  tar -xzf "$build"/mmcv-2.1.0.tar.gz -C "$build"
  (cd "$build/mmcv-2.1.0" && MMCV_WITH_OPS=0 "${pip[@]}" wheel -q --no-deps --no-build-isolation . -w "$dir")
  ls -l "$dir"
  du -sh "$dir"
}

run() {
  local device=cuda quick=0
  while [ $# -gt 0 ]; do
    case $1 in
      --device) device=$2; shift 2 ;;
      --quick) quick=1; shift ;;
      *) echo "gpu_check.sh run: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  local out=${OUT:-work_dirs/gpu_check}
  mkdir -p "$out"
  if compgen -G '.whl/*.whl' >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  {
    date -u
    if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo 'nvidia-smi: not available'; fi
    "$py" -c 'import sys, torch, timm, mmengine, mmcv
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| timm", timm.__version__, "| mmengine", mmengine.__version__, "| mmcv", mmcv.__version__)
print("gpu:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible")'
  } >"$out/env.txt" 2>&1
  cat "$out/env.txt"

  # each step has its own limit, so that the whole run ends within 8 minutes whatever one of them does
  local status=0
  # the CUDA tests first: a failure there is the news, so the benchmark runs whatever they say
  # a --basetemp of its own: pytest otherwise prunes the numbered temporary folders of other pytest sessions
  timeout 180 "$py" -m pytest tests/test_cuda.py -m cuda -p no:cacheprovider -q -rs --durations=15 \
    --basetemp "$(mktemp -d)" --junitxml "$out/cuda_tests.xml" 2>&1 | tee "$out/cuda_tests.log" || status=$?

  local bench=(--suite t-presets --device "$device" --out "$out/benchmark.json" --markdown "$out/benchmark.md")
  # on the CPU a smaller input, no memory passes (each is a subprocess there); --quick: the least that runs it all
  local cpu_shape=(224 320) passes=(--warmup 1 --repeats 3)
  [ "$quick" = 1 ] && cpu_shape=(64 96) passes=(--warmup 0 --repeats 1)
  if [ "$device" = cpu ]; then
    bench+=(--shape "${cpu_shape[@]}" --batch-size 1 --dtype float32 --measure inference train "${passes[@]}")
  else
    bench+=(--shape 800 1333 --batch-size 2 --dtype bf16)
    [ "$quick" = 1 ] && bench+=(--warmup 2 --repeats 10 --memory-steps 1)
  fi
  timeout 150 "$py" tools/analysis/benchmark.py "${bench[@]}" 2>&1 | tee "$out/benchmark.log" || status=$?

  local decay=(--device "$device" --out "$out/decay_attention.json")
  if [ "$device" = cpu ]; then
    decay+=(--shape "${cpu_shape[@]}" --batch-size 1 --dtype float32 --no-compile "${passes[@]}")
  fi
  timeout 120 "$py" tools/analysis/decay_attention.py "${decay[@]}" 2>&1 || status=$?
  echo "gpu_check: results in $out (exit status $status)"
  return "$status"
}

case ${1:-} in
  wheels) shift; wheels "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,26p' "$0"; exit 2 ;;
esac
