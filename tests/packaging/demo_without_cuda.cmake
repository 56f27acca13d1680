# cmake -DSOURCE_DIR=<dtrain> -DBINARY_DIR=<dir> -DTORCH_PREFIX=<libtorch prefix>
#       -DCUDA_DIRS=<toolkit dirs> -DMPIEXEC=<launcher> -DOPTIONS=<cmake -D...>
#       -P demo_without_cuda.cmake
#
# The README's demo on a machine without the CUDA toolkit (Note [libtorch without the CUDA
# toolkit] in cmake/dtrainTorch.cmake): configures dtrain as tools/demo.sh does (a Release build,
# here with the packaging tests' lighter flags), with the CUDA-enabled libtorch and every CUDA_DIRS
# folder hidden from CMake and from PATH, builds the ResNet trainer and runs it for a few steps on
# 2 ranks. It fails if the configure found a toolkit after all, so it cannot pass by not hiding
# one.
cmake_minimum_required(VERSION 3.23)  # CMAKE_IGNORE_PREFIX_PATH
foreach(var IN ITEMS SOURCE_DIR BINARY_DIR TORCH_PREFIX CUDA_DIRS MPIEXEC)
  if(NOT ${var})
    message(FATAL_ERROR "demo_without_cuda.cmake: pass -D${var}=...")
  endif()
endforeach()

# The toolkit's prefixes: those given, and every one whose bin/ holds an nvcc that PATH or CMake's
# own search would find (some installs put nvcc and the CUDA headers into /usr/local as well).
string(REPLACE ":" ";" path_entries "$ENV{PATH}")
foreach(bin IN LISTS path_entries ITEMS /usr/local/bin /opt/cuda/bin)
  if(EXISTS "${bin}/nvcc")
    get_filename_component(prefix "${bin}" DIRECTORY)
    if(prefix STREQUAL "/usr" OR prefix STREQUAL "/" OR prefix STREQUAL "")
      # Hiding /usr would hide the compiler and MPI too.
      message("SKIPPED: nvcc is in ${bin}, which cannot be hidden from CMake")
      return()
    endif()
    list(APPEND CUDA_DIRS "${prefix}")
  endif()
endforeach()

# Those prefixes, their bin/, include/ and lib folders, and PATH without any of them.
set(ignore_prefixes)
set(ignore_paths)
foreach(dir IN LISTS CUDA_DIRS)
  file(REAL_PATH "${dir}" real)
  foreach(prefix IN ITEMS "${dir}" "${real}")
    list(APPEND ignore_prefixes "${prefix}")
    foreach(sub IN ITEMS bin include lib lib64 targets/x86_64-linux/include
                         targets/x86_64-linux/lib)
      list(APPEND ignore_paths "${prefix}/${sub}")
    endforeach()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES ignore_prefixes)
list(REMOVE_DUPLICATES ignore_paths)
set(path "")
foreach(entry IN LISTS path_entries)
  set(keep ON)
  foreach(dir IN LISTS ignore_prefixes)
    string(FIND "${entry}/" "${dir}/" at)
    if(at EQUAL 0)
      set(keep OFF)
    endif()
  endforeach()
  if(keep AND NOT EXISTS "${entry}/nvcc")
    list(APPEND path "${entry}")
  endif()
endforeach()
string(REPLACE ";" ":" path "${path}")
set(hidden ${CMAKE_COMMAND} -E env --unset=CUDA_HOME --unset=CUDA_PATH --unset=CUDAToolkit_ROOT
    --unset=CUDACXX "PATH=${path}")

file(REMOVE_RECURSE "${BINARY_DIR}")
execute_process(
  COMMAND ${hidden} ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${BINARY_DIR}" ${OPTIONS}
          "-DCMAKE_PREFIX_PATH=${TORCH_PREFIX}" -DDTRAIN_REQUIRE_TORCH=ON
          -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_BENCHMARKS=OFF
          "-DCMAKE_IGNORE_PREFIX_PATH=${ignore_prefixes}" "-DCMAKE_IGNORE_PATH=${ignore_paths}"
  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the configure without the CUDA toolkit failed (${rc})")
endif()
if(NOT out MATCHES "dtrain: no CUDA toolkit \\(nvcc\\) for the CUDA-enabled libtorch")
  message(FATAL_ERROR "the configure did not take libtorch's CPU path: was the CUDA toolkit "
                      "(${CUDA_DIRS}) found after all?")
endif()
file(STRINGS "${BINARY_DIR}/CMakeCache.txt" compilers REGEX "^CMAKE_CUDA_COMPILER:")
if(compilers AND NOT compilers MATCHES "NOTFOUND|=$")
  message(FATAL_ERROR "a CUDA compiler was found although the toolkit is hidden: ${compilers}")
endif()

execute_process(COMMAND ${hidden} ${CMAKE_COMMAND} --build "${BINARY_DIR}" -j 2
                        --target resnet_train
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the demo without the CUDA toolkit failed (${rc})")
endif()

execute_process(
  COMMAND ${hidden} ${MPIEXEC} -n 2 "${BINARY_DIR}/examples/resnet/resnet_train"
          --model resnet8 --dataset synthetic --synthetic-samples 256 --batch-size 16
          --epochs 1 --max-steps-per-epoch 4 --eval-samples 32
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the demo built without the CUDA toolkit failed to run (${rc})")
endif()
