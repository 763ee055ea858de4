# Host-side fuzzing of spec and argument validation (issue 7): hmoe_fuzz_validation is built with
# clang's libFuzzer, AddressSanitizer and UBSan, and a ctest runs it for a bounded time. The host
# sources under test (spec, dispatch, C API) are compiled by clang with coverage instrumentation;
# the rest of the library (kernels, variant table) links from hmoe_static. Optional: without a clang
# that can link -fsanitize=fuzzer (Debian: apt-get install clang libclang-rt-dev) it is skipped.
find_program(HMOE_FUZZ_CLANGXX NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14)
if(NOT HMOE_FUZZ_CLANGXX)
  message(STATUS "hmoe: fuzz_validation skipped: no clang++ (apt-get install clang libclang-rt-dev)")
  return()
endif()

set(HMOE_FUZZ_FLAGS -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
set(probe_dir "${CMAKE_CURRENT_BINARY_DIR}/fuzz-probe")
file(MAKE_DIRECTORY "${probe_dir}")
file(WRITE "${probe_dir}/probe.cpp"
     "#include <cstddef>\n#include <cstdint>\n"
     "extern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
execute_process(COMMAND ${HMOE_FUZZ_CLANGXX} ${HMOE_FUZZ_FLAGS} probe.cpp -o probe
                WORKING_DIRECTORY "${probe_dir}" RESULT_VARIABLE probe_status OUTPUT_QUIET ERROR_QUIET)
if(NOT probe_status EQUAL 0)
  message(STATUS "hmoe: fuzz_validation skipped: ${HMOE_FUZZ_CLANGXX} cannot link libFuzzer "
                 "(apt-get install libclang-rt-dev)")
  return()
endif()
message(STATUS "hmoe: fuzz_validation enabled with ${HMOE_FUZZ_CLANGXX}")

# Every host-only source of spec checking and planning, instrumented; the kernels are not.
file(GLOB fuzz_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/spec/*.cpp
     ${CMAKE_CURRENT_SOURCE_DIR}/src/dispatch/*.cpp ${CMAKE_CURRENT_SOURCE_DIR}/src/capi/*.cpp)
list(PREPEND fuzz_sources ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_validation.cpp)
set(fuzz_includes -I${CMAKE_CURRENT_SOURCE_DIR}/include -I${CMAKE_CURRENT_SOURCE_DIR}/src)
foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
  list(APPEND fuzz_includes -isystem ${dir})
endforeach()
set(fuzz_binary "${CMAKE_CURRENT_BINARY_DIR}/hmoe_fuzz_validation")
# NOTE: the clang-compiled objects come first, so the linker takes spec/dispatch/C API from them
# and pulls only the remaining members (kernels, variant table) out of the g++-built archive.
add_custom_command(
  OUTPUT "${fuzz_binary}"
  COMMAND ${HMOE_FUZZ_CLANGXX} ${HMOE_FUZZ_FLAGS} ${fuzz_includes} ${fuzz_sources} $<TARGET_FILE:hmoe_static>
          $<TARGET_FILE:CUDA::cudart_static> -lpthread -ldl -lrt -o "${fuzz_binary}"
  DEPENDS ${fuzz_sources} hmoe_static ${CMAKE_CURRENT_SOURCE_DIR}/include/hmoe/hmoe.hpp
          ${CMAKE_CURRENT_SOURCE_DIR}/include/hmoe/hmoe.h
  COMMENT "Building the libFuzzer target hmoe_fuzz_validation"
  VERBATIM COMMAND_EXPAND_LISTS)
# NOTE: the target is not named like its output file: Ninja rejects a phony and a file of one name.
add_custom_target(hmoe_fuzz ALL DEPENDS "${fuzz_binary}")

if(BUILD_TESTING)
  # Bounded: 30 s or 2 M inputs, whichever comes first; a fixed seed keeps CI repeatable (explore
  # with other seeds by hand); crash reproducers land in fuzz-artifacts/.
  file(MAKE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
  add_test(NAME fuzz_validation
           COMMAND "${fuzz_binary}" -seed=20261202 -max_total_time=30 -runs=2000000 -timeout=10 -print_final_stats=1
                   -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts/)
  set_tests_properties(fuzz_validation PROPERTIES TIMEOUT 120)
endif()
