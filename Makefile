# hearth - a plain Makefile. Targets:
#   make            build build/hearth and build/hearth-tests
#   make test       run the test suite (last line: "N passed, N failed, N skipped")
#   make sanitize   build with ASan+UBSan into build-san/ and run the suite there
#   make valgrind   run the suite under valgrind memcheck (in-process, no fork)
#   make fuzz       build libFuzzer targets (clang) into build-fuzz/
#   make bench      build and run the benchmarks
#   make clean

CC      ?= cc
BUILD   ?= build
PKGS    := libpcre2-8 libutf8proc jansson zlib libxxhash libmicrohttpd libcurl libcrypto libzstd hiredis
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
# the CLI binary alone uses libedit (the REPL's line editing and history)
CLI_PKGS   := libedit
CLI_PKG_CFLAGS := $(shell pkg-config --cflags $(CLI_PKGS))
CLI_PKG_LIBS   := $(shell pkg-config --libs $(CLI_PKGS))

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wformat=2 -Wvla -Wundef -Wno-format-nonliteral
# gcc only: clang has no -Wformat-truncation and rejects the flag under -Werror
CC_IS_CLANG := $(shell $(CC) --version 2>/dev/null | grep -q clang && echo 1)
WARN    += $(if $(CC_IS_CLANG),,-Wno-format-truncation)
OPT     ?= -O2
CFLAGS  ?=
CFLAGS_ALL = -std=c11 $(OPT) -g $(WARN) -D_DEFAULT_SOURCE -Isrc -Itests $(PKG_CFLAGS) \
             -MMD -MP $(SAN) $(CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -lpthread
SIMD_AVX2 := -mavx2 -mfma -mf16c
# extra flags for the SIMD files only (e.g. SIMD_OPT=-O3 to compare code generation)
SIMD_OPT  ?=

LIB_SRC   := $(filter-out src/cli/%,$(wildcard src/*/*.c))
CLI_SRC   := $(wildcard src/cli/*.c)
TEST_SRC  := $(wildcard tests/*.c)
BENCH_SRC := $(wildcard bench/*.c)

# The web page (web/*.html|css|js) is embedded into the library as a generated C file.
WEB_ASSETS := $(sort $(wildcard web/*.html web/*.css web/*.js))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/webui_assets.o
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
# CLI modules with no CLI dependencies, linked into the tests too (their unit tests)
CLI_TESTED := $(BUILD)/src/cli/format.o
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
# helpers linked into every bench (the synthetic vocabulary comes from the tests' model_synth)
BENCH_LIB := $(patsubst %.c,$(BUILD)/%.o,$(wildcard bench/common/*.c)) $(BUILD)/tests/model_synth.o

.PHONY: all test sanitize valgrind fuzz bench clean
all: $(BUILD)/hearth $(BUILD)/hearth-tests

$(BUILD)/libhearth.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# A host tool, built without the sanitizers or fuzzer flags of the build it serves.
$(BUILD)/tools/embed: web/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -Wall -Wextra -Werror -o $@ $<

$(BUILD)/gen/webui_assets.c: $(BUILD)/tools/embed $(WEB_ASSETS)
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed $@.tmp $(WEB_ASSETS) && mv $@.tmp $@

$(BUILD)/gen/webui_assets.o: $(BUILD)/gen/webui_assets.c
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

$(BUILD)/hearth: $(CLI_OBJ) $(BUILD)/libhearth.a
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJ) $(BUILD)/libhearth.a $(CLI_PKG_LIBS) $(LDLIBS)

# the REPL's pty test needs forkpty (-lutil); the test binary alone links it
$(BUILD)/hearth-tests: $(TEST_OBJ) $(CLI_TESTED) $(BUILD)/libhearth.a
	$(CC) $(CFLAGS_ALL) -o $@ $(TEST_OBJ) $(CLI_TESTED) $(BUILD)/libhearth.a $(LDLIBS) -lutil

$(BUILD)/src/cli/%.o: src/cli/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CLI_PKG_CFLAGS) -c -o $@ $<

$(BUILD)/bench/%: bench/%.c $(BENCH_LIB) $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Ibench -o $@ $< $(BENCH_LIB) $(BUILD)/libhearth.a $(LDLIBS)

# SIMD variants get their own flags; everything else targets baseline x86-64.
$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SIMD_AVX2) $(SIMD_OPT) -c -o $@ $<

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

test: $(BUILD)/hearth $(BUILD)/hearth-tests
	HEARTH_BIN=$(BUILD)/hearth $(BUILD)/hearth-tests $(T)

sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	    test

# In-process (-n) so memcheck sees every test's own code; the server and CLI tests'
# `hearth serve` children ($(HEARTH_BIN)) run outside valgrind (use make sanitize for
# them). HEARTH_VALGRIND turns PCRE2's JIT off (its code confuses memcheck).
valgrind: $(BUILD)/hearth $(BUILD)/hearth-tests
	HEARTH_BIN=$(BUILD)/hearth HEARTH_VALGRIND=1 valgrind -q --error-exitcode=99 \
	    --leak-check=full --errors-for-leak-kinds=definite $(BUILD)/hearth-tests -n $(T)

FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang OPT=-O1 CFLAGS="$(CFLAGS) -Wno-unknown-warning-option" \
	    SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
	    build-fuzz/libhearth.a
	@mkdir -p build-fuzz/fuzz
	for f in $(FUZZ_SRC); do \
	    n=$$(basename $$f .c); \
	    clang -std=c11 -O1 -g -Isrc -Itests $(PKG_CFLAGS) \
	        -fsanitize=fuzzer,address,undefined -o build-fuzz/fuzz/$$n $$f \
	        build-fuzz/libhearth.a $(LDLIBS) || exit 1; \
	done

bench: $(BENCH_BIN)
	@for b in $(BENCH_BIN); do echo "== $$b"; $$b || exit 1; done

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
