# The two commands of the README: `make test` (set up, build, run the tests) and `make bench`
# (set up, build, run `hmoe bench` on the default preset). Everything else is a step of those.
BUILD ?= build
JOBS ?= $(shell nproc)
PRESET ?= qwen3-30b-a3b
CMAKE_FLAGS ?=
MAKEFLAGS += --no-print-directory

.PHONY: all setup configure build test bench clean

all: build

setup:
	@scripts/setup-deps.sh

configure: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	@$(BUILD)/hmoe bench --model $(PRESET)

clean:
	rm -rf $(BUILD)
