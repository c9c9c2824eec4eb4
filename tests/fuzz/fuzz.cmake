# Fuzz build (FP4_FUZZ=ON; tests/fuzz/run.sh, docs/robustness.md "Fuzzing"): the libFuzzer
# targets of tests/fuzz/, with AddressSanitizer and UndefinedBehaviorSanitizer, and nothing
# else of the project. Needs clang (-DCMAKE_CXX_COMPILER=clang++) and its runtime
# (Debian: clang, libclang-rt-14-dev). The parsers are compiled once into fp4parse, the
# library sources they need (no oneDNN, OpenMP, SentencePiece or model code), so the build
# stays small: about a dozen translation units.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "FP4_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
endif()
find_package(nlohmann_json REQUIRED)
find_package(tomlplusplus REQUIRED)
# The JSONL corpus reader (src/data/jsonl.cpp): simdjson and libzstd, as in the default build.
find_package(simdjson CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
set(_fp4_fuzz_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
add_library(fp4parse STATIC
  src/recipe/recipe.cpp src/config/config.cpp src/config/settings.cpp
  src/numerics/format.cpp src/numerics/block_quant.cpp src/numerics/hadamard.cpp src/base/safetensors.cpp
  src/numerics/qtensor.cpp src/numerics/philox.cpp src/gemm/gemm_mode.cpp src/gemm/accumulator.cpp
  src/train/checkpoint.cpp src/train/metrics_log.cpp src/data/token_shard.cpp src/data/jsonl.cpp src/data/utf8.cpp
  src/cli/matrix_text.cpp)
target_include_directories(fp4parse PUBLIC include src/cli)
target_compile_options(fp4parse PUBLIC ${_fp4_fuzz_san} -fsanitize=fuzzer-no-link
  -Wno-unknown-pragmas -Wno-unused-variable)
target_link_libraries(fp4parse PUBLIC nlohmann_json::nlohmann_json tomlplusplus::tomlplusplus
  simdjson::simdjson PkgConfig::ZSTD)
set(FP4_FUZZ_TARGETS recipe config checkpoint qtensor token_shard metrics matrix jsonl)
foreach(t ${FP4_FUZZ_TARGETS})
  add_executable(fuzz_${t} tests/fuzz/fuzz_${t}.cpp)
  target_link_libraries(fuzz_${t} PRIVATE fp4parse)
  target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer ${_fp4_fuzz_san})
endforeach()
message(STATUS "fp4train: fuzz build (libFuzzer + ASan + UBSan): ${FP4_FUZZ_TARGETS}")
