# Everything runs from a virtualenv in the repo, created on first use from `python3`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo lint clean chaos

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "pgpool needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## make test: set up and run the test suite against a real, throwaway PostgreSQL
test: $(STAMP)
	$(BIN)/python -m pytest -q

## make demo: start the embedded PostgreSQL, enqueue example CPU jobs, run them, report
## (its data directory is .pgpool/ in the repo, not the per-user one: the demo is self-contained)
demo: $(STAMP)
	PGPOOL_HOME="$(CURDIR)/.pgpool" $(BIN)/python bench/demo.py

lint: $(STAMP)
	$(BIN)/ruff check pgpool tests bench handlers

clean:
	rm -rf $(VENV) .pgpool

## make chaos: two dispatchers drain 20,000 jobs while workers, dispatchers and PostgreSQL
## are killed and restarted at random; checks nothing was lost and no attempts overlapped
chaos: $(STAMP)
	$(BIN)/python bench/chaos.py --jobs 20000 --seconds 300
