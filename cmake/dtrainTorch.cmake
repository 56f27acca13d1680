# libtorch for dtrain's torch integration (<dtrain/torch.hpp>), its tests and the examples.
#
#   include(dtrainTorch)
#   dtrain_find_torch()           # before dtrain_find_dependencies(): a CUDA libtorch picks the NCCL
#   ...                           # (dtrain::dtrain, and dtrain::cuda where built, are defined here)
#   dtrain_add_torch_target()     # dtrain::torch, when a usable libtorch was found
#
# (the installed package does the same for find_package(dtrain COMPONENTS torch)),
# and in any directory below, for a program or library that uses libtorch:
#
#   if(TARGET dtrain::torch)
#     add_executable(trainer train.cpp)
#     target_link_libraries(trainer PRIVATE dtrain::torch)
#     dtrain_torch_precompile_headers(trainer)   # <torch/torch.h> parsed once, not per file
#   endif()
#
# libtorch is found the usual way: Torch_DIR, or CMAKE_PREFIX_PATH holding a libtorch prefix
# (PyTorch's C++ zip, or a pip/conda install:
# `python -c 'import torch; print(torch.utils.cmake_prefix_path)'`). Without one, or with one that
# cannot be used, DTRAIN_TORCH_FOUND is false and the configure says what it found and what to do;
# with DTRAIN_REQUIRE_TORCH=ON that is an error instead.
#
# Note [libtorch and {fmt}]
# libtorch installs its own {fmt} headers (12.x in torch 2.15) in its include directory, next to
# ATen/ and c10/. A program that includes <torch/torch.h> gets that directory on its include path,
# so dtrain's `#include <fmt/format.h>` would find libtorch's fmt 12 while the program links the
# fmt library dtrain was configured with (Debian: libfmt.so.9): undefined fmt::v12 symbols, or
# worse, one program with two fmt ABIs. The fmt that dtrain::dtrain links must also be the fmt
# whose headers every translation unit sees. dtrain::torch therefore puts a directory holding only
# that fmt's headers (a link to its fmt/ folder) on the include path as a plain -I, which the
# compiler searches before every -isystem directory, libtorch's included, whatever the link order.
# <torch/torch.h> itself does not include fmt; the few libtorch headers that do (c10d, profiler
# internals) are not part of the C++ frontend. Using libtorch's fmt header-only instead would need
# dtrain's headers to build against fmt 12 in torch programs and fmt >= 9 elsewhere, and would still
# mix two fmt versions in a program whose other files do not see libtorch's include directory.
#
# Note [libtorch and NCCL]
# A CUDA-enabled libtorch from pip (the `torch` wheel) links the NCCL of the nvidia-nccl wheel
# installed next to it (site-packages/nvidia/nccl), usually newer than a system NCCL. A program
# that links libtorch_cuda and dtrain::cuda must link that same NCCL: with the system one, the
# linker resolves libtorch_cuda's NCCL symbols against the older library (undefined
# ncclCommGrow, ...), and at run time only one libnccl.so.2 can be loaded. dtrain_find_torch()
# therefore runs before dtrain's own dependencies are found and makes dtrain::cuda use the NCCL
# that the libtorch ships, when it ships one.
#
# Note [libtorch and the CUDA dialect]
# A CUDA-enabled libtorch's package sets CMAKE_CUDA_STANDARD to CMAKE_CXX_STANDARD when it is
# unset, then probes the GPUs with a CUDA try_run in that dialect. A project that asks for C++20
# the usual way, set(CMAKE_CXX_STANDARD 20), makes that probe CUDA20, for which CMake 3.25 knows no
# nvcc flag: the configure stops inside libtorch ("requires the language dialect CUDA20"). libtorch
# needs C++17, so dtrain_find_torch() loads it with CMAKE_CUDA_STANDARD 17 when the project chose
# no CUDA dialect, and unsets it again afterwards: the project's own CUDA targets are untouched.
include_guard(GLOBAL)

set(DTRAIN_REQUIRE_TORCH OFF CACHE BOOL
    "Fail the configure when no usable libtorch is found, instead of skipping what needs it")
# torch::autograd::PostAccumulateGradHook and impl::set_post_acc_grad_hooks (Note [Gradient hooks]).
set(DTRAIN_TORCH_MIN_VERSION 2.1)

