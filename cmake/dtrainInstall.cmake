# Install rules and package configuration for dtrain.
#
# Two ways to consume the result with find_package(dtrain 0.1 CONFIG):
# - an install: `cmake --install <build> --prefix <p>`, then CMAKE_PREFIX_PATH=<p>;
# - the build tree itself: dtrain_DIR=<build>, through a build-tree export of the same targets.
#
# The CUDA target lives in its own export set (dtrainCudaTargets) so that the package config loads
# it only when the `cuda` component is requested and CUDA + NCCL are found on the consuming
# machine: dtrain::cuda then never refers to CUDA or NCCL targets that do not exist.
include_guard(GLOBAL)
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(DTRAIN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/dtrain" CACHE STRING
    "Where dtrain's CMake package files are installed, relative to the install prefix")
mark_as_advanced(DTRAIN_INSTALL_CMAKEDIR)

install(DIRECTORY "${dtrain_SOURCE_DIR}/include/dtrain" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")

install(TARGETS dtrain dtrain_header_only EXPORT dtrainTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
if(TARGET dtrain_gloo)  # loaded by path, not linked: outside the export set
  install(TARGETS dtrain_gloo LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endif()
install(EXPORT dtrainTargets NAMESPACE dtrain:: FILE dtrainTargets.cmake
        DESTINATION "${DTRAIN_INSTALL_CMAKEDIR}")
export(EXPORT dtrainTargets NAMESPACE dtrain:: FILE "${dtrain_BINARY_DIR}/dtrainTargets.cmake")
if(TARGET dtrain_cuda)
  install(TARGETS dtrain_cuda EXPORT dtrainCudaTargets)
  install(EXPORT dtrainCudaTargets NAMESPACE dtrain:: FILE dtrainCudaTargets.cmake
          DESTINATION "${DTRAIN_INSTALL_CMAKEDIR}")
  export(EXPORT dtrainCudaTargets NAMESPACE dtrain::
         FILE "${dtrain_BINARY_DIR}/dtrainCudaTargets.cmake")
endif()

# The MPI the package was built with becomes the consumer's default, so find_package(dtrain)
# resolves the same flavour even after Debian's mpicxx/mpiexec alternatives switch to another.
# The unsuffixed wrapper FindMPI reports is replaced by its flavour-suffixed twin when both are the
# same file (Debian: /usr/bin/mpicxx -> mpicxx.mpich), which pins the flavour by name.
function(_dtrain_pin_mpi_program out path stem)
  set(result "${path}")
  if(IS_ABSOLUTE "${path}" AND EXISTS "${path}"
     AND DTRAIN_MPI_FLAVOR_DETECTED MATCHES "^(mpich|openmpi)$")
    get_filename_component(dir "${path}" DIRECTORY)
    set(twin "${dir}/${stem}.${DTRAIN_MPI_FLAVOR_DETECTED}")
    if(EXISTS "${twin}")
      file(REAL_PATH "${path}" real_path)
      file(REAL_PATH "${twin}" real_twin)
      if(real_path STREQUAL real_twin)
        set(result "${twin}")
      endif()
    endif()
  endif()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()
get_filename_component(_dtrain_mpicxx_stem "${MPI_CXX_COMPILER}" NAME)
get_filename_component(_dtrain_mpiexec_stem "${MPIEXEC_EXECUTABLE}" NAME)
_dtrain_pin_mpi_program(DTRAIN_BUILT_MPI_CXX_COMPILER "${MPI_CXX_COMPILER}" "${_dtrain_mpicxx_stem}")
_dtrain_pin_mpi_program(DTRAIN_BUILT_MPIEXEC_EXECUTABLE "${MPIEXEC_EXECUTABLE}"
                        "${_dtrain_mpiexec_stem}")
if(DTRAIN_CUDA_FOUND)
  set(DTRAIN_BUILT_WITH_CUDA ON)
else()
  set(DTRAIN_BUILT_WITH_CUDA OFF)
endif()

# One template serves both trees: it finds everything relative to its own directory.
configure_package_config_file("${dtrain_SOURCE_DIR}/cmake/dtrainConfig.cmake.in"
  "${dtrain_BINARY_DIR}/package/dtrainConfig.cmake"
  INSTALL_DESTINATION "${DTRAIN_INSTALL_CMAKEDIR}")
configure_package_config_file("${dtrain_SOURCE_DIR}/cmake/dtrainConfig.cmake.in"
  "${dtrain_BINARY_DIR}/dtrainConfig.cmake"
  INSTALL_DESTINATION "${dtrain_BINARY_DIR}" INSTALL_PREFIX "${dtrain_BINARY_DIR}")
# 0.x: a minor release may break the API, so only the same major.minor is compatible. The package
# holds a compiled library (dtrain::dtrain), so it fits the architecture it was built for.
write_basic_package_version_file("${dtrain_BINARY_DIR}/dtrainConfigVersion.cmake"
  VERSION "${dtrain_VERSION}" COMPATIBILITY SameMinorVersion)
configure_file("${dtrain_SOURCE_DIR}/cmake/dtrainDependencies.cmake"
               "${dtrain_BINARY_DIR}/dtrainDependencies.cmake" COPYONLY)
configure_file("${dtrain_SOURCE_DIR}/cmake/dtrainTorch.cmake"
               "${dtrain_BINARY_DIR}/dtrainTorch.cmake" COPYONLY)

install(FILES "${dtrain_BINARY_DIR}/package/dtrainConfig.cmake"
              "${dtrain_BINARY_DIR}/dtrainConfigVersion.cmake"
              "${dtrain_SOURCE_DIR}/cmake/dtrainDependencies.cmake"
              "${dtrain_SOURCE_DIR}/cmake/dtrainTorch.cmake"
        DESTINATION "${DTRAIN_INSTALL_CMAKEDIR}")

# dtrainrun in bin/, its Python package and the description of this build in
# share/dtrain/launcher/ (where bin/dtrainrun looks for them), dtrain-build-info beside it.
if(TARGET dtrain_build_info)
  install(PROGRAMS "${dtrain_SOURCE_DIR}/tools/dtrainrun" DESTINATION "${CMAKE_INSTALL_BINDIR}")
  install(TARGETS dtrain_build_info RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
  install(DIRECTORY "${dtrain_SOURCE_DIR}/tools/dtrain_launcher"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/dtrain/launcher"
          FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  install(FILES "${dtrain_BINARY_DIR}/share/dtrain/launcher/build.json"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/dtrain/launcher")
endif()

# dtrain-report: the launcher in bin/, its Python modules in share/dtrain/. The installed launcher
# names the modules' folder relative to itself, so an installation can be moved.
if(IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  set(_dtrain_bindir "${CMAKE_INSTALL_BINDIR}")
else()
  set(_dtrain_bindir "/prefix/${CMAKE_INSTALL_BINDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_DATADIR}")
  set(_dtrain_datadir "${CMAKE_INSTALL_DATADIR}/dtrain")
else()
  set(_dtrain_datadir "/prefix/${CMAKE_INSTALL_DATADIR}/dtrain")
endif()
file(RELATIVE_PATH _dtrain_report_modules "${_dtrain_bindir}" "${_dtrain_datadir}")
file(READ "${dtrain_SOURCE_DIR}/tools/dtrain-report" _dtrain_report)
string(REPLACE "INSTALLED_MODULES = \"../share/dtrain\""
               "INSTALLED_MODULES = \"${_dtrain_report_modules}\"" _dtrain_report "${_dtrain_report}")
file(GENERATE OUTPUT "${dtrain_BINARY_DIR}/package/dtrain-report" CONTENT "${_dtrain_report}")
install(PROGRAMS "${dtrain_BINARY_DIR}/package/dtrain-report" DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(DIRECTORY "${dtrain_SOURCE_DIR}/tools/dtrain_report" DESTINATION "${CMAKE_INSTALL_DATADIR}/dtrain"
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

foreach(_dtrain_doc IN ITEMS LICENSE LICENSE.txt LICENSE.md COPYING NOTICE README README.md)
  if(EXISTS "${dtrain_SOURCE_DIR}/${_dtrain_doc}")
    install(FILES "${dtrain_SOURCE_DIR}/${_dtrain_doc}" DESTINATION "${CMAKE_INSTALL_DOCDIR}")
  endif()
endforeach()
