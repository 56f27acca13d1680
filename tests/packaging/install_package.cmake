# cmake -DBINARY_DIR=<dtrain build> -DPREFIX=<dir> [-DCONFIG=<cfg>]
#       [-DSOURCE_DIR=<dtrain source> -DGENERATOR=<g>] -P install_package.cmake [-- <cmake args>]
#
# Installs dtrain into a fresh PREFIX and checks the layout a find_package consumer relies on.
# With SOURCE_DIR, first configures (with the arguments after --) and builds a separate dtrain
# build in BINARY_DIR: a package with other options than the main build, e.g. without CUDA.
cmake_minimum_required(VERSION 3.20)
foreach(var IN ITEMS BINARY_DIR PREFIX)
  if(NOT ${var})
    message(FATAL_ERROR "install_package.cmake: pass -D${var}=...")
  endif()
endforeach()

# A macro, not a function: a function's ARGN would split "-DLIST=a;b" again.
macro(check_step what)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
endmacro()

include("${CMAKE_CURRENT_LIST_DIR}/script_arguments.cmake")
dtrain_script_arguments(configure_args)

set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
if(SOURCE_DIR)
  file(REMOVE_RECURSE "${BINARY_DIR}")
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}"
                          -G "${GENERATOR}" ${configure_args} RESULT_VARIABLE rc)
  check_step("Configuring ${SOURCE_DIR} in ${BINARY_DIR}")
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BINARY_DIR}" ${config_args}
                  RESULT_VARIABLE rc)
  check_step("Building ${BINARY_DIR}")
endif()

file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${PREFIX}"
                        ${config_args} RESULT_VARIABLE rc)
check_step("Installing ${BINARY_DIR} into ${PREFIX}")

file(GLOB_RECURSE configs "${PREFIX}/*/dtrainConfig.cmake")
list(LENGTH configs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "Expected one installed dtrainConfig.cmake under ${PREFIX}, found: ${configs}")
endif()
get_filename_component(cmake_dir "${configs}" DIRECTORY)
foreach(file IN ITEMS dtrainConfigVersion.cmake dtrainTargets.cmake dtrainDependencies.cmake)
  if(NOT EXISTS "${cmake_dir}/${file}")
    message(FATAL_ERROR "${file} is not installed next to ${configs}")
  endif()
endforeach()
if(NOT EXISTS "${PREFIX}/include/dtrain/dtrain.hpp")
  message(FATAL_ERROR "The umbrella header is not installed: ${PREFIX}/include/dtrain/dtrain.hpp")
endif()
# dtrain-report runs from the installation (its modules found relative to the launcher).
file(GLOB report_tool "${PREFIX}/*/dtrain-report")
if(NOT report_tool)
  message(FATAL_ERROR "dtrain-report is not installed under ${PREFIX}")
endif()
execute_process(COMMAND "${report_tool}" --list-thresholds RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "straggler_slowdown")
  message(FATAL_ERROR "The installed ${report_tool} does not run (${rc}): ${out}${err}")
endif()
message(STATUS "dtrain installed into ${PREFIX} (package files in ${cmake_dir})")
