# Feature detection with one ✓/✗ line per feature at configure time.

function(weft_feature_line name have detail)
  if(have)
    message(STATUS "weft feature ✓ ${name} ${detail}")
  else()
    message(STATUS "weft feature ✗ ${name} ${detail}")
  endif()
endfunction()

function(_weft_require switch have what)
  if("${${switch}}" STREQUAL "ON" AND NOT have)
    message(FATAL_ERROR "${switch}=ON but ${what} was not found. Install it or configure with -D${switch}=OFF (or AUTO).")
  endif()
endfunction()

macro(weft_feature_mpi)
  set(WEFT_HAVE_MPI FALSE)
  if(NOT WEFT_MPI STREQUAL "OFF")
    find_package(MPI COMPONENTS CXX)
    if(MPI_CXX_FOUND)
      set(WEFT_HAVE_MPI TRUE)
    endif()
  endif()
  _weft_require(WEFT_MPI ${WEFT_HAVE_MPI} "an MPI implementation (Debian: libopenmpi-dev openmpi-bin)")
endmacro()

macro(weft_feature_blas)
  find_package(PkgConfig QUIET)
  set(WEFT_HAVE_BLAS FALSE)
  # The OpenMP build of OpenBLAS shares the kernels' OpenMP thread team; the
  # pthread build keeps a second pool that fights the OpenMP workers for the
  # cores between calls (measured: 137 vs 200 GFLOP/s on a 2-core GEMM).
  find_path(WEFT_OPENBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas-openmp openblas-pthread openblas)
  find_library(WEFT_OPENBLAS_LIB NAMES openblas
               PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
               NO_DEFAULT_PATH)
  set(WEFT_OPENBLAS_VARIANT "openmp")
  if(NOT WEFT_OPENBLAS_LIB)
    find_library(WEFT_OPENBLAS_LIB NAMES openblas)
    set(WEFT_OPENBLAS_VARIANT "pthread: install libopenblas-openmp-dev for one shared thread pool")
  endif()
  if(WEFT_OPENBLAS_INCLUDE AND WEFT_OPENBLAS_LIB)
    set(WEFT_HAVE_BLAS TRUE)
    set(WEFT_BLAS_DETAIL "${WEFT_OPENBLAS_LIB} (${WEFT_OPENBLAS_VARIANT})")
  else()
    set(WEFT_BLAS_DETAIL "(Debian: libopenblas-openmp-dev)")
  endif()
endmacro()

