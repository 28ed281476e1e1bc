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
# A package index to take torch from, e.g. https://download.pytorch.org/whl/cpu on a machine
# without a GPU (the CPU wheel, instead of several GB of CUDA libraries). Empty: pip's own
# configuration (PyPI's torch is the CUDA build: what a GPU host needs).
TORCH_INDEX ?=

.PHONY: install run test typecheck test-all

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e '.[gpu,test]'
	touch $@

install: $(VENV)/.installed

run: install  ## the whole system on this machine: GPU hosts + the gateway (make run PORT=18080 …)
	$(VENV)/bin/hairgate dev --config $(CONFIG) --workers $(WORKERS) --port $(PORT) \
		--metrics-port $(METRICS_PORT) --first-worker-port $(WORKER_PORT)

typecheck: install  ## mypy over every package, with the configuration in pyproject.toml
	$(VENV)/bin/mypy

test: typecheck  ## types, then the default suite (heavy end-to-end tests excluded); -rs: why a test skipped
	$(PY) -m pytest -q -rs

test-all: typecheck  ## types, then everything, heavy end-to-end tests included
	$(PY) -m pytest -q -rs -m ''
