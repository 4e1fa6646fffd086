# The two Quick-start commands. Both first run the idempotent set-up (tools/setup_env.sh): a virtual
# environment at .venv (MMVISATT_VENV=DIR to move it, MMVISATT_VENV=none for the current interpreter).
MMVISATT_VENV ?= .venv
PYTHON := $(if $(filter none,$(MMVISATT_VENV)),python3,$(MMVISATT_VENV)/bin/python)
export MMVISATT_VENV

.PHONY: setup demo test

setup:
	bash tools/setup_env.sh

demo: setup
	$(PYTHON) tools/train.py configs/mask_rcnn_reswin_t_3x.py --demo --work-dir work_dirs/demo

test: setup
	$(PYTHON) -m pytest -n 2 tests