macro(weft_feature_cuda)
  set(WEFT_HAVE_CUDA FALSE)
  set(WEFT_HAVE_NCCL FALSE)
  set(WEFT_CUDA_DETAIL "")
  set(WEFT_NCCL_DETAIL "")
  if(NOT WEFT_CUDA STREQUAL "OFF")
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      enable_language(CUDA)
      find_package(CUDAToolkit)
      if(CUDAToolkit_FOUND)
        set(WEFT_HAVE_CUDA TRUE)
        set(WEFT_CUDA_DETAIL "${CUDAToolkit_VERSION} sm ${CMAKE_CUDA_ARCHITECTURES}")
        find_library(WEFT_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
        find_path(WEFT_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
        if(WEFT_NCCL_LIB AND WEFT_NCCL_INCLUDE)
          set(WEFT_HAVE_NCCL TRUE)
          set(WEFT_NCCL_DETAIL "${WEFT_NCCL_LIB}")
        endif()
      endif()
    endif()
    if(NOT WEFT_HAVE_CUDA)
      set(WEFT_CUDA_DETAIL "(toolkit expected at /usr/local/cuda)")
    endif()
  endif()
  _weft_require(WEFT_CUDA ${WEFT_HAVE_CUDA} "the CUDA toolkit (nvcc, cuBLAS)")
endmacro()

# cuDNN's fused attention (the attn:cudnn kind) through the cuDNN frontend's
# header-only C++ graph API. The frontend comes from the PyPI package
# nvidia-cudnn-frontend (tools/setup.sh installs it), whose headers land in
# the Python purelib's include/; CUDNN_FRONTEND_INCLUDE (a CMake or
# environment variable) points elsewhere. cuDNN 9 itself is looked for beside
# the CUDA toolkit, then on the system. Needs the CUDA backend.
macro(weft_feature_cudnn)
  set(WEFT_HAVE_CUDNN_FRONTEND FALSE)
  set(WEFT_CUDNN_DETAIL "")
  if(WEFT_HAVE_CUDA AND NOT WEFT_CUDNN STREQUAL "OFF")
    set(_weft_purelib_include "")
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(COMMAND ${Python3_EXECUTABLE} -c
                        "import sysconfig; p = sysconfig.get_paths(); print(p['purelib'] + '/include;' + p['platlib'] + '/include')"
                      OUTPUT_VARIABLE _weft_purelib_include OUTPUT_STRIP_TRAILING_WHITESPACE
                      RESULT_VARIABLE _weft_py_rc ERROR_QUIET)
      if(NOT _weft_py_rc EQUAL 0)
        set(_weft_purelib_include "")
      endif()
    endif()
    find_path(WEFT_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h
              HINTS ${CUDNN_FRONTEND_INCLUDE} $ENV{CUDNN_FRONTEND_INCLUDE} ${_weft_purelib_include})
    find_path(WEFT_CUDNN_INCLUDE cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(WEFT_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    set(_weft_cudnn_major 0)
    if(WEFT_CUDNN_INCLUDE)
      file(STRINGS ${WEFT_CUDNN_INCLUDE}/cudnn_version.h _weft_cudnn_v REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
      string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*" "\\1" _weft_cudnn_major "${_weft_cudnn_v}")
      string(REGEX REPLACE ".*CUDNN_MINOR ([0-9]+).*" "\\1" _weft_cudnn_minor "${_weft_cudnn_v}")
      string(REGEX REPLACE ".*CUDNN_PATCHLEVEL ([0-9]+).*" "\\1" _weft_cudnn_patch "${_weft_cudnn_v}")
    endif()
    # The frontend's headers also call NVRTC (kernels/CMakeLists.txt).
    if(WEFT_CUDNN_FRONTEND_INCLUDE AND WEFT_CUDNN_LIB AND _weft_cudnn_major GREATER_EQUAL 9 AND TARGET CUDA::nvrtc)
      set(WEFT_HAVE_CUDNN_FRONTEND TRUE)
      file(STRINGS ${WEFT_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend_version.h _weft_fe_v
           REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
      string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*" "\\1" _weft_fe_major "${_weft_fe_v}")
      string(REGEX REPLACE ".*MINOR_VERSION ([0-9]+).*" "\\1" _weft_fe_minor "${_weft_fe_v}")
      string(REGEX REPLACE ".*PATCH_VERSION ([0-9]+).*" "\\1" _weft_fe_patch "${_weft_fe_v}")
      set(WEFT_CUDNN_DETAIL
          "frontend ${_weft_fe_major}.${_weft_fe_minor}.${_weft_fe_patch} (${WEFT_CUDNN_FRONTEND_INCLUDE}), cuDNN ${_weft_cudnn_major}.${_weft_cudnn_minor}.${_weft_cudnn_patch} (${WEFT_CUDNN_LIB})")
    elseif(NOT WEFT_CUDNN_FRONTEND_INCLUDE)
      set(WEFT_CUDNN_DETAIL "(pip install nvidia-cudnn-frontend, or set CUDNN_FRONTEND_INCLUDE)")
    elseif(NOT TARGET CUDA::nvrtc)
      set(WEFT_CUDNN_DETAIL "(the CUDA toolkit's NVRTC library, which the frontend's headers call, was not found)")
    else()
      set(WEFT_CUDNN_DETAIL "(cuDNN 9 expected at /usr/local/cuda or on the system; found major '${_weft_cudnn_major}')")
    endif()
  elseif(NOT WEFT_HAVE_CUDA)
    set(WEFT_CUDNN_DETAIL "(needs the CUDA backend)")
  endif()
  _weft_require(WEFT_CUDNN ${WEFT_HAVE_CUDNN_FRONTEND} "the cuDNN frontend headers with cuDNN 9 (pip install nvidia-cudnn-frontend)")
endmacro()

# The tokenizers of `weft data prepare` beyond the built-in byte one: PCRE2
# runs a Hugging Face tokenizer.json's pre-tokenizer regex (its JIT and UTF
# mode), libsentencepiece reads a SentencePiece tokenizer.model. Each is its
# own feature: without it weft builds and `--tokenizer` refuses that format,
# naming the package to install.
macro(weft_feature_tokenizers)
  find_package(PkgConfig QUIET)
  set(WEFT_HAVE_PCRE2 FALSE)
  set(WEFT_PCRE2_DETAIL "(Debian: libpcre2-dev)")
  if(NOT WEFT_PCRE2 STREQUAL "OFF" AND PKG_CONFIG_FOUND)
    pkg_check_modules(WEFT_PCRE2_PC QUIET IMPORTED_TARGET libpcre2-8)
    if(WEFT_PCRE2_PC_FOUND)
      set(WEFT_HAVE_PCRE2 TRUE)
      set(WEFT_PCRE2_DETAIL "${WEFT_PCRE2_PC_VERSION}")
    endif()
  endif()
  _weft_require(WEFT_PCRE2 ${WEFT_HAVE_PCRE2} "PCRE2 (Debian: libpcre2-dev)")

  set(WEFT_HAVE_SENTENCEPIECE FALSE)
  set(WEFT_SENTENCEPIECE_DETAIL "(Debian: libsentencepiece-dev)")
  if(NOT WEFT_SENTENCEPIECE STREQUAL "OFF" AND PKG_CONFIG_FOUND)
    pkg_check_modules(WEFT_SENTENCEPIECE_PC QUIET IMPORTED_TARGET sentencepiece)
    if(WEFT_SENTENCEPIECE_PC_FOUND)
      set(WEFT_HAVE_SENTENCEPIECE TRUE)
      set(WEFT_SENTENCEPIECE_DETAIL "${WEFT_SENTENCEPIECE_PC_VERSION}")
    endif()
  endif()
  _weft_require(WEFT_SENTENCEPIECE ${WEFT_HAVE_SENTENCEPIECE}
                "SentencePiece (Debian: libsentencepiece-dev)")
endmacro()

# Precompiled headers. nlohmann/json takes about 4.5 s to parse in every
# translation unit that includes it (fmt 1.3, GoogleTest 2.2), more than the
# code of many of them; CI builds weft twice on two cores. A target with
# several such units parses them once (one header per target, built with
# the target's own flags, so the sanitizer and fuzzer builds get theirs).
# -DWEFT_PCH=OFF builds without them.
option(WEFT_PCH "Precompile nlohmann/json, fmt and GoogleTest in the targets that include them most" ON)
function(weft_precompile target)
  if(NOT WEFT_PCH)
    return()
  endif()
  set(headers <nlohmann/json.hpp> <fmt/format.h> <string> <vector>)
  if("gtest" IN_LIST ARGN)
    list(APPEND headers <gtest/gtest.h>)
  endif()
  list(TRANSFORM headers REPLACE "(.+)" "$<$<COMPILE_LANGUAGE:CXX>:\\1>")
  target_precompile_headers(${target} PRIVATE ${headers})
endfunction()