# Reports a libtorch that is missing or unusable: an error with DTRAIN_REQUIRE_TORCH, else a
# visible message; in both cases what was found and how to point at another. The arguments are
# concatenated.
function(_dtrain_torch_unusable)
  string(CONCAT what ${ARGV})
  set(DTRAIN_TORCH_NOT_FOUND_REASON "${what}" PARENT_SCOPE)
  if(CMAKE_FIND_PACKAGE_NAME)
    # find_package(dtrain COMPONENTS torch): the package config reports the missing component.
    if(NOT ${CMAKE_FIND_PACKAGE_NAME}_FIND_QUIETLY)
      message(STATUS "dtrain: component torch is not available: ${what}")
    endif()
    return()
  endif()
  string(CONCAT how
    "Point CMake at a libtorch >= ${DTRAIN_TORCH_MIN_VERSION}: -DTorch_DIR=<libtorch>/share/cmake/Torch, "
    "or -DCMAKE_PREFIX_PATH=<libtorch prefix> (for a pip install: "
    "python -c 'import torch; print(torch.utils.cmake_prefix_path)'). "
    "tools/setup-libtorch.sh installs the tested one into .venv/.")
  if(DTRAIN_REQUIRE_TORCH)
    message(FATAL_ERROR "dtrain: DTRAIN_REQUIRE_TORCH=ON but ${what}. ${how}")
  endif()
  message(WARNING "dtrain: ${what}; dtrain::torch is not defined and the libtorch tests and "
                  "examples are skipped. ${how}")
endfunction()

# The NCCL that a pip-installed CUDA libtorch loads: site-packages/nvidia/nccl, beside torch/.
function(_dtrain_torch_nccl_dir out prefix)
  set(dir "")
  get_filename_component(site "${prefix}/.." ABSOLUTE)
  if(EXISTS "${site}/nvidia/nccl/include/nccl.h" AND EXISTS "${site}/nvidia/nccl/lib/libnccl.so.2")
    set(dir "${site}/nvidia/nccl")
  endif()
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

# The directory of the TorchConfig.cmake that find_package(Torch) would load: Torch_DIR, else the
# first on CMAKE_PREFIX_PATH and the system paths.
function(_dtrain_torch_config_dir out)
  if(Torch_DIR AND EXISTS "${Torch_DIR}/TorchConfig.cmake")
    set(${out} "${Torch_DIR}" PARENT_SCOPE)
    return()
  endif()
  # Searched afresh every time (a cached answer would outlive a changed CMAKE_PREFIX_PATH).
  find_path(_dtrain_torch_config_probe TorchConfig.cmake
            PATH_SUFFIXES Torch cmake/Torch share/cmake/Torch lib/cmake/Torch
                          lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch)
  set(dir "${_dtrain_torch_config_probe}")
  unset(_dtrain_torch_config_probe CACHE)
  if(NOT dir)
    set(dir "")
  endif()
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

# The version a libtorch package declares (its TorchConfigVersion.cmake), or 0 without one.
function(_dtrain_torch_config_version out dir)
  set(PACKAGE_VERSION 0)
  set(PACKAGE_FIND_VERSION ${DTRAIN_TORCH_MIN_VERSION})
  if(EXISTS "${dir}/TorchConfigVersion.cmake")
    include("${dir}/TorchConfigVersion.cmake")
  endif()
  set(${out} "${PACKAGE_VERSION}" PARENT_SCOPE)
endfunction()

