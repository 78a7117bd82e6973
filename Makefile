# The two commands of the README quickstart. Both are idempotent; a second run skips installed steps.
VENV ?= .venv
export HF_HUB_OFFLINE = 1

.PHONY: serve test lint install-serve install-test sglang-contract

# Install what serving needs, prepare the embedded models, start the gateway on 127.0.0.1:8000.
serve: install-serve
	$(VENV)/bin/cascade serve

# Install the dev tools, then run lint, type and import checks and the whole test suite (e2e included), naming the
# CPU first: how long the e2e tests take hangs on it (bf16 in hardware or not; docs/measured.md). Two workers
# (TEST_WORKERS=0 runs in one process); each file's tests run on one worker, and tests/conftest.py puts every
# real-model file on the same one.
TEST_WORKERS ?= 2
test: install-test
	$(MAKE) lint
	@$(VENV)/bin/python -c "from cascade.machine import fingerprint; print('cpu:', fingerprint())"
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# `router`: the embedded default routes with a learned router (scikit-learn, skops); tests/test_setup.py checks it.
install-serve:
	scripts/bootstrap.sh embedded,router

install-test:
	scripts/bootstrap.sh embedded,dev,router,optimizer,plots,datasets,embeddings,scaleout,extproc,redis,otel

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Check cascade against SGLang's own request/response models (tests/contract/). `make sglang-contract SGLANG=X.Y.Z`
# re-pins SGLang (tests/fixtures/sglang/sglang-pin.txt), installs that wheel --no-deps, rewrites the response
# fixtures as it serializes them and runs the contract and wire tests; without SGLANG it re-checks the pinned one.
sglang-contract:
	$(if $(SGLANG),sed -i 's/^sglang==.*/sglang==$(SGLANG)/' tests/fixtures/sglang/sglang-pin.txt)
	CASCADE_VENV=$(VENV) scripts/install_sglang_protocol.sh
	$(VENV)/bin/python -m tests.contract.sglang_wire
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/contract tests/branches/test_sglang_wire.py
