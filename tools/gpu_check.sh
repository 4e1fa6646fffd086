#!/usr/bin/env bash
# The GPU checks in one command: what users run, on one GPU, within a time budget, results in one folder.
#
#   bash tools/gpu_check.sh wheels [DIR]   here, with pip access: what a GPU image with torch, timm, OpenCV and
#                                           pytest lacks, into DIR (default .whl): the mmcv 2.1.0 sdist (built with
#                                           its CUDA ops on the GPU machine), wheels of mmengine 0.10.7, mmdet 3.3.0,
#                                           mmsegmentation 1.2.2 and their dependencies for CPython 3.12 x86-64
#   bash tools/gpu_check.sh run [--device cpu] [--quick] [--budget SECONDS] [--skip STEP,...]
#                                           on the GPU machine, from the repository root, in this order, each step
#                                           limited so that all of them end within the budget (default 540 s) and
#                                           the later ones keep the time they need:
#     0. the training steps of ReViT-B and ReMViTv2-T (their presets) at 1333x800, batch 2, bf16, on the fused and
#        on the reference residual attention (fused_attn=True / False), each beside the cost model's estimate
#        (tools/analysis/benchmark.py, then tools/analysis/roofline.py --beside)
#     1. mmcv with its CUDA ops: from a wheel carried in .gpu_build/wheels (built elsewhere for the machine's
#        Python, torch and CUDA; ignored by git), installed in seconds where its ops load; else built from
#        .whl/mmcv-2.1.0.tar.gz for the visible GPU's architecture with MAX_JOBS = cores (minutes), the time printed
#     2. Mask R-CNN + ReSwin-T (configs/mask_rcnn_reswin_t_3x.py --demo) trained for 200 iterations with its AMP,
#        then tools/analysis/train_check.py: loss fell, no non-finite loss, max_memory_allocated, iterations/s
#     3. one training step of every dense config of the T presets at its recipe's training size and per-GPU batch
#        (tools/analysis/config_memory.py --per-gpu-step): max_memory_allocated and the time per iteration, each
#        beside its row of the memory table (docs/config_memory.json)
#     4. the T-preset backbone benchmark beside timm's Swin-T (tools/analysis/benchmark.py --suite t-presets), then
#        the cost model's estimate beside each measured train step (tools/analysis/roofline.py --beside)
#     5. the CUDA tests (pytest tests/test_cuda.py -m cuda), FAN-ViT-T's CUDA-against-CPU test first
#     6. where time is left, RMT/EVT's decay mask + SDPA against FlexAttention (tools/analysis/decay_attention.py)
#   Everything goes to $OUT (where set) or work_dirs/gpu_check: env.txt, residual_{fused,reference}.json and
#   residual_{fused,reference}_beside.json, mmcv_build.log, cuda_tests.log/.xml,
#   train.log, train_check.json, dense_steps.json, benchmark.json/.md/.log, roofline_beside.json,
#   decay_attention.json.
#   --skip residual,build,train,dense,bench,tests,decay leaves those steps out (without an mmcv with CUDA ops, the steps
#   that need none take mmcv's Python code from the sdist).
#   --device cpu rehearses every step on the CPU (no build; the CUDA tests skip; 20 iterations; the dense steps at
#   128x128 for two presets; the benchmarks at 224x320) to check the script itself; --quick shortens either run
#   (GPU: 50 iterations, the dense steps of two presets, fewer benchmark passes; CPU: 4 iterations, the steps of
#   ReSwin-T's Mask R-CNN and UperNet configs at 64x64, one pass at 64x96).
#
# GPU_CHECK_PYTHON picks the interpreter (default: python3). docs/benchmarks.md ("On a GPU") has the procedure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${GPU_CHECK_PYTHON:-python3}
# absolute, so that it still names the same interpreter after a cd (a venv's python is known by its path)
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac

wheels() {
  local dir=${1:-.whl}
  local pip=("$py" -m pip --disable-pip-version-check)
  mkdir -p "$dir"
  local target=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
  # what mmengine, mmdet and mmsegmentation import beyond the GPU image (torch, timm, numpy, scipy, matplotlib,
  # OpenCV, pyyaml, rich, tqdm, pytest are there)
  # setuptools < 82: mmcv 2.1.0's setup.py imports pkg_resources, which 82 removed
  "${pip[@]}" download -q --no-deps "${target[@]}" -d "$dir" mmengine==0.10.7 mmdet==3.3.0 mmsegmentation==1.2.2 \
    addict yapf termcolor platformdirs terminaltables pycocotools shapely ftfy wcwidth regex prettytable \
    'setuptools<82'
  "${pip[@]}" download -q --no-deps --no-binary :all: --no-build-isolation mmcv==2.1.0 -d "$dir"
  ls -l "$dir"
  du -sh "$dir"
}

# the seconds a step may take: at most $1, keeping $2 (default 0) of the budget for the steps after it, and at
# least 1 (timeout 0 would mean no limit at all)
left() {
  local remaining=$((deadline - SECONDS - ${2:-0}))
  [ "$remaining" -lt 1 ] && remaining=1
  [ "$remaining" -lt "$1" ] && echo "$remaining" || echo "$1"
}

# whether a step of run was not --skip'ped
want() {
  [[ $skip != *",$1,"* ]]
}

# the seconds the steps named, those not skipped, need at least: what a step before them leaves of the budget
declare -A NEEDS=([build]=60 [train]=100 [dense]=60 [bench]=90 [tests]=60)
need() {
  local total=0 step
  for step in "$@"; do
    want "$step" && total=$((total + ${NEEDS[$step]:-0}))
  done
  echo "$total"
}

# exits 0 where the mmcv that imports was built with CUDA ops
HAS_OPS='from mmcv.ops import get_compiling_cuda_version as v; import sys; sys.exit(v() in ("", "not available"))'

# mmcv's Python code (no compiled ops) from the sdist, for what runs while the build does: prints the folder to put
# on PYTHONPATH, or nothing where an mmcv imports already
mmcv_python() {
  "$py" -c 'import mmcv' 2>/dev/null && return 0
  local dir=.gpu_build/python
  [ -d "$dir/mmcv-2.1.0/mmcv" ] || { mkdir -p "$dir" && tar -xzf .whl/mmcv-2.1.0.tar.gz -C "$dir" mmcv-2.1.0/mmcv; }
  echo "$PWD/$dir/mmcv-2.1.0"
}

build_mmcv() {
  local out=$1 sdist=.whl/mmcv-2.1.0.tar.gz build=.gpu_build
  if "$py" -c "$HAS_OPS" 2>/dev/null; then
    echo "mmcv with CUDA ops is installed: no build" | tee "$out/mmcv_build.log"
    return 0
  fi
  : >"$out/mmcv_build.log"
  local whl
  # a wheel built by an earlier call on this machine, or carried in .gpu_build/wheels (built elsewhere for this
  # machine's Python, torch and CUDA: docs/benchmarks.md says how): used where its ops load here, else built again
  whl=$(ls "$build"/wheels/mmcv-2.1.0-*.whl 2>/dev/null | head -n1 || true)
  if [ -n "$whl" ]; then
    if "$py" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site "$whl" \
        >>"$out/mmcv_build.log" 2>&1 && "$py" -c "$HAS_OPS" >>"$out/mmcv_build.log" 2>&1; then
      echo "mmcv with CUDA ops from $whl: no build" | tee -a "$out/mmcv_build.log"
      return 0
    fi
    echo "$whl does not load here (another Python, torch or CUDA): building" | tee -a "$out/mmcv_build.log"
    rm -rf /tmp/site/mmcv /tmp/site/mmcv-2.1.0.dist-info "$whl"
  fi
  [ -f "$sdist" ] || { echo "no $sdist: run 'bash tools/gpu_check.sh wheels' first" >&2; return 1; }
  local arch jobs start=$SECONDS
  arch=$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
  jobs=$(nproc)
  rm -rf "$build/src"
  mkdir -p "$build/src" "$build/wheels"
  tar -xzf "$sdist" -C "$build/src"
  # torch >= 2.14 headers refuse anything older than C++20
  sed -i 's/-std=c++17/-std=c++20/g' "$build/src/mmcv-2.1.0/setup.py"
  echo "building mmcv 2.1.0 with CUDA ops for $arch, MAX_JOBS=$jobs" | tee -a "$out/mmcv_build.log"
  # the CUDA libraries' headers of torch's pip wheels, for a toolkit installed without them
  local includes
  includes=$("$py" -c 'import sys; sys.path.insert(0, "tools"); import setup_plan; print(":".join(setup_plan.nvidia_include_dirs()))')
  (cd "$build/src/mmcv-2.1.0" && CPATH=$includes${CPATH:+:$CPATH} FORCE_CUDA=1 MMCV_WITH_OPS=1 \
    TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=$jobs \
    timeout "$(left 420 "$(need train dense bench tests)")" "$py" -m pip wheel -q --no-deps --no-build-isolation . -w "$PWD/../../wheels") \
    >>"$out/mmcv_build.log" 2>&1 || {
      echo "the mmcv build stopped after $((SECONDS - start)) s (exit status $?; 124: out of its time)" |
        tee -a "$out/mmcv_build.log"
      tail -20 "$out/mmcv_build.log"
      return 1
    }
  echo "mmcv built in $((SECONDS - start)) s" | tee -a "$out/mmcv_build.log"
  whl=$(ls "$build"/wheels/mmcv-2.1.0-*.whl | head -n1)
  "$py" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site "$whl"
}

