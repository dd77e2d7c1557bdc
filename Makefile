# The appliance: `make run` serves the demo models, `make test` runs the suite.
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
CONFIG ?=
GENERATED := appliance/_generated

.PHONY: help install native upgrade run test test-long test-unit test-image test-peers lint fmt generate generate-check docs docs-reference docs-check docs-architecture bench soak fuzz wire-capture clean install-systemd image image-base

# install-systemd: a virtual environment of its own under PREFIX, the unit, and
# an example config (never overwritten). DESTDIR stages it elsewhere.
# NATIVE=0 leaves the model worker's request path as pure Python there (and in
# the image); by default it is compiled (appliance/native.py) where a C
# compiler is at hand.
PREFIX ?= /opt/appliance
SYSCONF ?= /etc/appliance
UNITDIR ?= /etc/systemd/system
NATIVE ?= 1
# (The build runs with python -P: the installed package, not this tree's in the cwd.)

help:
	@echo "make run       serve the demo models (HTTP 8000, gRPC 8001, MIP 8002)"
	@echo "make test      install, then run the whole test suite"
	@echo "make lint      ruff format --check, ruff check, mypy, import contracts, generated code and docs"
	@echo "make docs      build the manual (docs/, mkdocs --strict) into build/site"
	@echo "make docs-reference  regenerate docs/reference/ (configuration.md, triton-model-config.md)"
	@echo "make docs-architecture  redraw the package map in docs/architecture.md from the imports"
	@echo "make upgrade   bring the venv's packages to the newest versions pyproject allows"
	@echo "make bench     run the benchmarks; results in bench/results/"
	@echo "make soak      10 minutes of load on every protocol; fails if memory, fds or shm grow"
	@echo "make fuzz      fuzz every codec, FUZZ_SECONDS (60) each; not part of make test"
	@echo "make generate  regenerate protobuf/gRPC code from protos/"
	@echo "make wire-capture  re-record tests/wire/ from the stock clients (only when a wire format changes on purpose)"
	@echo "make clean     remove build outputs and stale shared memory"
	@echo "make install-systemd  install as a systemd service (PREFIX=/opt/appliance)"
	@echo "make image     build the container image with buildah (IMAGE, IMAGE_BASE, IMAGE_EXTRAS)"
	@echo "make image-base  a Debian base image from Debian's packages (mmdebstrap), for hosts without a registry"
	@echo "make test-image  build the image and run the appliance in it (buildah; not part of make test)"
	@echo "make test-peers  the differential tests against real Triton and MLServer (installed into bench/.peers/)"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(call install_editable,)
	# graphpipe 1.0.4 pins requests 2.18 and flatbuffers 1.9, which break on
	# Python 3.11; its client works with current ones (PROTOCOL-FACTS §1.4).
	$(PY) -m pip install --quiet --no-deps graphpipe==1.0.4
	@touch $(STAMP)

# The package with its extras, $(1) the pip options.
EXTRAS := dev,onnx,torch,traces,openai,llm
install_editable = $(PY) -m pip install --quiet $(1) -e '.[$(EXTRAS)]'

# The model worker's request path compiled with mypyc where a C compiler is at
# hand (appliance/native.py); a no-op when current, pure Python where it cannot.
native: $(STAMP)
	@$(PY) -c "from appliance import native; raise SystemExit(native.build())"

install: $(STAMP) native

# A venv keeps whatever once satisfied pyproject; a fresh clone (CI) gets the
# newest releases. This makes an old venv match it.
upgrade: $(STAMP)
	$(call install_editable,--upgrade --upgrade-strategy eager)
	$(PY) -m pip install --quiet --no-deps graphpipe==1.0.4
	@touch $(STAMP)

run: $(STAMP) native
	$(BIN)/appliance serve $(if $(CONFIG),--config $(CONFIG))

test: $(STAMP) native
	$(BIN)/pytest -q

# The tests that put a minute or more of load on the appliance (a short soak, the
# README fleet's roll-over, two hosts behind HAProxy, sixty frontend kills under
# load), apart so that make test stays under 15 minutes.
test-long: $(STAMP) native
	$(BIN)/pytest -q -p no:cacheprovider -m long tests

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

# The container image, built by buildah without a daemon (--isolation chroot
# runs where podman cannot make cgroups). IMAGE_BASE: python:3.12-slim from a
# registry, or $(LOCAL_BASE) from `make image-base`. IMAGE_EXTRAS: the model
# runtimes ("" for the Python demos and models alone). NATIVE: as for
# install-systemd. Behind a TLS-inspecting proxy, PIP_CERT (the CA bundle pip
# trusts here) is lent to the build.
IMAGE ?= localhost/appliance:latest
IMAGE_BASE ?= docker.io/library/python:3.12-slim
IMAGE_EXTRAS ?= onnx,torch,openai,llm
LOCAL_BASE := localhost/appliance-base:bookworm
image:
	buildah bud --isolation chroot --layers --build-arg BASE=$(IMAGE_BASE) \
		--build-arg EXTRAS=$(IMAGE_EXTRAS) --build-arg NATIVE=$(NATIVE) \
		$(if $(PIP_CERT),--volume $(PIP_CERT):/etc/build-ca.crt:ro --build-arg PIP_CERT=/etc/build-ca.crt) \
		-f deploy/container/Containerfile -t $(IMAGE) .

