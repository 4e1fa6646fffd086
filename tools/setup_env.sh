#!/usr/bin/env bash
# Idempotent environment set-up shared by both Quick-start commands.
#
#   MMVISATT_VENV      virtual environment to create/use (default: <repo>/.venv); set to "none" to install
#                      into the current interpreter instead (e.g. an existing conda env with CUDA torch)
#   MMVISATT_CACHE     where built wheels are kept (default: ~/.cache/mmvisatt)
#   PYTHON             interpreter used to create the venv (default: python3)
#   MMVISATT_NEED_GB   free disk (GB) asked for before torch is installed (default: 8)
#
# torch is installed only when none is importable, so GPU users install their own CUDA build first.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${MMVISATT_VENV:-$repo/.venv}
cache=${MMVISATT_CACHE:-$HOME/.cache/mmvisatt}

# absolute, so that pip still finds the interpreter (and the wheel cache) after the mmcv build changes directory
case $venv in /* | none) ;; *) venv=$PWD/$venv ;; esac
case $cache in /*) ;; *) cache=$PWD/$cache ;; esac

log() { printf '[setup_env] %s\n' "$*" >&2; }

if [ "$venv" != "none" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    log "creating virtual environment $venv"
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  py=$venv/bin/python
else
  py=$(command -v python3 || command -v python)
fi
pip=("$py" -m pip --disable-pip-version-check)

# A stamp of every input that changes what gets installed makes the second run a quick no-op check.
stamp_src=$(cat "$repo"/requirements/*.txt "$repo/setup.py" "$0" | sha1sum | cut -c1-16)
stamp=$("$py" -c 'import sys; print(sys.prefix)')/.mmvisatt-setup-$stamp_src
if [ -f "$stamp" ] && "$py" -c 'import mmcv.ops, mmdet, mmseg, mmpretrain, timm, mmvisatt' 2>/dev/null; then
  log "environment up to date ($py)"
  exit 0
fi

# probed once: installing requirements/build.txt below does not change it
has_torch=yes
"$py" -c 'import torch' 2>/dev/null || has_torch=no
if [ "$has_torch" = no ]; then
  # the venv measured 6.7 GB with torch's CUDA build: refuse before pip runs out of space half-way through
  prefix=$("$py" -c 'import sys; print(sys.prefix)')
  free_gb=$(df -Pk "$prefix" | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free_gb" -lt "${MMVISATT_NEED_GB:-8}" ]; then
    log "only $free_gb GB free on the disk of $prefix: torch 2.14.1 (a CUDA build with its libraries) and the rest" \
      "of the stack take about 7 GB. Free some space, or point MMVISATT_VENV at a larger disk."
    exit 1
  fi
fi

"${pip[@]}" install -q -r "$repo/requirements/build.txt"

if [ "$has_torch" = no ]; then
  log "no torch found: installing torch 2.14.1 + torchvision 0.29.1 (for a CUDA build, install it first)"
  "${pip[@]}" install -q torch==2.14.1 torchvision==0.29.1
fi
if ! "$py" -c 'import torchvision' 2>/dev/null; then
  tv=$("$py" -c 'import torch; v=torch.__version__.split("+")[0].split("."); print("0.%d.%s" % (int(v[1]) + 15, v[2]))')
  log "torchvision missing: installing torchvision==$tv to match torch"
  "${pip[@]}" install -q "torchvision==$tv"
fi

# mmcv 2.1.0 ships only an sdist; wheels are cached per torch version and CUDA availability.
key=$("$py" -c 'import torch; print("torch%s-%s" % (torch.__version__.split("+")[0], ("cu" + torch.version.cuda.replace(".", "")) if torch.cuda.is_available() and torch.version.cuda else "cpu"))')
wheels=$cache/wheels/$key
"${pip[@]}" install -q "mmengine==0.10.7"
if ! "$py" -c 'import mmcv, mmcv.ops, sys; sys.exit(mmcv.__version__ != "2.1.0")' 2>/dev/null; then
  whl=$(ls "$wheels"/mmcv-2.1.0-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    log "building mmcv 2.1.0 for $key (about 30 minutes on 2 cores; cached in $wheels)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    # packages installed since the first line may have moved setuptools past 81 (pkg_resources is gone in 82)
    "${pip[@]}" install -q -r "$repo/requirements/build.txt"
    "${pip[@]}" download -q --no-deps --no-build-isolation --no-binary :all: mmcv==2.1.0 -d "$build"
    tar -xzf "$build"/mmcv-2.1.0.tar.gz -C "$build"
    # torch >= 2.14 headers refuse anything older than C++20
    sed -i 's/-std=c++17/-std=c++20/g' "$build/mmcv-2.1.0/setup.py"
    mkdir -p "$wheels"
    src=$build/mmcv-2.1.0
    # the sources setup.py compiles: the C++ ops, and with CUDA the kernels too
    total=$(ls "$src"/mmcv/ops/csrc/pytorch/*.cpp "$src"/mmcv/ops/csrc/pytorch/cpu/*.cpp | wc -l)
    case $key in
      *-cu*) total=$((total + $(ls "$src"/mmcv/ops/csrc/pytorch/cuda/*.cu "$src"/mmcv/ops/csrc/pytorch/cuda/*.cpp |
                                wc -l))) ;;
    esac
    (cd "$src" && MAX_JOBS=${MAX_JOBS:-$(nproc)} "${pip[@]}" wheel -q --no-build-isolation --no-deps . -w "$wheels") &
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
      log "building mmcv: $done_ / $total objects compiled, $((elapsed / 60)) min $((elapsed % 60)) s$left"
    done
    wait "$builder"
    whl=$(ls "$wheels"/mmcv-2.1.0-*.whl | head -n1)
  fi
  "${pip[@]}" install -q --force-reinstall --no-deps "$whl"
  "${pip[@]}" install -q -r <("$py" -c 'import sys; print("addict\npackaging\nPillow\npyyaml\nyapf\nopencv-python")')
fi

"${pip[@]}" install -q -r "$repo/requirements/mminstall.txt" -r "$repo/requirements/runtime.txt" \
  -r "$repo/requirements/tests.txt" -r "$repo/requirements/robustness.txt" -r "$repo/requirements/onnx.txt"
# without its dependencies: requirements/mim.txt says why
"${pip[@]}" install -q --no-deps -r "$repo/requirements/mim.txt"
"${pip[@]}" install -q --no-deps -e "$repo"

rm -f "$("$py" -c 'import sys; print(sys.prefix)')"/.mmvisatt-setup-*
touch "$stamp"
log "environment ready ($py)"
