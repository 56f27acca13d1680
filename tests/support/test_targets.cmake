# The test mains and dtrain_add_test: included by tests/CMakeLists.txt, and by tests/gpu when that
# directory is configured on its own.
get_filename_component(_dtrain_tests_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# The launcher for multi-process tests is the one FindMPI paired with the MPI we build against,
# so the build and the run never mix MPICH and Open MPI.
if(NOT MPIEXEC_EXECUTABLE)
  message(FATAL_ERROR "No MPI launcher found next to ${MPI_CXX_COMPILER}; set MPIEXEC_EXECUTABLE.")
endif()
set(DTRAIN_TEST_MPIEXEC_FLAGS "" CACHE STRING "Extra flags for mpiexec in tests")
if(DTRAIN_MPI_FLAVOR_DETECTED STREQUAL "openmpi")
  set(_dtrain_oversubscribe --oversubscribe --allow-run-as-root)
endif()

# Python unittest files run through run_unittest.py: `python3 -m unittest` exits 0 when cases were
# skipped, so ctest would report them passed; the runner exits 77 (SKIP_RETURN_CODE) instead.
set(DTRAIN_RUN_UNITTEST ${_dtrain_tests_dir}/support/run_unittest.py)

add_library(dtrain_test_main STATIC ${_dtrain_tests_dir}/support/mpi_main.cpp)
target_link_libraries(dtrain_test_main PUBLIC dtrain::dtrain doctest::doctest)
target_include_directories(dtrain_test_main PUBLIC ${_dtrain_tests_dir})
target_compile_options(dtrain_test_main PUBLIC -Wall -Wextra)

# Plain doctest main for tests that need no MPI at all (traits, half floats, config parsing).
add_library(dtrain_unit_main STATIC ${_dtrain_tests_dir}/support/unit_main.cpp)
target_link_libraries(dtrain_unit_main PUBLIC dtrain::dtrain doctest::doctest)
target_include_directories(dtrain_unit_main PUBLIC ${_dtrain_tests_dir})
target_compile_options(dtrain_unit_main PUBLIC -Wall -Wextra)

# dtrain_add_test(<name> SOURCES <files...> [RANKS <n...>] [TIMEOUT <s>] [LIBS <targets...>]
#                 [ENV <VAR=value...>] [LABELS <l...>] [NO_MAIN] [UNIT])
# UNIT: plain doctest main, no MPI. Otherwise the MPI-aware main (tests/support/mpi_main.cpp).
# Without RANKS the binary runs as a plain process (an MPI singleton); with RANKS it runs under
# mpiexec once per count. Every test gets a TIMEOUT so a hang fails instead of blocking CI, and exit
# status 77 reports it skipped (tests/support/skip.hpp).
function(dtrain_add_test name)
  cmake_parse_arguments(T "NO_MAIN;UNIT" "TIMEOUT" "SOURCES;RANKS;LIBS;ENV;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${T_SOURCES})
  if(T_NO_MAIN)
    target_link_libraries(${name} PRIVATE dtrain::dtrain doctest::doctest ${T_LIBS})
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  elseif(T_UNIT)
    target_link_libraries(${name} PRIVATE dtrain_unit_main ${T_LIBS})
  else()
    target_link_libraries(${name} PRIVATE dtrain_test_main ${T_LIBS})
  endif()
  if(NOT T_RANKS)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${T_ENV}"
                         LABELS "unit;${T_LABELS}" SKIP_RETURN_CODE 77)
  else()
    dtrain_add_test_run(${name} TARGET ${name} RANKS ${T_RANKS} TIMEOUT ${T_TIMEOUT}
                        ENV ${T_ENV} LABELS ${T_LABELS})
  endif()
endfunction()

# dtrain_add_test_run(<name> TARGET <test target> RANKS <n...> [TIMEOUT <s>] [ENV <VAR=value...>]
#                     [LABELS <l...>] [ARGS <arg...>]): another run of an existing multi-process
#                     test binary, under other settings (e.g. its collectives over Gloo) or with
#                     arguments for the binary (e.g. the doctest cases to run).
function(dtrain_add_test_run name)
  cmake_parse_arguments(T "" "TARGET;TIMEOUT" "RANKS;ENV;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${name}.np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${_dtrain_oversubscribe}
                     ${DTRAIN_TEST_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_TARGET}>
                     ${MPIEXEC_POSTFLAGS} ${T_ARGS})
    set_tests_properties(${name}.np${n} PROPERTIES TIMEOUT ${T_TIMEOUT}
                         ENVIRONMENT "${T_ENV}" PROCESSORS ${n} LABELS "mpi;${T_LABELS}"
                         SKIP_RETURN_CODE 77)
  endforeach()
endfunction()