image-base:
	mkdir -p build
	mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm build/base.tar
	ctr=$$(buildah from scratch) && buildah add $$ctr build/base.tar / >/dev/null \
		&& buildah commit --quiet $$ctr $(LOCAL_BASE) && buildah rm $$ctr >/dev/null
	rm -f build/base.tar

# Builds the image (and the local base when no registry is reachable) and runs
# the appliance inside it: minutes, so not part of `make test`.
test-image: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m image tests/deploy/test_image.py

# Differential tests against real Triton and MLServer (tests/peers/), which
# they install into bench/.peers/ on first use like the benchmarks' peers. The
# appliance side of the MLServer tests needs the mlserver extras here too, and so
# does test_mlserver_folder.py, which make test skips where they are not installed.
test-peers: $(STAMP) native
	$(PY) -m pip install --quiet -e '.[$(EXTRAS),mlserver,mlserver-xgboost]'
	$(BIN)/pytest -q -p no:cacheprovider -m peers tests/peers
	$(BIN)/pytest -q -p no:cacheprovider tests/system/test_mlserver_folder.py

lint: $(STAMP)
	$(BIN)/ruff format --check appliance tests bench tools deploy
	$(BIN)/ruff check appliance tests bench tools deploy
	$(BIN)/mypy appliance tools/config_reference.py tools/model_config_coverage.py
	# The bench apps that run in the appliance's environment, on its modules
	# (those run in a peer's own environment cannot be checked here).
	$(BIN)/mypy $(addprefix bench/peers/,floor_app.py floor_asgi_app.py floor_grpc_app.py ladder_app.py appliance_models.py)
	$(BIN)/lint-imports --no-cache
	$(PY) tools/import_cycles.py
	$(MAKE) --no-print-directory generate-check
	$(MAKE) --no-print-directory docs-check

fmt: $(STAMP)
	$(BIN)/ruff format appliance tests bench tools deploy
	$(BIN)/ruff check --fix appliance tests bench tools deploy

generate: $(STAMP)
	$(PY) tools/generate.py --out $(GENERATED)

generate-check: $(STAMP)
	$(PY) tools/generate.py --check --out $(GENERATED)

# The manual: docs/ built by MkDocs (mkdocs.yml) into build/site. --strict
# turns every warning (a broken link or anchor, a page left out of nav) into
# a failure. The configuration reference is generated from the config's
# schema; docs-check (run by lint) fails when the committed page is stale.
# NO_MKDOCS_2_WARNING quiets the Material theme's banner about MkDocs 2.0.
docs: $(STAMP) docs-check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "built build/site/index.html"

docs-reference: $(STAMP)
	$(PY) tools/config_reference.py
	$(PY) tools/model_config_coverage.py

# The ModelConfig coverage page fails the check too when the proto gains a
# field its table does not place.
docs-check: $(STAMP)
	$(PY) tools/config_reference.py --check
	$(PY) tools/model_config_coverage.py --check
	$(PY) tools/package_map.py --check

# The package map of docs/architecture.md, drawn from the imports.
docs-architecture: $(STAMP)
	$(PY) tools/package_map.py

# BENCH_ARGS reaches every script, e.g. `make bench BENCH_ARGS=--quick`.
# bench_peers.py installs its peers into bench/.peers/ on first use.
BENCH_ARGS ?=
bench: $(STAMP) native
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script $(BENCH_ARGS) || exit 1; done

soak: $(STAMP) native
	$(PY) bench/soak.py --minutes $(or $(MINUTES),10)

# Each codec's fuzz target runs FUZZ_SECONDS with atheris (installed here, not
# a dev extra), or with hypothesis if atheris does not install. Seeds, the
# grown corpus and crash inputs stay in build/fuzz/<target>/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: $(STAMP)
	$(PY) -m pip install --quiet atheris || echo "atheris did not install: fuzzing with hypothesis"
	PYTHONPATH=. $(PY) -m tools.fuzz.run --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The golden wire files: what the stock clients and the appliance say today.
wire-capture: $(STAMP)
	$(PY) tools/capture_wire.py

install-systemd:
	$(PYTHON) -m venv $(DESTDIR)$(PREFIX)
	$(DESTDIR)$(PREFIX)/bin/pip install --quiet --upgrade pip
	$(DESTDIR)$(PREFIX)/bin/pip install --quiet ".$(if $(filter 1,$(NATIVE)),[native])"
	$(if $(filter 1,$(NATIVE)),$(DESTDIR)$(PREFIX)/bin/python -P -c "from appliance import native; raise SystemExit(native.build())")
	install -m 0644 README.md $(DESTDIR)$(PREFIX)/README.md
	install -d $(DESTDIR)$(SYSCONF) $(DESTDIR)$(UNITDIR)
	test -e $(DESTDIR)$(SYSCONF)/config.toml || install -m 0644 systemd/config.toml $(DESTDIR)$(SYSCONF)/config.toml
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@CONFIG@|$(SYSCONF)/config.toml|g' \
		systemd/appliance.service > $(DESTDIR)$(UNITDIR)/appliance.service
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then \
		systemctl daemon-reload && echo "installed: systemctl enable --now appliance"; \
	else echo "installed in $(DESTDIR)$(PREFIX); run systemctl daemon-reload where systemd runs"; fi

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	@test ! -x $(PY) || $(PY) -c "from appliance import native; native.remove()"
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	@test ! -x $(PY) || $(PY) -c "from appliance.master.sweep import sweep_stale; sweep_stale('')"
