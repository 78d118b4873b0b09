# The two set-up commands (see README.md):
#   make demo   install deps if missing, build, run the demo
#   make test   install deps if missing, build, run every test with ctest
#
# clang 14 is the one compiler: its -Werror=thread-safety checks the lock
# annotations, and the sanitizer/fuzz builds come from the same toolchain.
# ccache keeps rebuilds cheap when it is installed.
BUILD ?= build
JOBS ?= $(shell nproc)
CXX_COMPILER ?= clang++-14
CMAKE_FLAGS ?=
# Looked up when the build recipe runs, after `deps` may have installed
# ccache: a `:=` lookup at parse time missed it on a fresh machine, and the
# next make (demo after test) reconfigured with a launcher and rebuilt all.
CCACHE = $(shell command -v ccache 2>/dev/null)

.PHONY: demo test build deps clean format fuzz

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=$(CXX_COMPILER) \
	  $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)) \
	  $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

# Open-ended fuzzing of the model-folder parsers (tests/fuzz): every target
# at once (or FUZZ_TARGETS="regex tokenizer_load"), each for FUZZ_SECONDS
# (0 = until interrupted), keeping what it finds in $(BUILD)/fuzz-corpus.
# Crash reproducers land next to each corpus; store them under
# tests/fuzz/regressions/<target>/ so that make test replays them.
FUZZ_TARGETS ?= safetensors shard_index model_config tokenizer_load \
  tokenizer_encode regex
FUZZ_SECONDS ?= 0
fuzz: build
	@for t in $(FUZZ_TARGETS); do \
	  bash tests/fuzz/run_fuzzer.sh open $(BUILD)/tests/fuzz/fuzz_$$t \
	    tests/fuzz $$t $(BUILD)/fuzz-corpus/$$t \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 & \
	done; wait

# Applies .clang-format to every tracked C++ source (ctest -L style checks).
format:
	@git ls-files '*.cc' '*.h' | xargs clang-format-14 -i

clean:
	rm -rf $(BUILD)
