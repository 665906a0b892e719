# edgepack_tvm.cmake - the CMake that edgepack's three builds against the TVM wheels share:
# runtimes/tvm/runtime (libtvm_ffi + libtvm_runtime) and the GPU plug-ins runtimes/plugins/opencl and
# runtimes/plugins/vulkan. Included with
#
#   include("${CMAKE_CURRENT_LIST_DIR}/../cmake/edgepack_tvm.cmake")
#
# It holds the input checks, the compiler settings, the tvm-ffi include directories, the
# endianness definition and the libraries made from one object library: shared (RUNPATH $ORIGIN,
# gc-sections, stripped in release builds) and static (for --whole-archive links), both in
# <build>/lib. edgepack_tvm_plugin() is a whole GPU plug-in project built from these pieces.

include_guard(GLOBAL)
include(TestBigEndian)

# edgepack_require_set(<var>...): each variable must be set (a -D<var>=... on the command line).
function(edgepack_require_set)
  foreach(var IN LISTS ARGN)
    if(NOT ${var})
      message(FATAL_ERROR "${var} is not set")
    endif()
  endforeach()
endfunction()

# edgepack_require_file(<dir var> <relative path>): the directory in <dir var> must hold the file
# (catches a -D pointing at the wrong directory at configure time, with its name).
function(edgepack_require_file dir_var relpath)
  if(NOT EXISTS "${${dir_var}}/${relpath}")
    message(FATAL_ERROR "${dir_var}=${${dir_var}} has no ${relpath}")
  endif()
endfunction()

# edgepack_compile_defaults(<default build type>): C++17, position-independent code, hidden
# symbols (only what TVM_FFI_DLL_EXPORT marks is exported). A macro: the settings are variables
# that must land in the caller's scope, where the targets are created.
macro(edgepack_compile_defaults default_build_type)
  if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
    set(CMAKE_BUILD_TYPE ${default_build_type} CACHE STRING "build type" FORCE)
  endif()
  set(CMAKE_CXX_STANDARD 17)
  set(CMAKE_CXX_STANDARD_REQUIRED ON)
  set(CMAKE_CXX_EXTENSIONS OFF)
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  set(CMAKE_CXX_VISIBILITY_PRESET hidden)
  set(CMAKE_C_VISIBILITY_PRESET hidden)
  set(CMAKE_VISIBILITY_INLINES_HIDDEN ON)
endmacro()

# edgepack_tvm_ffi_include_dirs(<out var>): tvm_ffi/include, and dlpack where the wheel ships it
# apart from it (3rdparty/dlpack). Needs TVM_FFI_SOURCE_DIR.
function(edgepack_tvm_ffi_include_dirs out)
  set(dirs "${TVM_FFI_SOURCE_DIR}/include")
  if(EXISTS "${TVM_FFI_SOURCE_DIR}/3rdparty/dlpack/include/dlpack/dlpack.h")
    list(APPEND dirs "${TVM_FFI_SOURCE_DIR}/3rdparty/dlpack/include")
  endif()
  set(${out} ${dirs} PARENT_SCOPE)
endfunction()

# edgepack_endian_definition(<out var> [<what>]): TVM_FFI_CMAKE_LITTLE_ENDIAN=0|1 for the target.
# With <what> (code that reads TVM's little-endian module data), a big-endian target is an error.
function(edgepack_endian_definition out)
  test_big_endian(_edgepack_big_endian)
  if(_edgepack_big_endian AND ARGC GREATER 1)
    message(FATAL_ERROR "${ARGV1} reads TVM's little-endian module data; big-endian targets are not supported")
  endif()
  if(_edgepack_big_endian)
    set(${out} TVM_FFI_CMAKE_LITTLE_ENDIAN=0 PARENT_SCOPE)
  else()
    set(${out} TVM_FFI_CMAKE_LITTLE_ENDIAN=1 PARENT_SCOPE)
  endif()
