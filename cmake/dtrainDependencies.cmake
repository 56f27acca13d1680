# Finds what dtrain links against. Shared by the build tree and the installed package config so
# both resolve MPI, fmt, CUDA and NCCL the same way.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)

# Debian installs Open MPI next to MPICH when other packages pull it in, and the unsuffixed
# mpicxx/mpiexec alternatives may then point at either. DTRAIN_MPI=mpich|openmpi pins one flavour
# by its suffixed wrappers so the build and the test launcher always agree.
set(DTRAIN_MPI "auto" CACHE STRING "MPI flavour to build and launch with: auto, mpich or openmpi")
set_property(CACHE DTRAIN_MPI PROPERTY STRINGS auto mpich openmpi)

macro(dtrain_find_dependencies)
  if(NOT DTRAIN_MPI STREQUAL "auto" AND NOT MPI_CXX_COMPILER)
    find_program(_dtrain_mpicxx NAMES mpicxx.${DTRAIN_MPI} mpic++.${DTRAIN_MPI})
    find_program(_dtrain_mpiexec NAMES mpiexec.${DTRAIN_MPI} mpirun.${DTRAIN_MPI})
    if(NOT _dtrain_mpicxx OR NOT _dtrain_mpiexec)
      message(FATAL_ERROR "DTRAIN_MPI=${DTRAIN_MPI}: mpicxx.${DTRAIN_MPI} or mpiexec.${DTRAIN_MPI} "
                          "not found. Install it (Debian: libmpich-dev mpich, or "
                          "libopenmpi-dev openmpi-bin) or set DTRAIN_MPI=auto.")
    endif()
    set(MPI_CXX_COMPILER "${_dtrain_mpicxx}" CACHE FILEPATH "MPI C++ compiler wrapper" FORCE)
    set(MPIEXEC_EXECUTABLE "${_dtrain_mpiexec}" CACHE FILEPATH "MPI launcher" FORCE)
  endif()
  set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "dtrain uses the MPI C API only")
  # find_dependency() reports a missing package by return()-ing from the package config; in a
  # build tree that would silently end the configure, so there a missing dependency is an error.
  if(CMAKE_FIND_PACKAGE_NAME)
    find_dependency(MPI COMPONENTS CXX)
    find_dependency(Threads)
    find_dependency(fmt 9)
  else()
    find_package(MPI REQUIRED COMPONENTS CXX)
    find_package(Threads REQUIRED)
    find_package(fmt 9 REQUIRED)
  endif()

  set(DTRAIN_MPI_FLAVOR_DETECTED "unknown")
  if(MPI_CXX_LIBRARIES MATCHES "mpich")
    set(DTRAIN_MPI_FLAVOR_DETECTED "mpich")
  elseif(MPI_CXX_LIBRARIES MATCHES "openmpi|libmpi\\.so")
    set(DTRAIN_MPI_FLAVOR_DETECTED "openmpi")
  endif()

  set(DTRAIN_CUDA_FOUND OFF)
  if(NOT DEFINED DTRAIN_WITH_CUDA)
    set(DTRAIN_WITH_CUDA AUTO)
  endif()
  if(NOT DTRAIN_WITH_CUDA STREQUAL "OFF")
    find_package(CUDAToolkit QUIET)
    find_path(DTRAIN_NCCL_INCLUDE_DIR nccl.h
              HINTS ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(DTRAIN_NCCL_LIBRARY nccl
                 HINTS ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
    if(CUDAToolkit_FOUND AND DTRAIN_NCCL_INCLUDE_DIR AND DTRAIN_NCCL_LIBRARY
       AND TARGET CUDA::nvrtc AND TARGET CUDA::cuda_driver)
      set(DTRAIN_CUDA_FOUND ON)
      if(NOT TARGET dtrain_nccl)
        add_library(dtrain_nccl INTERFACE IMPORTED)
        set_target_properties(dtrain_nccl PROPERTIES
          INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_NCCL_INCLUDE_DIR}"
          INTERFACE_LINK_LIBRARIES "${DTRAIN_NCCL_LIBRARY}")
      endif()
    elseif(DTRAIN_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "DTRAIN_WITH_CUDA=ON but the CUDA toolkit (with NVRTC and the driver "
                          "library) or NCCL was not found. CUDA: ${CUDAToolkit_FOUND}, nccl.h: "
                          "${DTRAIN_NCCL_INCLUDE_DIR}, libnccl: ${DTRAIN_NCCL_LIBRARY}. "
                          "Set CUDAToolkit_ROOT / NCCL_HOME, or DTRAIN_WITH_CUDA=OFF.")
    endif()
  endif()

  # Gloo: dtrain's Gloo plugin, the host path of DTRAIN_CPU_OPERATIONS=gloo (Note [Gloo on the
  # host path] in include/dtrain/comm/gloo_group.hpp). Optional: without it that knob is refused
  # at init. Only dtrain's own build needs it (an installed package carries the plugin).
  set(DTRAIN_GLOO_FOUND OFF)
  if(NOT DEFINED DTRAIN_WITH_GLOO)
    set(DTRAIN_WITH_GLOO AUTO)
  endif()
  if(NOT DTRAIN_WITH_GLOO STREQUAL "OFF")
    if(NOT TARGET gloo)
      find_package(Gloo CONFIG QUIET)
    endif()
    if(TARGET gloo)
      set(DTRAIN_GLOO_FOUND ON)
    elseif(DTRAIN_WITH_GLOO STREQUAL "ON")
      message(FATAL_ERROR "DTRAIN_WITH_GLOO=ON but Gloo was not found (Debian: libgloo-dev). "
                          "Set Gloo_DIR, or DTRAIN_WITH_GLOO=OFF.")
    endif()
  endif()
endmacro()
