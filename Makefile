# The two Quick-start commands. Both first run the idempotent set-up (tools/setup_env.sh): a virtual
# environment at .venv (MMVISATT_VENV=DIR to move it, MMVISATT_VENV=none for the current interpreter).
MMVISATT_VENV ?= .venv
PYTHON := $(if $(filter none,$(MMVISATT_VENV)),python3,$(MMVISATT_VENV)/bin/python)
export MMVISATT_VENV

.PHONY: setup demo test

setup:
	bash tools/setup_env.sh

# The demo's journey: stage 1 pre-trains ReSwin-T on the generated classification set (its ImageNet config,
# skipped when its checkpoint is there), stage 2 trains Mask R-CNN from that backbone checkpoint.
DEMO_STAGE1 := work_dirs/demo_imagenet/iter_60.pth

$(DEMO_STAGE1):
	$(PYTHON) tools/train.py configs/imagenet_reswin_t.py --demo --work-dir work_dirs/demo_imagenet

demo: setup
	$(MAKE) --no-print-directory $(DEMO_STAGE1)
	$(PYTHON) tools/train.py configs/mask_rcnn_reswin_t_3x.py --demo --work-dir work_dirs/demo --cfg-options model.backbone.init_cfg.checkpoint=$(DEMO_STAGE1)

test: setup
	$(PYTHON) -m pytest -n 2 --durations=30 tests
