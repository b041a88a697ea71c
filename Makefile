# The two quick-start commands: `make demo` and `make test`. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
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
