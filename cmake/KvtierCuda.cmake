# Decides whether the CUDA device tier is built.
#   KVTIER_WITH_CUDA=AUTO  build it when nvcc is found (default /usr/local/cuda)
#   KVTIER_WITH_CUDA=ON    require it
#   KVTIER_WITH_CUDA=OFF   never build it
# Result: KVTIER_CUDA_ENABLED (ON/OFF). No GPU driver is needed to compile.
set(KVTIER_CUDA_ENABLED OFF)
if(NOT KVTIER_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(KVTIER_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
    if(KVTIER_NVCC)
      set(CMAKE_CUDA_COMPILER ${KVTIER_NVCC})
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    # sm_80 and sm_90 by default; tests/gpu/run.sh passes only the GPU it
    # runs on, which halves the device compile time.
    set(KVTIER_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to compile for")
    set(CMAKE_CUDA_ARCHITECTURES ${KVTIER_CUDA_ARCHITECTURES})
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(KVTIER_CUDA_ENABLED ON)
  elseif(KVTIER_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVTIER_WITH_CUDA=ON but nvcc was not found (set CUDA_HOME or CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "kvtier: CUDA device tier ${KVTIER_CUDA_ENABLED}")
