# The two Quick-start commands, and `make check`. Each first runs the idempotent set-up (tools/setup_env.sh): a
# virtual environment at .venv (MMVISATT_VENV=DIR to move it, MMVISATT_VENV=none for the current interpreter),
# created by $(PYTHON) where set (PYTHON=python3.11 make demo), else python3.
MMVISATT_VENV ?= .venv
VENV_PYTHON := $(if $(filter none,$(MMVISATT_VENV)),python3,$(MMVISATT_VENV)/bin/python)
export MMVISATT_VENV

.PHONY: setup demo test check setup-onedl test-onedl

setup:
	bash tools/setup_env.sh

# The demo's journey: stage 1 pre-trains ReSwin-T on the generated classification set (its ImageNet config,
# skipped when its checkpoint is there), stage 2 trains Mask R-CNN from that backbone checkpoint.
DEMO_STAGE1 := work_dirs/demo_imagenet/iter_60.pth

$(DEMO_STAGE1):
	$(VENV_PYTHON) tools/train.py configs/imagenet_reswin_t.py --demo --work-dir work_dirs/demo_imagenet

demo: setup
	$(MAKE) --no-print-directory $(DEMO_STAGE1)
	$(VENV_PYTHON) tools/train.py configs/mask_rcnn_reswin_t_3x.py --demo --work-dir work_dirs/demo --cfg-options model.backbone.init_cfg.checkpoint=$(DEMO_STAGE1)

test: setup
	$(VENV_PYTHON) -m pytest -n 2 --durations=30 tests

# versions, mmcv's ops and one detector forward (on the GPU where one is visible); exits 1 with the fix
check: setup
	$(VENV_PYTHON) tools/check_install.py

# The onedl fork (same import names as upstream OpenMMLab, other distribution names) on Python 3.12, in a venv of
# its own: what of the suite covers the stack (registry, every config built and stepped, checkpoints, the
# pre-flight, exact resume, the demo's journey and command, the install check). ONEDL_PYTHON names the interpreter.
ONEDL_VENV ?= .venv-onedl
ONEDL_PYTHON ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12; do \
	$$p -c '' 2>/dev/null && { echo $$p; break; }; done)
ONEDL_TESTS := tests/test_stack.py tests/test_install_check.py tests/test_backbone_contract.py \
	tests/test_configs.py tests/test_checkpoint.py tests/test_safe_load.py tests/test_preflight.py \
	tests/test_resume.py tests/test_mid_epoch.py tests/test_demo_journey.py tests/test_cluster.py \
	"tests/test_reliability.py::test_killed_runs_resume_bitwise_exactly" \
	"tests/test_reliability.py::test_killed_epoch_based_run_resumes_inside_the_epoch_bitwise_exactly" \
	"tests/test_demo_train.py::test_demo_command_trains_the_real_model"

setup-onedl:
	@test -n "$(ONEDL_PYTHON)" || { echo "test-onedl needs Python 3.12: set ONEDL_PYTHON=/path/to/python3.12"; exit 1; }
	MMVISATT_STACK=onedl MMVISATT_VENV=$(ONEDL_VENV) PYTHON=$(ONEDL_PYTHON) bash tools/setup_env.sh

test-onedl: setup-onedl
	$(ONEDL_VENV)/bin/python -m pytest -n 2 --durations=15 $(ONEDL_TESTS)
