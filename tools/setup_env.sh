#!/usr/bin/env bash
# Idempotent environment set-up shared by both Quick-start commands.
#
#   bash tools/setup_env.sh [--user] [--plan]
#     --user   the runtime only: torch (when none is there), mmcv with its compiled ops, mmengine, mmdet,
#              mmsegmentation, mmpretrain, timm and this package; no test, lint, ONNX or robustness tools.
#              On a GPU cluster, in the environment that holds your CUDA torch:
#              MMVISATT_VENV=none bash tools/setup_env.sh --user
#     --plan   print what would be installed and built, and why; change nothing
#
#   MMVISATT_VENV      virtual environment to create/use (default: <repo>/.venv); "none": the current interpreter
#   MMVISATT_CACHE     where built wheels are kept (default: ~/.cache/mmvisatt)
#   PYTHON             interpreter used to create the venv (default: python3)
#   MMVISATT_NEED_GB   free disk (GB) asked for before torch is installed (default: 8)
#   MMVISATT_STACK     the OpenMMLab stack of a new environment: openmmlab (upstream: mmcv 2.1.0 built from its
#                      sdist, mmdet 3.3, mmsegmentation 1.2, mmpretrain 1.2; the default) or onedl (the maintained
#                      fork: onedl-mmcv 2.3.6 built from its sdist, onedl-mmdetection 3.5, ...; Python >= 3.10).
#                      An environment that holds one keeps it.
#   FORCE_CUDA, CUDA_HOME, TORCH_CUDA_ARCH_LIST, MAX_JOBS
#                      the mmcv build: CUDA ops when FORCE_CUDA=1, a visible GPU meets a CUDA torch, or (--user) a
#                      CUDA torch is there; for the visible GPUs or a default list; CUDA_HOME defaults to the toolkit
#                      of the nvcc found (tools/setup_plan.py has the rules)
#
# torch is installed only when none is importable, so GPU users install their own CUDA build first; what is
# installed already and fits the version ranges of requirements/ stays. The plan is made before anything is
# created, installed or built, and whatever would stop the set-up stops it there.
set -euo pipefail

user=0 plan_only=0
for arg in "$@"; do
  case $arg in
    --user) user=1 ;;
    --plan) plan_only=1 ;;
    *) echo "setup_env.sh: unknown argument $arg (expected --user, --plan)" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${MMVISATT_VENV:-$repo/.venv}
cache=${MMVISATT_CACHE:-$HOME/.cache/mmvisatt}