# Note [libtorch without the CUDA toolkit]
# The pinned libtorch is PyPI's torch wheel, which is CUDA-enabled. Its CMake package enables the
# CUDA language and finds the CUDA toolkit, so without nvcc the configure stops, although the CPU
# demo and every CPU test need nothing of CUDA at build time. Where no nvcc is found, dtrain
# therefore does not load that package: it defines libtorch's C++ frontend for CPUs itself from
# the prefix, as dtrain_libtorch_cpu -- the headers, libtorch_cpu and libc10 (libtorch.so would
# also load libtorch_cuda), and torch_cpu's interface definitions. libtorch_cpu loads the CUDA
# runtime it links from the NVIDIA wheels installed beside torch (its RPATH), with no GPU needed;
# torch::cuda::is_available() is false. Installing nvcc from PyPI instead (nvidia-cuda-nvcc) is
# not enough: the package's CUDA language check compiles device code, which needs NVVM and a host
# compiler nvcc accepts, a toolkit in all but name, for a program that runs on CPUs.
function(_dtrain_torch_cpu_target prefix problem_out)
  set(problem "")
  foreach(name IN ITEMS torch_cpu c10)
    if(NOT EXISTS "${prefix}/lib/lib${name}.so")
      set(problem "${prefix}/lib/lib${name}.so is missing")
    endif()
  endforeach()
  if(NOT EXISTS "${prefix}/include/torch/csrc/api/include/torch/torch.h")
    set(problem "${prefix}/include/torch/csrc/api/include/torch/torch.h is missing")
  endif()
  if(NOT problem AND NOT TARGET dtrain_libtorch_cpu)
    # GLOBAL: a project that vendors dtrain links dtrain::torch, and so this target, from its own
    # directories.
    add_library(dtrain_libtorch_cpu INTERFACE IMPORTED GLOBAL)
    set_target_properties(dtrain_libtorch_cpu PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${prefix}/include;${prefix}/include/torch/csrc/api/include"
      INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE"
      INTERFACE_COMPILE_FEATURES cxx_std_20
      INTERFACE_LINK_LIBRARIES "${prefix}/lib/libtorch_cpu.so;${prefix}/lib/libc10.so")
  endif()
  set(${problem_out} "${problem}" PARENT_SCOPE)
endfunction()

