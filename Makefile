# privasr: two commands do everything on a fresh machine.
#   make demo   -- set up, generate the synthetic corpus and run the demo end to end (writes demo-out/)
#   make test   -- set up and run the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= dev,federated,asr,ner,plots,onnx,whisper
STAMP  := $(VENV)/.installed-$(EXTRAS)

.PHONY: setup demo test test-all bench headlines lint clean

$(STAMP): pyproject.toml setup.py src/privasr/lm/ngram/_engine.c src/privasr/lm/neural/_dropout.c src/privasr/lm/neural/_nll.c \
		src/privasr/lm/neural/_trie.c src/privasr/metrics/_netdp.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a looser requirement would pull a multi-GB CUDA build
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/privasr demo --out demo-out

test: setup
	# the TTS testbed tests need espeak-ng, sox, SphinxTrain and pocketsphinx's tools, the scoring tests NIST sclite as
	# their oracle (Debian sctk) (best effort: those tests skip without them)
	(command -v espeak-ng && command -v sox && command -v sphinx_fe && command -v pocketsphinx_mdef_convert && test -x /usr/lib/sphinxtrain/bw \
		&& test -x /usr/lib/sctk/bin/sclite) >/dev/null 2>&1 \
		|| (apt-get update -qq && apt-get install -y -qq espeak-ng sox sphinxtrain sphinxbase-utils pocketsphinx sctk >/dev/null) \
		|| echo "espeak-ng / sox / sphinxtrain / sctk unavailable: the TTS testbed and sclite oracle tests will skip"
	# the kenlm module is an oracle for the ARPA tests; it compiles from source once (best effort: skip if it fails)
	$(BIN)/python -c "import kenlm" 2>/dev/null || $(BIN)/python -m pip install --quiet "kenlm>=0.2" \
		|| echo "kenlm unavailable: the tests that use it as an oracle will skip"
	$(BIN)/python -m pytest -q -m "not slow" -p no:cacheprovider

test-all: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench:
	# the oracles the benchmarks compare against: the kenlm module (bench extra) and IRSTLM (Debian)
	$(MAKE) setup EXTRAS=dev,federated,asr,plots,bench
	test -x /usr/lib/irstlm/bin/tlm || command -v tlm >/dev/null || (apt-get update -qq && apt-get install -y -qq irstlm) || echo "irstlm unavailable: its ratio is skipped"
	$(BIN)/privasr bench all --out bench-out

headlines: setup
	# rerun the headline figures of docs/results.md (configs/headlines.yaml) with a fresh LM cache: every NNLM is
	# trained again (about 45 minutes on 2 cores); exit status 1 when a figure drifts beyond its tolerance
	$(BIN)/privasr headlines --config configs/headlines.yaml --out runs/headlines

lint: setup
	$(BIN)/ruff check src tests

clean:
	rm -rf $(VENV) demo-out bench-out .pytest_cache
