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
CCACHE := $(shell command -v ccache 2>/dev/null)

.PHONY: demo test build deps clean format

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

# Applies .clang-format to every tracked C++ source (ctest -L style checks).
format:
	@git ls-files '*.cc' '*.h' | xargs clang-format-14 -i

clean:
	rm -rf $(BUILD)
