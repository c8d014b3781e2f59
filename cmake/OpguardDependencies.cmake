# Every dependency through find_package; no hand-written system paths.
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(CLI11 CONFIG REQUIRED)
find_package(fmt REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(Threads REQUIRED)
if(OPGUARD_TESTS)
  find_package(doctest REQUIRED)
endif()

if(OPGUARD_TORCH)  # OFF: the torch-free sanitizer and fuzzing builds (tests/sanitize)
# libtorch comes from the pip wheel (a CUDA 13.0 build). Its CMake config wants
# the CUDA toolkit even though we only link the CPU libraries.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED)
# The wheel ships no nvToolsExt; its config refers to the target anyway.
if(NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
endif()
get_filename_component(OPGUARD_TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)
find_library(OPGUARD_TORCH_CPU torch_cpu PATHS ${OPGUARD_TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(OPGUARD_C10 c10 PATHS ${OPGUARD_TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
# CPU-only view of libtorch: headers and torch_cpu/c10, nothing that pulls CUDA
# libraries into our own binaries.
add_library(opguard_torch_cpu INTERFACE)
target_include_directories(opguard_torch_cpu SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_link_libraries(opguard_torch_cpu INTERFACE ${OPGUARD_TORCH_CPU} ${OPGUARD_C10})
target_compile_options(opguard_torch_cpu INTERFACE -D_GLIBCXX_USE_CXX11_ABI=1)
endif()

# OPGUARD_CUDA: ON (fail without nvcc), OFF, or AUTO (build the CUDA kernels
# where nvcc is found; the CPU build works without it). The resolved choice is
# OPGUARD_CUDA_ENABLED.
include(CheckLanguage)
set(OPGUARD_CUDA_ENABLED OFF)
if(OPGUARD_CUDA STREQUAL "AUTO" AND (OPGUARD_SANITIZE OR OPGUARD_FUZZ))
  # The sanitizer and fuzzing sub-builds instrument host code only.
  message(STATUS "opguard: CUDA kernels off (OPGUARD_CUDA=AUTO in a sanitizer or fuzzing build)")
elseif(OPGUARD_CUDA STREQUAL "AUTO" OR OPGUARD_CUDA)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(OPGUARD_CUDA_ENABLED ON)
  elseif(OPGUARD_CUDA STREQUAL "AUTO")
    message(STATUS "opguard: CUDA kernels off (OPGUARD_CUDA=AUTO and nvcc was not found)")
  else()
    message(FATAL_ERROR "OPGUARD_CUDA=ON but nvcc was not found: install the CUDA toolkit or set CUDAToolkit_ROOT")
  endif()
endif()
if(OPGUARD_CUDA_ENABLED)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # torch links the shared cudart (libcudart.so.13); link the same way so one
  # process holds one CUDA runtime.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  if(NOT OPGUARD_CUDA_ARCHITECTURES)
    set(OPGUARD_CUDA_ARCHITECTURES 90)  # H200; pass e.g. "80;90" for more
  endif()
  # nvcc and the toolkit libraries must be one CUDA version (torch's CMake
  # config checks the same); the torch wheel's runtime is loaded beside ours.
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _opguard_nvcc_mm "${CMAKE_CUDA_COMPILER_VERSION}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _opguard_toolkit_mm "${CUDAToolkit_VERSION}")
  if(NOT _opguard_nvcc_mm STREQUAL _opguard_toolkit_mm)
    message(FATAL_ERROR "nvcc is CUDA ${CMAKE_CUDA_COMPILER_VERSION} but the toolkit libraries are "
      "${CUDAToolkit_VERSION}: set CUDAToolkit_ROOT and CMAKE_CUDA_COMPILER to one installation")
  endif()
  message(STATUS "opguard: CUDA kernels on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm ${OPGUARD_CUDA_ARCHITECTURES})")
endif()

# OPGUARD_NCCL: AUTO (with CUDA, where nccl.h and libnccl are found), ON (fail
# without them), OFF. The toolkit here ships both. Resolved: OPGUARD_NCCL_ENABLED.
set(OPGUARD_NCCL_ENABLED OFF)
if(OPGUARD_CUDA_ENABLED AND (OPGUARD_NCCL STREQUAL "AUTO" OR OPGUARD_NCCL))
  find_path(OPGUARD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
  find_library(OPGUARD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib ${CUDAToolkit_ROOT}/lib64)
  if(OPGUARD_NCCL_INCLUDE_DIR AND OPGUARD_NCCL_LIBRARY)
    set(OPGUARD_NCCL_ENABLED ON)
    message(STATUS "opguard: NCCL all-reduce replay on (${OPGUARD_NCCL_LIBRARY})")
  elseif(NOT OPGUARD_NCCL STREQUAL "AUTO")
    message(FATAL_ERROR "OPGUARD_NCCL=ON but nccl.h or libnccl was not found: install NCCL (the CUDA toolkit's, or "
      "libnccl-dev) or set OPGUARD_NCCL_INCLUDE_DIR and OPGUARD_NCCL_LIBRARY")
  endif()
elseif(NOT OPGUARD_CUDA_ENABLED AND OPGUARD_NCCL AND NOT OPGUARD_NCCL STREQUAL "AUTO")
  message(FATAL_ERROR "OPGUARD_NCCL=ON needs CUDA: set OPGUARD_CUDA=ON (or AUTO with nvcc installed)")
endif()
find_program(OPGUARD_PYTHON NAMES python3 python)
