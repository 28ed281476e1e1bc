VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install run test test-all

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[gpu,test]'
	touch $@

install: $(VENV)/.installed

run: install  ## the whole system on this machine: 2 GPU hosts + the gateway on :8080
	$(VENV)/bin/hairgate dev --workers 2

test: install  ## the default suite (heavy end-to-end tests excluded)
	$(PY) -m pytest -q

test-all: install  ## everything, heavy end-to-end tests included
	$(PY) -m pytest -q -m ''
