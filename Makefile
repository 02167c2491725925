# Two commands do all set-up on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test vulkan demo lint types pytest mutants mutation explore package-check bench bench-cuda clean

# hatch reads the version from src/vyre_async/_version.py: a new one needs a reinstall.
$(STAMP): pyproject.toml src/vyre_async/_version.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP) vulkan lint types pytest

# The wgpu backend's tests run on Mesa's CPU Vulkan driver (lavapipe). Installed here
# when missing, as root with apt-get; otherwise those tests skip and name the package.
vulkan:
	@if ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing mesa-vulkan-drivers and libvulkan1 (lavapipe) for the wgpu tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null \
	  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends \
	       mesa-vulkan-drivers libvulkan1 >/dev/null; } \
	  || echo "note: apt-get could not install lavapipe: the wgpu tests will skip"; \
	else \
	  echo "note: no Vulkan driver, and not root: the wgpu tests will skip" \
	       "(install mesa-vulkan-drivers and libvulkan1 to run them)"; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy --strict scripts/mutants.py scripts/package_check.py scripts/mutation.py

# pytest-xdist workers: CI's two cores (PYTEST_WORKERS=0 runs every test in one process).
PYTEST_WORKERS ?= 2
pytest: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS)

# Builds the sdist and wheel, checks their contents, installs the wheel in a fresh venv
# outside the repository and runs the CLI, the demo, README.md and the contract suite there.
package-check: $(STAMP)
	$(BIN)/python scripts/package_check.py

# Plants each known bug of scripts/mutants.py in a copy of the tree; every one must be caught.
mutants: $(STAMP)
	$(BIN)/python scripts/mutants.py > /dev/null

# mutmut over every package of scripts/mutation.py (long: run it before a release, not in CI);
# PACKAGES="config cache" for some of them. Scores and survivors under build/mutation/.
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py $(PACKAGES)

# Property tests with fresh random examples (CI always runs the same ones: the "ci" profile);
# a test's own @settings(max_examples=...) still sets its count.
explore: $(STAMP)
	VYRE_HYPOTHESIS_PROFILE=explore $(BIN)/python -m pytest -q tests/reference tests/ir tests/policies tests/cupy tests/telemetry tests/test_timeline.py

demo: $(STAMP)
	$(BIN)/vyre-async demo

bench: $(STAMP)
	$(BIN)/python benchmarks/wire.py
	$(BIN)/python benchmarks/reference.py
	$(BIN)/python benchmarks/driver.py
	$(BIN)/python benchmarks/host_overhead.py
	$(BIN)/python benchmarks/telemetry.py
	$(BIN)/python benchmarks/import_time.py

bench-cuda: $(STAMP)
	$(BIN)/python benchmarks/cuda_backend.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist
