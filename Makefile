# The two quick-start commands: `make demo` and `make test`. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

# Best-effort system packages, installed when running as root with apt-get; setup never fails
# for them. $(call apt_install,COMMAND,PACKAGE,WHAT IT GIVES,WHAT GOES WITHOUT IT)
apt_install = command -v $(1) >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && { apt-get install -y -qq $(2) >/dev/null 2>&1 \
	       || { apt-get update -qq >/dev/null 2>&1 \
	            && apt-get install -y -qq $(2) >/dev/null 2>&1; }; } \
	  && echo "setup: installed $(2): $(3)"; } \
	  || echo "setup: $(2) not installed: $(4)"

# Lanes run under bubblewrap where it is installed (README, "Isolation"); the cluster tests run
# a real etcd cluster (README, "Hosts on other machines"); the console's browser tests drive a
# headless Chromium (README, "Console").
$(STAMP): pyproject.toml
	@$(call apt_install,bwrap,bubblewrap,lanes run sandboxed,lanes run without it (README Isolation))
	@$(call apt_install,etcd,etcd-server,the cluster tests run,the cluster tests skip)
	@$(call apt_install,chromium,chromium chromium-driver,the console's browser tests run,the console's browser tests skip)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The main job on real input: this repository's own checks, run as lanes in sandboxes of a
# fresh clone of it, by a real tree (custodian, coordinator, two shards).
demo: $(STAMP)
	rm -rf demo
	git clone --quiet . demo/workspace
	$(BIN)/orchestra-sup run examples/selfcheck.toml --workspace demo/workspace --state-dir demo/state

lint: $(STAMP)
	$(BIN)/ruff check orchestra_sup tests
	$(BIN)/ruff format --check orchestra_sup tests

test: $(STAMP) lint
	$(BIN)/pytest -n auto -q

clean:
	rm -rf $(VENV) demo
