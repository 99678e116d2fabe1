# GPU backend (docs/gpu.md). With -DGLM53_CUDA=ON (sm_90a unless
# CMAKE_CUDA_ARCHITECTURES says otherwise) or -DGLM53_HIP=ON (hipcc/HIP
# language), builds the static library glm53gpu from src/gpu/*.c and
# src/gpu/kernels/*.cu, makes glm53lib define GLM53_HAVE_GPU and link it (so
# every test, bench and the CLI get the gpu backend), and adds the GPU tests
# (tests/gpu, CTest label "gpu": they print "SKIP:" and pass when no device is
# present) and bench/gpu. With both options OFF this file does nothing.
if(NOT GLM53_CUDA AND NOT GLM53_HIP)
  return()
endif()
if(GLM53_CUDA AND GLM53_HIP)
  message(FATAL_ERROR "GLM53_CUDA and GLM53_HIP are exclusive")
endif()

file(GLOB GLM53_GPU_C CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/gpu/*.c)
file(GLOB GLM53_GPU_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/gpu/kernels/*.cu)

if(GLM53_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # H100/H200; one target keeps CI compile time small. 90a: Hopper's own
    # instructions (wgmma, in the MLA flash kernel); its code runs on
    # compute 9.0 only, so another device needs its own target here.
    set(CMAKE_CUDA_ARCHITECTURES 90a)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # glm53lib was created before this file set the architectures; it links
  # the CUDA library, so CMake checks its property too
  set_property(TARGET glm53lib PROPERTY CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES})
  add_library(glm53gpu STATIC ${GLM53_GPU_C} ${GLM53_GPU_KERNELS})
  target_link_libraries(glm53gpu PUBLIC CUDA::cudart CUDA::cublas)
  set(GLM53_GPU_LANG CUDA)
else()
  # Compiled with hipcc through custom commands rather than CMake's HIP
  # language: CMake 3.25 does not find Debian's multiarch ROCm layout.
  # Built and linked on the CPU machines (Debian hipcc 5.2); never run on an
  # AMD GPU here (docs/gpu.md).
  find_program(GLM53_HIPCC hipcc REQUIRED)
  find_library(GLM53_AMDHIP amdhip64 REQUIRED)
  if(NOT GLM53_HIP_ARCH)
    set(GLM53_HIP_ARCH gfx940) # newest target of Debian bookworm's hipcc 5.2 (clang 15); MI300X (gfx942) needs a newer ROCm
  endif()
  find_library(GLM53_HIPBLAS_LIB hipblas)
  find_path(GLM53_HIPBLAS_INC hipblas/hipblas.h)
  set(hip_defs -DGLM53_HIP=1)
  if(GLM53_HIPBLAS_LIB AND GLM53_HIPBLAS_INC)
    list(APPEND hip_defs -DGLM53_HIPBLAS=1)
  else()
    message(STATUS "glm53: hipBLAS not found; every product uses the in-house GEMV (slow prefill)")
  endif()
  file(GLOB GLM53_GPU_HDR ${CMAKE_SOURCE_DIR}/src/gpu/kernels/*.h ${CMAKE_SOURCE_DIR}/src/gpu/kernels/*.cuh)
  set(hip_objs)
  foreach(src ${GLM53_GPU_KERNELS})
    get_filename_component(n ${src} NAME_WE)
    set(o ${CMAKE_BINARY_DIR}/glm53gpu_hip/${n}.o)
    add_custom_command(OUTPUT ${o}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/glm53gpu_hip
      COMMAND ${GLM53_HIPCC} -x hip -std=c++17 --offload-arch=${GLM53_HIP_ARCH} -O2 -fPIC ${hip_defs}
              -I${CMAKE_SOURCE_DIR}/src -I${CMAKE_SOURCE_DIR}/include -c ${src} -o ${o}
      DEPENDS ${src} ${GLM53_GPU_HDR} VERBATIM)
    list(APPEND hip_objs ${o})
  endforeach()
  set_source_files_properties(${hip_objs} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  add_library(glm53gpu STATIC ${GLM53_GPU_C} ${hip_objs})
  target_link_libraries(glm53gpu PUBLIC ${GLM53_AMDHIP} stdc++)
  if(GLM53_HIPBLAS_LIB AND GLM53_HIPBLAS_INC)
    target_link_libraries(glm53gpu PUBLIC ${GLM53_HIPBLAS_LIB})
  endif()
  set(GLM53_GPU_LANG HIP)
endif()

# The directory-wide C warning and sanitizer flags are not nvcc/hipcc
# options: give the kernels their own, the host C files keep the usual ones.
set_property(TARGET glm53gpu PROPERTY COMPILE_OPTIONS
  $<$<COMPILE_LANGUAGE:C>:-Wall$<SEMICOLON>-Wextra$<SEMICOLON>-Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:${GLM53_GPU_LANG}>:-Xcompiler=-Wall$<SEMICOLON>--default-stream=per-thread>)
target_compile_definitions(glm53gpu PRIVATE _GNU_SOURCE)
target_include_directories(glm53gpu PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
# glm53lib's backend.c calls glm53_gpu_backend(); glm53gpu uses the reference
# (layers.h) for its startup validation: a cycle of static libraries, which
# CMake links by repeating them.
target_link_libraries(glm53gpu PUBLIC glm53lib)
target_link_libraries(glm53lib PUBLIC glm53gpu)
target_compile_definitions(glm53lib PUBLIC GLM53_HAVE_GPU)

enable_testing()
file(GLOB GLM53_GPU_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/test_*.c)
foreach(t ${GLM53_GPU_TESTS})
  get_filename_component(name ${t} NAME_WE)
  add_executable(${name} ${t})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE glm53lib)
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  # no device: the test prints "SKIP: <reason>" and exits 0; CTest reports it skipped
  set_tests_properties(${name} PROPERTIES LABELS "gpu;no_asan" SKIP_REGULAR_EXPRESSION "SKIP: ")
endforeach()

file(GLOB GLM53_GPU_BENCH CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/gpu/*.c)
foreach(b ${GLM53_GPU_BENCH})
  get_filename_component(name ${b} NAME_WE)
  add_executable(${name} ${b})
  target_link_libraries(${name} PRIVATE glm53lib)
endforeach()