# A macro, so find_package(Torch)'s variables and targets belong to the calling directory.
macro(dtrain_find_torch)
  set(DTRAIN_TORCH_FOUND OFF)
  set(DTRAIN_TORCH_CUDA OFF)
  set(_dtrain_torch_ok ON)
  set(_dtrain_torch_cpu_path OFF)
  # Which TorchConfig.cmake, and its version, before loading it: loading runs the package's own
  # checks, and a CUDA-enabled libtorch's package stops the whole configure when the CUDA toolkit
  # is missing, so that case is told apart first.
  _dtrain_torch_config_dir(_dtrain_torch_config)
  if(NOT _dtrain_torch_config)
    _dtrain_torch_unusable("no libtorch CMake package (TorchConfig.cmake) was found")
    set(_dtrain_torch_ok OFF)
  else()
    get_filename_component(_dtrain_torch_prefix "${_dtrain_torch_config}/../../.." ABSOLUTE)
    _dtrain_torch_config_version(_dtrain_torch_version "${_dtrain_torch_config}")
    if(_dtrain_torch_version VERSION_LESS DTRAIN_TORCH_MIN_VERSION)
      _dtrain_torch_unusable("the libtorch found (${_dtrain_torch_config}) is version "
                             "${_dtrain_torch_version}, and dtrain needs ${DTRAIN_TORCH_MIN_VERSION} "
                             "or newer")
      set(_dtrain_torch_ok OFF)
    elseif(EXISTS "${_dtrain_torch_prefix}/lib/libtorch_cuda.so" AND NOT CMAKE_CUDA_COMPILER)
      find_program(_dtrain_torch_nvcc nvcc
                   HINTS ${CUDAToolkit_ROOT} ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
                   PATH_SUFFIXES bin)
      set(_dtrain_torch_has_nvcc "${_dtrain_torch_nvcc}")
      unset(_dtrain_torch_nvcc CACHE)
      if(NOT _dtrain_torch_has_nvcc)
        set(_dtrain_torch_cpu_path ON)  # Note [libtorch without the CUDA toolkit]
      endif()
    endif()
  endif()
  if(_dtrain_torch_ok AND _dtrain_torch_cpu_path)
    _dtrain_torch_cpu_target("${_dtrain_torch_prefix}" _dtrain_torch_cpu_problem)
    if(_dtrain_torch_cpu_problem)
      _dtrain_torch_unusable(
        "the libtorch ${_dtrain_torch_version} at ${_dtrain_torch_prefix} is CUDA-enabled, its "
        "CMake package needs the CUDA toolkit (nvcc), which was not found, and its CPU libraries "
        "cannot be used without it: ${_dtrain_torch_cpu_problem}. Set CUDAToolkit_ROOT or "
        "CUDA_HOME, or put nvcc on PATH")
    else()
      set(DTRAIN_TORCH_FOUND ON)
      set(Torch_VERSION "${_dtrain_torch_version}")
      set(TORCH_LIBRARIES dtrain_libtorch_cpu)
      message(STATUS "dtrain: no CUDA toolkit (nvcc) for the CUDA-enabled libtorch at "
                     "${_dtrain_torch_prefix}: using its CPU libraries without its CMake package "
                     "(programs run on CPUs; dtrain::torch has no device path)")
    endif()
  elseif(_dtrain_torch_ok)
    set(Torch_DIR "${_dtrain_torch_config}" CACHE PATH "libtorch's CMake package" FORCE)
    # Note [libtorch and the CUDA dialect]: CUDA 17 for libtorch's probe, where none was chosen.
    set(_dtrain_torch_cuda_standard OFF)
    if(NOT DEFINED CMAKE_CUDA_STANDARD)
      set(CMAKE_CUDA_STANDARD 17)
      set(_dtrain_torch_cuda_standard ON)
    endif()
    find_package(Torch CONFIG QUIET PATHS "${_dtrain_torch_config}" NO_DEFAULT_PATH)
    if(_dtrain_torch_cuda_standard)
      unset(CMAKE_CUDA_STANDARD)
    endif()
    if(NOT Torch_FOUND)
      _dtrain_torch_unusable("the libtorch CMake package in ${_dtrain_torch_config} did not load")
    else()
      set(DTRAIN_TORCH_FOUND ON)
      if(TORCH_CUDA_LIBRARIES)
        set(DTRAIN_TORCH_CUDA ON)
      endif()
      # Vendored dtrain (add_subdirectory, FetchContent with DTRAIN_WITH_TORCH): the parent project
      # links dtrain::torch, so libtorch's imported targets must be visible there too.
      if(NOT CMAKE_FIND_PACKAGE_NAME AND NOT CMAKE_SOURCE_DIR STREQUAL CMAKE_CURRENT_SOURCE_DIR AND
         NOT CMAKE_VERSION VERSION_LESS 3.21)
        get_directory_property(_dtrain_torch_imported IMPORTED_TARGETS)
        foreach(_dtrain_target IN LISTS _dtrain_torch_imported)
          get_target_property(_dtrain_global ${_dtrain_target} IMPORTED_GLOBAL)
          if(NOT _dtrain_global)
            set_target_properties(${_dtrain_target} PROPERTIES IMPORTED_GLOBAL TRUE)
          endif()
        endforeach()
      endif()
    endif()
  endif()

  # Note [libtorch and NCCL]: the NCCL beside a pip libtorch wins; a cached NCCL that came from an
  # earlier libtorch is forgotten when this one ships none.
  set(_dtrain_torch_nccl "")
  if(DTRAIN_TORCH_CUDA)
    _dtrain_torch_nccl_dir(_dtrain_torch_nccl "${_dtrain_torch_prefix}")
  endif()
  if(_dtrain_torch_nccl)
    set(DTRAIN_NCCL_INCLUDE_DIR "${_dtrain_torch_nccl}/include" CACHE PATH
        "nccl.h for dtrain::cuda (here: the NCCL that libtorch ships)" FORCE)
    set(DTRAIN_NCCL_LIBRARY "${_dtrain_torch_nccl}/lib/libnccl.so.2" CACHE FILEPATH
        "libnccl for dtrain::cuda (here: the NCCL that libtorch ships)" FORCE)
    set(DTRAIN_NCCL_FROM_TORCH ON CACHE INTERNAL "")
  elseif(DTRAIN_NCCL_FROM_TORCH)
    unset(DTRAIN_NCCL_INCLUDE_DIR CACHE)
    unset(DTRAIN_NCCL_LIBRARY CACHE)
    set(DTRAIN_NCCL_FROM_TORCH OFF CACHE INTERNAL "")
  endif()

  if(DTRAIN_TORCH_FOUND)
    if(DTRAIN_TORCH_CUDA)
      set(_dtrain_torch_kind "CUDA-enabled")
      if(_dtrain_torch_nccl)
        string(APPEND _dtrain_torch_kind ", with its NCCL at ${_dtrain_torch_nccl}")
      endif()
    else()
      set(_dtrain_torch_kind "CPU only")
    endif()
    message(STATUS "dtrain: libtorch ${Torch_VERSION} (${_dtrain_torch_kind}) at ${_dtrain_torch_prefix}")
  endif()
