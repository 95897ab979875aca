# The two commands of README.md: `make lab` (open the lessons) and `make test` (every test tier).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help
.PHONY: help lab test test-fast bench chromium

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FLOWLAB_CHROMIUM ?= /usr/bin/chromium
export FLOWLAB_CHROMIUM
FAST_WORKERS ?= 2
# Per-test guard against hangs (pytest-timeout); a test's own @pytest.mark.timeout wins.
TEST_TIMEOUT ?= 300
PYTEST := $(BIN)/python -m pytest -p no:nbval -ra
# One notebook at a time: a kernel's ports are picked free, then bound a moment later by the kernel,
# and a LocalCluster starting in a notebook beside it can take one in between (seen once: the kernel
# never answered, "Kernel didn't respond in 60 seconds"). Costs about 25 s.
NBVAL := $(BIN)/python -m pytest -ra --nbval --nbval-current-env \
	--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=120 -n 1 --dist loadscope
# The notebook tier runs a second time with numpy's SIMD dispatch held to its x86-64 baseline and two
# BLAS threads: a stored output whose digits depend on the CPU then fails here, not on the next
# machine (TESTING.md section 5). Naming a feature this CPU lacks is harmless.
NBVAL_NARROW_ENV := NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL AVX512_SPR" FLOWLAB_BLAS_THREADS=2
FAST_TIER := $(PYTEST) -m "not process and not browser and not gpu" -n $(FAST_WORKERS) \
	--timeout=$(TEST_TIMEOUT) tests
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# Kernels, matplotlib and jupyter write their state under .pt/, never into $HOME.
test test-fast: export IPYTHONDIR = $(CURDIR)/.pt/ipython
test test-fast: export MPLCONFIGDIR = $(CURDIR)/.pt/matplotlib
test test-fast: export JUPYTER_RUNTIME_DIR = $(CURDIR)/.pt/jupyter-runtime
test test-fast: export PYTHONDONTWRITEBYTECODE = 1

help:
	@echo "make lab        install .[lab] into .venv and open JupyterLab on lessons/"
	echo "make test       install .[lab,test,mpi] (+ Debian chromium if missing) and run every test tier"
	echo "make test-fast  only the fast tier"
	echo "make bench      install .[bench] and run bench/eager.py"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# One stamp per set of extras: pip runs again only when pyproject.toml is newer than the stamp.
EXTRAS_lab := lab
EXTRAS_test := lab,test,mpi
EXTRAS_bench := bench
$(VENV)/.stamp-%: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -e '.[$(EXTRAS_$*)]'
	touch $@

lab: $(VENV)/.stamp-lab
	$(BIN)/jupyter lab --ip=127.0.0.1 $(ALLOW_ROOT) lessons/

chromium:
	@[ -x "$(FLOWLAB_CHROMIUM)" ] && exit 0
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo=sudo; else
	  echo "make: $(FLOWLAB_CHROMIUM) is missing; the browser tier needs Debian's chromium." >&2
	  echo "      Install it as root (apt-get update && apt-get install -y chromium)," >&2
	  echo "      or point FLOWLAB_CHROMIUM at a Chromium binary." >&2
	  exit 1
	fi
	echo "make: $(FLOWLAB_CHROMIUM) is missing: installing Debian's chromium"
	$$sudo apt-get update
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
	[ -x "$(FLOWLAB_CHROMIUM)" ] || { echo "make: $(FLOWLAB_CHROMIUM) is still missing" >&2; exit 1; }

test-fast: | $(BIN)/python
	@mkdir -p "$$IPYTHONDIR" "$$MPLCONFIGDIR" "$$JUPYTER_RUNTIME_DIR"
	rc=0; $(FAST_TIER) || rc=$$?
	if [ $$rc = 5 ]; then echo "fast tier: no tests collected (ran no tests)"; exit 0; fi
	exit $$rc

# Every tier runs even when an earlier one fails; exit 5 (nothing collected) counts as a pass.
test: $(VENV)/.stamp-test chromium
	@mkdir -p "$$IPYTHONDIR" "$$MPLCONFIGDIR" "$$JUPYTER_RUNTIME_DIR"
	failed=0; summary=()
	tier() {  # tier NAME COMMAND...
	  local name=$$1 rc=0 t0=$$SECONDS result; shift
	  echo; echo "=== tier $$name: $$*"
	  "$$@" || rc=$$?
	  case $$rc in
	    0) result="passed";;
	    5) result="passed (nothing collected: ran no tests)";;
	    *) result="FAILED (exit $$rc)"; failed=1;;
	  esac
	  summary+=("$$(printf 'tier %-15s %-42s %4ds' "$$name" "$$result" $$((SECONDS - t0)))")
	}
	tier fast $(FAST_TIER)
	tier process $(PYTEST) -m process --timeout=$(TEST_TIMEOUT) tests
	tier gpu $(PYTEST) -m gpu --timeout=$(TEST_TIMEOUT) tests/gpu
	nb_dirs=()
	for d in lessons exercises; do
	  if [ -n "$$(find "$$d" -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' -print -quit 2>/dev/null)" ]; then
	    nb_dirs+=("$$d")
	  fi
	done
	if [ $${#nb_dirs[@]} -gt 0 ]; then
	  tier notebook $(NBVAL) "$${nb_dirs[@]}"
	  tier notebook-narrow env $(NBVAL_NARROW_ENV) $(NBVAL) "$${nb_dirs[@]}"
	else
	  echo; echo "=== tier notebook: no .ipynb in lessons/ or exercises/, nothing to run"
	  for name in notebook notebook-narrow; do
	    summary+=("$$(printf 'tier %-15s %-42s %4ds' "$$name" "passed (no notebooks: ran no tests)" 0)")
	  done
	fi
	tier browser $(PYTEST) -m browser --basetemp=.pt/tmp-browser tests/browser
	echo; echo "=== summary"; printf '%s\n' "$${summary[@]}"
	exit $$failed

bench: $(VENV)/.stamp-bench
	$(BIN)/python bench/eager.py