# absolute, so that pip still finds the interpreter (and the wheel cache) after the mmcv build changes directory
case $venv in /* | none) ;; *) venv=$PWD/$venv ;; esac
case $cache in /*) ;; *) cache=$PWD/$cache ;; esac
export MMVISATT_CACHE=$cache

log() { printf '[setup_env] %s\n' "$*" >&2; }

fresh=0
if [ "$venv" != "none" ]; then
  py=$venv/bin/python
  [ -x "$py" ] || fresh=1
else
  py=$(command -v python3 || command -v python)
fi
planner=$repo/tools/setup_plan.py
plan_flags=()
[ "$user" = 1 ] && plan_flags+=(--user)
[ "$fresh" = 1 ] && plan_flags+=(--fresh)
probe() {
  if [ "$fresh" = 1 ]; then
    "${PYTHON:-python3}" "$planner" probe --fresh "$venv"
  else
    "$py" "$planner" probe
  fi
}

if [ "$plan_only" = 1 ]; then
  echo "set-up plan for ${venv/#none/the current interpreter ($py)} (wheel cache $cache):"
  # exits 1 after a stop: line (the set-up would stop there)
  "${PYTHON:-python3}" "$planner" plan - "${plan_flags[@]}" <<<"$(probe)"
  exit $?
fi

# the plan's variables: stack, stack_requirements, mmcv_dist, mmcv_release, mmengine_requirement, install_torch,
# install_torchvision, mmcv (keep | cache | build), mmcv_key, mmcv_wheel, wheel_prefix, force_cuda, arch_list,
# max_jobs, cuda_home, cuda_includes, dev_tools, skip_onnxruntime, plan_error
act_on_plan() {
  stack='' stack_requirements='' mmcv_dist='' mmcv_release='' mmengine_requirement='' install_torch=''
  install_torchvision='' mmcv='' mmcv_key='' mmcv_wheel='' wheel_prefix='' force_cuda='' arch_list='' max_jobs=''
  cuda_home='' cuda_includes='' dev_tools='' skip_onnxruntime='' plan_error=''
  local planner_py=$py
  [ "$fresh" = 1 ] && planner_py=${PYTHON:-python3}
  eval "$(probe | "$planner_py" "$planner" plan - --shell "${plan_flags[@]}")"
  if [ -n "$plan_error" ]; then
    log "$plan_error"
    exit 1
  fi
}
act_on_plan

# A stamp of every input that changes what gets installed (the sources, the mode, the stack and the mmcv target the
# plan chose) makes the second run a quick no-op check; a new target (FORCE_CUDA, an arch list, a GPU) is a new stamp.
mode=$([ "$user" = 1 ] && echo user || echo dev)
stamp_src=$( (cat "$repo"/requirements/*.txt "$repo/setup.py" "$0" "$planner" "$repo/mmvisatt/stack.py";
              echo "$stack $mmcv_key") | sha1sum | cut -c1-16)
stamp_name=.mmvisatt-setup-$mode-$stamp_src
if [ "$fresh" = 0 ]; then
  stamp=$("$py" -c 'import sys; print(sys.prefix)')/$stamp_name
  check='import mmcv.ops, mmdet, mmseg, mmpretrain, timm, mmvisatt'
  [ "$user" = 1 ] || check="$check, pytest"
  if [ -f "$stamp" ] && [ "$mmcv" = keep ] && [ -z "$install_torch$install_torchvision" ] \
      && "$py" -c "$check" 2>/dev/null; then
    log "environment up to date ($py, ${stack} stack)"
    exit 0
  fi
fi

created=$fresh
if [ "$fresh" = 1 ]; then
  log "creating virtual environment $venv"
  "${PYTHON:-python3}" -m venv "$venv"
  fresh=0  # from here on the probe reads the new environment
fi
pip=("$py" -m pip --disable-pip-version-check)

if [ "$created" = 1 ] || [ "$mmcv" = build ]; then
  "${pip[@]}" install -q -r "$repo/requirements/build.txt"
fi
if [ "$install_torch" = 1 ]; then
  log "no torch found: installing torch 2.14.1 + torchvision 0.29.1 (for a CUDA build, install it first)"
  "${pip[@]}" install -q torch==2.14.1 torchvision==0.29.1
  act_on_plan  # the mmcv target follows the torch now installed
elif [ -n "$install_torchvision" ]; then
  log "torchvision missing: installing torchvision==$install_torchvision to match torch"
  "${pip[@]}" install -q "torchvision==$install_torchvision"
fi

# upstream mmcv 2.1.0 and onedl-mmcv ship their ops as an sdist: built once per torch version and target, cached
if [ "$mmcv" = build ]; then
  wheels=$cache/wheels/$mmcv_key
  target=$([ "$force_cuda" = 1 ] && echo "CUDA ops for $arch_list" || echo "CPU ops")
  log "building $mmcv_dist $mmcv_release with $target, $max_jobs jobs (the CPU ops took 8-9 minutes on 2 cores;" \
    "cached in $wheels)"
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  # packages installed since the first line may have moved setuptools past 81 (pkg_resources is gone in 82)
  "${pip[@]}" install -q -r "$repo/requirements/build.txt"
  "${pip[@]}" download -q --no-deps --no-build-isolation --no-binary :all: "$mmcv_dist==$mmcv_release" -d "$build"
  tar -xzf "$build"/*.tar.gz -C "$build"
  src=$(ls -d "$build"/*"$mmcv_release"/)
  src=${src%/}
  # torch >= 2.14 headers refuse anything older than C++20
  sed -i 's/-std=c++17/-std=c++20/g' "$src/setup.py"
  mkdir -p "$wheels"
  # the sources setup.py compiles: the C++ ops, and with CUDA the kernels too
  total=$(ls "$src"/mmcv/ops/csrc/pytorch/*.cpp "$src"/mmcv/ops/csrc/pytorch/cpu/*.cpp | wc -l)
  if [ "$force_cuda" = 1 ]; then
    total=$((total + $(ls "$src"/mmcv/ops/csrc/pytorch/cuda/*.cu "$src"/mmcv/ops/csrc/pytorch/cuda/*.cpp | wc -l)))
  fi
  (
    cd "$src"
    export MAX_JOBS=$max_jobs FORCE_CUDA=$force_cuda MMCV_WITH_OPS=1
    if [ "$force_cuda" = 1 ]; then
      # CUDA_HOME: the toolkit itself, not the folder of a wrapper nvcc (torch would look for include/crt there);
      # CPATH: the CUDA libraries' headers that torch's pip wheels carry, for a toolkit installed without them
      export TORCH_CUDA_ARCH_LIST=$arch_list CUDA_HOME=$cuda_home CPATH=$cuda_includes${CPATH:+:$CPATH}
    fi
    "${pip[@]}" wheel -q --no-build-isolation --no-deps . -w "$wheels"
  ) &
  builder=$!
  # a heartbeat once a minute: objects compiled so far (pip builds in the source tree), elapsed and left
  start=$SECONDS
  while kill -0 "$builder" 2>/dev/null; do
    for _ in $(seq 60); do kill -0 "$builder" 2>/dev/null && sleep 1; done
    kill -0 "$builder" 2>/dev/null || break
    done_=$(find "$src/build" -name '*.o' 2>/dev/null | wc -l)
    elapsed=$((SECONDS - start))
    left=''
    if [ "$done_" -gt 0 ] && [ "$done_" -lt "$total" ]; then
      left=", about $(((elapsed * (total - done_) / done_ + 59) / 60)) min left"
    fi
    log "building $mmcv_dist: $done_ / $total objects compiled, $((elapsed / 60)) min $((elapsed % 60)) s$left"
  done
  wait "$builder"
  log "$mmcv_dist built in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
  mmcv_wheel=$(ls "$wheels/$wheel_prefix"*.whl | head -n1)
fi
if [ "$mmcv" != keep ]; then
  # mmcv's own requirements first, mmengine among them, so that no pip step sees an mmcv without them (pip prints
  # a dependency conflict as an ERROR line); opencv-python only where no OpenCV is importable (a cluster's
  # headless build stays)
  deps=(addict packaging Pillow pyyaml yapf "$mmengine_requirement")
  "$py" -c 'import cv2' 2>/dev/null || deps+=(opencv-python)
  "${pip[@]}" install -q "${deps[@]}"
  "${pip[@]}" install -q --force-reinstall --no-deps "$mmcv_wheel"
fi

# the stack's ranges without its mmcv line: mmcv is the plan's (kept, cached or built above), and pip resolving its
# requirements would add opencv-python beside a cluster's headless OpenCV
stack_file=$(mktemp)
grep -v "^$mmcv_dist[<>=]" "$repo/requirements/$stack_requirements" >"$stack_file"
"${pip[@]}" install -q -r "$stack_file" -r "$repo/requirements/runtime.txt"
if [ "$dev_tools" = 1 ]; then
  onnx=$repo/requirements/onnx.txt
  if [ "$skip_onnxruntime" = 1 ]; then
    onnx=$(mktemp)
    grep -v '^onnxruntime' "$repo/requirements/onnx.txt" >"$onnx"
  fi
  "${pip[@]}" install -q -r "$repo/requirements/tests.txt" -r "$repo/requirements/robustness.txt" -r "$onnx"
  # openmim finds upstream's packages by their distribution names; without its dependencies (mim.txt says why)
  [ "$stack" = openmmlab ] && "${pip[@]}" install -q --no-deps -r "$repo/requirements/mim.txt"
fi
"${pip[@]}" install -q --no-deps -e "$repo"

prefix=$("$py" -c 'import sys; print(sys.prefix)')
rm -f "$prefix"/.mmvisatt-setup-*
touch "$prefix/$stamp_name"
log "environment ready ($py, $stack stack)"