endmacro()

# The directory that holds the fmt headers of dtrain's own fmt target, or "" if none is found.
function(_dtrain_fmt_headers_dir out)
  set(found "")
  get_target_property(dirs fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  foreach(dir IN LISTS dirs)
    string(REGEX REPLACE "^\\$<BUILD_INTERFACE:(.*)>$" "\\1" dir "${dir}")
    if(EXISTS "${dir}/fmt/format.h")
      set(found "${dir}/fmt")
      break()
    endif()
  endforeach()
  if(NOT found)
    # An fmt in a standard location (Debian's, in /usr/include) reports no include directory.
    find_path(DTRAIN_FMT_INCLUDE_DIR fmt/format.h DOC "Headers of the fmt dtrain links")
    if(DTRAIN_FMT_INCLUDE_DIR)
      set(found "${DTRAIN_FMT_INCLUDE_DIR}/fmt")
    endif()
  endif()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# dtrain::torch: dtrain, libtorch, and with a CUDA libtorch dtrain::cuda and the CUDA stream hook
# for torch::Tensor (DTRAIN_TORCH_CUDA).
function(dtrain_add_torch_target)
  if(NOT DTRAIN_TORCH_FOUND OR TARGET dtrain_torch)
    return()
  endif()
  add_library(dtrain_torch INTERFACE)
  add_library(dtrain::torch ALIAS dtrain_torch)
  target_link_libraries(dtrain_torch INTERFACE dtrain::dtrain ${TORCH_LIBRARIES})
  # Note [libtorch and {fmt}]
  _dtrain_fmt_headers_dir(fmt_headers)
  if(fmt_headers)
    set(shim "${PROJECT_BINARY_DIR}/dtrain_fmt_first")
    file(MAKE_DIRECTORY "${shim}")
    file(CREATE_LINK "${fmt_headers}" "${shim}/fmt" SYMBOLIC COPY_ON_ERROR)
    target_include_directories(dtrain_torch BEFORE INTERFACE "${shim}")
  else()
    message(WARNING "dtrain: could not locate the headers of fmt::fmt; programs that include "
                    "<torch/torch.h> may see libtorch's own fmt headers instead")
  endif()
  if(DTRAIN_TORCH_CUDA)
    target_compile_definitions(dtrain_torch INTERFACE DTRAIN_TORCH_CUDA=1)
    if(TARGET dtrain::cuda)
      target_link_libraries(dtrain_torch INTERFACE dtrain::cuda)
    elseif(DTRAIN_NCCL_FROM_TORCH AND DTRAIN_NCCL_LIBRARY)
      # Note [libtorch and NCCL]: without dtrain::cuda (the installed package asked only for the
      # torch component) libtorch_cuda still needs the NCCL it ships, not an older one that the
      # linker would otherwise find for it (the CUDA toolkit's, say).
      target_link_libraries(dtrain_torch INTERFACE "${DTRAIN_NCCL_LIBRARY}")
    endif()
  endif()
endfunction()

# Compiles <torch/torch.h> once per build into a precompiled header that `target` reuses: it is
# most of the compile time of a small libtorch source file.
function(dtrain_torch_precompile_headers target)
  if(NOT TARGET dtrain_torch_pch)
    # CONFIGURE writes only when the content changes: a new time stamp would rebuild the header.
    file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/dtrain_torch_pch.cpp"
         CONTENT "// <torch/torch.h>, precompiled\n")
    add_library(dtrain_torch_pch OBJECT "${PROJECT_BINARY_DIR}/dtrain_torch_pch.cpp")
    target_link_libraries(dtrain_torch_pch PRIVATE dtrain::torch)
    target_precompile_headers(dtrain_torch_pch PRIVATE <torch/torch.h>)
  endif()
  target_precompile_headers(${target} REUSE_FROM dtrain_torch_pch)
endfunction()