endfunction()

# edgepack_shared_library(<target> <object library> <output name> [NO_UNDEFINED] [LINK <lib>...])
# lib<output name>.so in <build>/lib, found beside its dependencies (RUNPATH $ORIGIN); on Linux
# and Android unused sections dropped, static dependencies' symbols kept private, stripped in
# release builds. NO_UNDEFINED: every symbol must resolve at link time (the plug-ins, whose
# dependencies are all given).
function(edgepack_shared_library target objects output_name)
  cmake_parse_arguments(ARG "NO_UNDEFINED" "" "LINK" ${ARGN})
  add_library(${target} SHARED $<TARGET_OBJECTS:${objects}>)
  target_link_libraries(${target} PRIVATE ${ARG_LINK})
  set_target_properties(${target} PROPERTIES
      OUTPUT_NAME ${output_name}
      LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/lib"
      BUILD_RPATH "\$ORIGIN" INSTALL_RPATH "\$ORIGIN")
  if(CMAKE_SYSTEM_NAME MATCHES "Linux|Android")
    target_link_options(${target} PRIVATE -Wl,--gc-sections -Wl,--exclude-libs,ALL -Wl,-z,noexecstack)
    if(ARG_NO_UNDEFINED)
      target_link_options(${target} PRIVATE -Wl,--no-undefined)
    endif()
    if(CMAKE_BUILD_TYPE MATCHES "MinSizeRel|Release")
      target_link_options(${target} PRIVATE -s)
    endif()
  endif()
endfunction()

