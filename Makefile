VENV ?= .venv
PY := $(VENV)/bin/python
# `make run` ports: the gateway, its Prometheus /metrics (0: none), the first GPU host (the
# others take the next ones), and how many GPU hosts.
PORT ?= 8080
METRICS_PORT ?= 9464
WORKER_PORT ?= 28187
WORKERS ?= 2
# The base settings `hairgate dev` starts from (it sets its own pool, binds, URLs and limits).
CONFIG ?= settings.toml
# Which torch build to install: cuda (PyPI's, a GPU host's) or cpu, and a package index to take
# the cpu build from (passed to pip as --extra-index-url; PyPI has no +cpu wheel). The default
# follows the machine: a venv that holds the CPU build keeps it; a machine with an NVIDIA
# driver gets cuda; any other (a laptop, a test machine) cpu from PyTorch's CPU index, so a
# first `make run` never pulls several GB of CUDA libraries. Name either to choose:
# `make test TORCH=cpu` (where pip's own configuration finds the wheel, as on CI),
# `make run TORCH=cuda`, `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
ifeq ($(origin TORCH),undefined)
  ifneq ($(TORCH_INDEX)$(wildcard $(VENV)/lib/python3.*/site-packages/torch-*+cpu.dist-info),)
    TORCH := cpu
    TORCH_WHY := a TORCH_INDEX was given, or the venv holds the CPU build
  else ifneq ($(wildcard /proc/driver/nvidia/version),)
    TORCH := cuda
    TORCH_WHY := an NVIDIA driver is loaded
  else
    TORCH := cpu
    TORCH_INDEX := $(CPU_TORCH_INDEX)
    TORCH_WHY := no NVIDIA driver on this machine
  endif
else
  TORCH_WHY := TORCH=$(TORCH) given
endif

# The lock (requirements/): exact versions and hashes of everything `make install` installs.
# installer.txt: pip and setuptools (installer.in); lock.txt: the application and its test
# tools; torch-cpu.txt and torch-cuda.txt: torch and what it brings (the builds' hashes and
# dependencies differ). What two files share is pinned alike. `make lock` writes them;
# tests/test_lock.py checks them against pyproject.toml.
INSTALLER := requirements/installer.txt
LOCK := requirements/lock.txt requirements/torch-$(TORCH).txt
LOCK_TOOLS := $(VENV)/lock-tools
PIP_TOOLS := pip-tools==7.6.2
# pip-compile on PyPI alone, not on this machine's pip configuration (local indexes,
# find-links): what the lock names must install anywhere. The CPU torch wheel is not on PyPI:
# its compile keeps the configuration (and TORCH_INDEX).
PYPI_ONLY := env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null
COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_TOOLS)/bin/pip-compile --quiet --generate-hashes \
	--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade)
# The gpu extra's torch requirement (torch==…), the one place its version is written
TORCH_REQUIREMENT = $(shell python3 -c 'import tomllib; print(*(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"] if r.startswith("torch")))')

.PHONY: install run test typecheck test-all lint lock fit

# Hash-checked: a file whose hash the lock does not name is refused. The locked pip first (it
# installs the rest); the project itself last, editable, without dependencies (the lock brought
# them) and built with the locked setuptools.
$(VENV)/.installed: pyproject.toml $(INSTALLER) $(LOCK)
	@echo "torch: the $(TORCH) build ($(TORCH_WHY))$(if $(TORCH_INDEX), from $(TORCH_INDEX))"
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r $(INSTALLER)
	$(PY) -m pip install -q --require-hashes $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) $(addprefix -r ,$(LOCK))
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

install: $(VENV)/.installed

$(LOCK_TOOLS)/bin/pip-compile:
	python3 -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/python -m pip install -q $(PIP_TOOLS)

# Existing pins are kept where pyproject.toml still allows them (a new requirement is added
# with its own dependencies, nothing else moves); UPGRADE=1 takes the newest allowed of each.
# Needs PyPI; the torch-cuda.txt step downloads the CUDA wheel for its metadata (a few minutes).
lock: $(LOCK_TOOLS)/bin/pip-compile  ## rewrite requirements/ from pyproject.toml (make lock UPGRADE=1: newest versions)
	$(PYPI_ONLY) $(COMPILE) -o $(INSTALLER) requirements/installer.in
	$(PYPI_ONLY) $(COMPILE) --extra test -c $(INSTALLER) -o requirements/lock.txt pyproject.toml
	echo '$(TORCH_REQUIREMENT)+cpu' | $(COMPILE) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
		-c $(INSTALLER) -c requirements/lock.txt -o requirements/torch-cpu.txt - \
		|| { echo "make lock: no $(TORCH_REQUIREMENT)+cpu wheel found: give its index, TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2; exit 1; }
	echo '$(TORCH_REQUIREMENT)' | $(PYPI_ONLY) $(COMPILE) -c $(INSTALLER) -c requirements/lock.txt -o requirements/torch-cuda.txt -

run: install  ## the whole system on this machine: GPU hosts + the gateway (make run PORT=18080 …)
	$(VENV)/bin/hairgate dev --config $(CONFIG) --workers $(WORKERS) --port $(PORT) \
		--metrics-port $(METRICS_PORT) --first-worker-port $(WORKER_PORT)

lint: install  ## ruff: the checks configured in pyproject.toml, and the format (the first step of `make test`)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install  ## mypy over every package, with the configuration in pyproject.toml
	$(VENV)/bin/mypy

test: lint typecheck  ## ruff, types, then the default suite (heavy end-to-end tests excluded); -rs: why a test skipped
	$(PY) -m pytest -q -rs

test-all: lint typecheck  ## ruff, types, then everything, heavy end-to-end tests included
	$(PY) -m pytest -q -rs -m ''

fit: install  ## refit the hairline decision layer on ../shared/photos (5-fold report, then analysis/data/hairline_decision.json)
	$(PY) scripts/eval_hairline.py --write