run() {
  local device=cuda quick=0 budget=540 skip=,
  while [ $# -gt 0 ]; do
    case $1 in
      --device) device=$2; shift 2 ;;
      --quick) quick=1; shift ;;
      --budget) budget=$2; shift 2 ;;
      --skip) skip=",$2,"; shift 2 ;;
      *) echo "gpu_check.sh run: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  deadline=$((SECONDS + budget))
  local out=${OUT:-work_dirs/gpu_check}
  mkdir -p "$out"
  # the carried wheels are for the GPU image's Python; a CPU rehearsal uses the environment as it is
  if [ "$device" != cpu ] && compgen -G '.whl/*.whl' >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  {
    date -u
    if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo 'nvidia-smi: not available'; fi
    "$py" -c 'import sys, torch, timm, mmengine
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| timm", timm.__version__, "| mmengine", mmengine.__version__)
print("gpu:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible")'
  } >"$out/env.txt" 2>&1
  cat "$out/env.txt"

  local status=0
  # where no mmcv is installed, its Python code from the sdist: the backbone steps need no compiled op (a built
  # mmcv in /tmp/site comes first on the path)
  local mmcv_dir
  mmcv_dir=$([ -f .whl/mmcv-2.1.0.tar.gz ] && mmcv_python || true)
  export PYTHONPATH=$PYTHONPATH${mmcv_dir:+:$mmcv_dir}
  # first: the residual attention's two paths where the cost model says the family's time goes
  if want residual; then
    local residual=(--backbone revit_b --compare remvit_t --measure train --device "$device")
    if [ "$device" = cpu ]; then
      residual+=(--shape 64 96 --batch-size 1 --dtype float32 --warmup 0 --repeats 1)
    else
      residual+=(--shape 800 1333 --batch-size 2 --dtype bf16 --warmup 2 --repeats 5 --memory-steps 1)
    fi
    for path in fused reference; do
      local fused=True
      [ "$path" = reference ] && fused=False
      timeout "$(left 90 "$(need build train dense bench tests)")" "$py" tools/analysis/benchmark.py "${residual[@]}" \
        --backbone-options "fused_attn=$fused" --out "$out/residual_$path.json" 2>&1 | tail -n 12 || status=1
      [ -f "$out/residual_$path.json" ] && { timeout "$(left 60 "$(need build train dense bench tests)")" "$py" \
        tools/analysis/roofline.py --beside "$out/residual_$path.json" --out "$out/residual_${path}_beside.json" \
        2>&1 | tail -n 4 || status=1; }
    done
  fi
  if [ "$device" != cpu ] && want build; then
    build_mmcv "$out" || status=1
  fi
  if [ "$device" != cpu ] && ! "$py" -c "$HAS_OPS" 2>/dev/null; then
    echo "gpu_check: no mmcv with CUDA ops; the detector steps cannot run" >&2
  fi

  local iters=200 val_images=50 steps=3 presets=(reswin_t rmt_t evt_swin_t fan_hybrid_t shunted_t remvit_t evt_t fan_vit_t fan_swin_t revit_b)
  local dense=() bench=(--suite t-presets --device "$device" --out "$out/benchmark.json" --markdown "$out/benchmark.md")
  local decay=(--device "$device" --out "$out/decay_attention.json")
  if [ "$device" = cpu ]; then
    iters=20 presets=(reswin_t rmt_t) dense=(--shape 128 128)
    local shape=(224 320) passes=(--warmup 1 --repeats 3)
    val_images=4 steps=1
    # one detector and one segmentor: Cascade's four-conv heads alone take half a minute a step on two cores
    [ "$quick" = 1 ] && iters=4 presets=() shape=(64 96) passes=(--warmup 0 --repeats 1) \
      dense=(configs/mask_rcnn_reswin_t_1x.py configs/upernet_reswin_t_160k_ade20k.py --shape 64 64)
    bench+=(--shape "${shape[@]}" --batch-size 1 --dtype float32 --measure inference train "${passes[@]}")
    decay+=(--shape "${shape[@]}" --batch-size 1 --dtype float32 --no-compile "${passes[@]}")
  else
    bench+=(--shape 800 1333 --batch-size 2 --dtype bf16 --warmup 2 --repeats 10 --memory-steps 1)
    [ "$quick" = 1 ] && iters=50 presets=(reswin_t rmt_t)
  fi

  # the demo keeps the recipe's AMP on a GPU (float32 on the CPU); evaluated before and after on val_images
  if want train; then
    timeout "$(left 150 "$(need dense bench tests)")" "$py" tools/train.py configs/mask_rcnn_reswin_t_3x.py --demo --work-dir "$out/train" \
      --cfg-options "train_cfg.max_iters=$iters" "val_dataloader.dataset.indices=$val_images" \
      default_hooks.logger.interval=2 >"$out/train.log" 2>&1 || { tail -20 "$out/train.log"; status=1; }
    # on the CPU a few iterations check the script; whether the loss falls is the GPU run's question
    "$py" tools/analysis/train_check.py "$out/train" --window 4 --out "$out/train_check.json" ||
      [ "$device" = cpu ] || status=1
  fi

  if want dense; then
    [ ${#presets[@]} -gt 0 ] && dense=(--all --presets "${presets[@]}" "${dense[@]}")
    timeout "$(left 200 "$(need bench tests)")" "$py" tools/analysis/config_memory.py "${dense[@]}" --per-gpu-step \
      --device "$device" --steps "$steps" --out "$out/dense_steps.json" 2>&1 | tail -n 100 || status=1
  fi

  if want bench; then
    timeout "$(left 120 "$(need tests)")" "$py" tools/analysis/benchmark.py "${bench[@]}" 2>&1 |
      tee "$out/benchmark.log" || status=1
    [ -f "$out/benchmark.json" ] && { timeout "$(left 60 "$(need tests)")" "$py" tools/analysis/roofline.py \
      --beside "$out/benchmark.json" --out "$out/roofline_beside.json" 2>&1 | tail -n 20 || status=1; }
  fi
  # a --basetemp of its own: pytest otherwise prunes the numbered temporary folders of other pytest sessions
  if want tests; then
    local first='tests/test_cuda.py::test_cuda_equals_cpu_t_preset[FANViT-vit_t]'
    ( rc=0
      timeout "$(left 60)" "$py" -m pytest "$first" -m cuda -p no:cacheprovider -v -rs \
        --basetemp "$(mktemp -d)" --junitxml "$out/cuda_tests_first.xml" || rc=1
      timeout "$(left 240)" "$py" -m pytest tests/test_cuda.py -m cuda --deselect "$first" -p no:cacheprovider \
        -v -rs --durations=10 --basetemp "$(mktemp -d)" --junitxml "$out/cuda_tests.xml" || rc=1
      exit $rc ) 2>&1 | tee "$out/cuda_tests.log" || status=1
  fi
  # RMT/EVT's decay mask + SDPA against FlexAttention, where time is left
  if ! want decay; then
    :
  elif [ $((deadline - SECONDS)) -ge 30 ]; then
    timeout "$(left 90)" "$py" tools/analysis/decay_attention.py "${decay[@]}" 2>&1 || status=1
  else
    echo "gpu_check: no time left for tools/analysis/decay_attention.py"
  fi
  echo "gpu_check: results in $out (exit status $status, $SECONDS s)"
  return "$status"
}

case ${1:-} in
  wheels) shift; wheels "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,/^# GPU_CHECK_PYTHON/p' "$0"; exit 2 ;;
esac