# edgepack_static_library(<target> <object library> <output name>): lib<output name>.a in
# <build>/lib, the same objects for static programs.
function(edgepack_static_library target objects output_name)
  add_library(${target} STATIC $<TARGET_OBJECTS:${objects}>)
  set_target_properties(${target} PROPERTIES
      OUTPUT_NAME ${output_name}
      ARCHIVE_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/lib")
endfunction()

# edgepack_tvm_plugin(NAME <name> LABEL <label> SOURCES <file>... [INCLUDES <dir>...])
#
# A GPU runtime plug-in for TVM: libtvm_<name>.so (linked against the target's libtvm_runtime.so
# and libtvm_ffi.so, nothing else: the GPU API is dlopen()ed) and libtvm_<name>.a, from SOURCES
# compiled with -Wall -Wextra against the public TVM headers, runtimes/plugins/gpu-common and INCLUDES
# (more "system" headers). <label> ("OpenCL") names the plug-in in messages. Cache variables, as
# edgepack (edgepack/gpu_plugins.py) and the tests pass them:
#   TVM_SOURCE_DIR, TVM_FFI_SOURCE_DIR   site-packages/tvm and site-packages/tvm_ffi
#   TVM_RUNTIME_LIBRARY, TVM_FFI_LIBRARY the target's shared TVM runtime (for the shared plug-in)
#   EDGEPACK_GPU_COMMON_DIR              runtimes/plugins/gpu-common/include
#   EDGEPACK_<NAME>_VERSION              compiled in as EDGEPACK_<NAME>_VERSION (a string)
#   EDGEPACK_<NAME>_SHARED, _STATIC      which libraries to build (both by default)
#   EDGEPACK_<NAME>_WERROR               -Werror on edgepack's sources
function(edgepack_tvm_plugin)
  cmake_parse_arguments(ARG "" "NAME;LABEL" "SOURCES;INCLUDES" ${ARGN})
  string(TOUPPER "${ARG_NAME}" upper)
  set(prefix "EDGEPACK_${upper}")
  set(TVM_SOURCE_DIR "" CACHE PATH "site-packages/tvm of the apache-tvm wheel (has include/tvm/runtime)")
  set(TVM_FFI_SOURCE_DIR "" CACHE PATH "site-packages/tvm_ffi of the apache-tvm-ffi wheel (has include/tvm/ffi)")
  set(TVM_RUNTIME_LIBRARY "" CACHE FILEPATH "libtvm_runtime.so for the target (only for the shared plug-in)")
  set(TVM_FFI_LIBRARY "" CACHE FILEPATH "libtvm_ffi.so for the target (only for the shared plug-in)")
  set(EDGEPACK_GPU_COMMON_DIR "${CMAKE_CURRENT_SOURCE_DIR}/../gpu-common/include" CACHE PATH
      "runtimes/plugins/gpu-common/include (module data, launch, kernel-cache and device-attribute code of the GPU plug-ins)")
  set(${prefix}_VERSION "0.1.0" CACHE STRING "version string reported by edgepack.${ARG_NAME}.runtime_info")
  option(${prefix}_SHARED "build libtvm_${ARG_NAME}.so" ON)
  option(${prefix}_STATIC "build libtvm_${ARG_NAME}.a" ON)
  option(${prefix}_WERROR "treat warnings in edgepack's sources as errors" OFF)

  edgepack_require_set(TVM_SOURCE_DIR TVM_FFI_SOURCE_DIR)
  edgepack_require_file(TVM_SOURCE_DIR include/tvm/runtime/device_api.h)
  edgepack_require_file(TVM_FFI_SOURCE_DIR include/tvm/ffi/c_api.h)
  edgepack_require_file(EDGEPACK_GPU_COMMON_DIR edgepack_gpu/launch.h)
  if(${prefix}_SHARED AND (NOT EXISTS "${TVM_RUNTIME_LIBRARY}" OR NOT EXISTS "${TVM_FFI_LIBRARY}"))
    message(FATAL_ERROR "the shared plug-in needs TVM_RUNTIME_LIBRARY and TVM_FFI_LIBRARY (the target's "
                        "libtvm_runtime.so and libtvm_ffi.so)")
  endif()

  edgepack_compile_defaults(Release)
  edgepack_tvm_ffi_include_dirs(ffi_includes)
  edgepack_endian_definition(endian "edgepack's ${ARG_LABEL} runtime")

  set(objs edgepack_${ARG_NAME}_objs)
  add_library(${objs} OBJECT ${ARG_SOURCES})
  # the TVM (and GPU API) headers are "system" headers: their warnings are not ours
  target_include_directories(${objs} SYSTEM PRIVATE ${ffi_includes} "${TVM_SOURCE_DIR}/include" ${ARG_INCLUDES})
  target_include_directories(${objs} PRIVATE "${EDGEPACK_GPU_COMMON_DIR}")
  target_compile_definitions(${objs} PRIVATE ${endian} ${prefix}_VERSION="${${prefix}_VERSION}")
  target_compile_options(${objs} PRIVATE -Wall -Wextra -ffunction-sections -fdata-sections)
  if(${prefix}_WERROR)
    target_compile_options(${objs} PRIVATE -Werror)
  endif()

  set(outputs)
  if(${prefix}_SHARED)
    edgepack_shared_library(tvm_${ARG_NAME}_shared ${objs} tvm_${ARG_NAME} NO_UNDEFINED
                            LINK "${TVM_RUNTIME_LIBRARY}" "${TVM_FFI_LIBRARY}" ${CMAKE_DL_LIBS})
    list(APPEND outputs tvm_${ARG_NAME}_shared)
  endif()
  if(${prefix}_STATIC)
    edgepack_static_library(tvm_${ARG_NAME}_static ${objs} tvm_${ARG_NAME})
    list(APPEND outputs tvm_${ARG_NAME}_static)
  endif()
  install(TARGETS ${outputs} LIBRARY DESTINATION lib ARCHIVE DESTINATION lib)

  message(STATUS "edgepack ${ARG_LABEL} runtime: ${CMAKE_CXX_COMPILER} (${CMAKE_SYSTEM_PROCESSOR}), "
                 "shared=${${prefix}_SHARED} static=${${prefix}_STATIC}")
endfunction()
