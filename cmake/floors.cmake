# The floors of tiler, lowest first: each is a set of folders (src/<folder>/, headers in include/tiler/<folder>/)
# and one static library (CMakeLists.txt) that links only the floors below it; docs/design.md says what each
# folder holds. A file may include the headers of its own floor and those below, never one above, and LibTorch's
# headers only from the compute floor up (its umbrella headers in no header of ours). Configuring checks it
# (tiler_check_floors): an include that runs up a floor (written "..." or <...>), an umbrella header in a header, a
# source or header in a folder on no floor, or units that include each other around a cycle, stops the build with
# the file and the line.
set(tiler_floors
    "core: core"
    "net: net"
    "ctrun: ctrun ctrun/rendezvous"
    "io: io io/readers"
    "writers: writers"
    "view: view"
    "compute: model dist stitch tasks"
    "jobs: infer finetune"
    "tools: tools")
set(tiler_first_torch_floor 6)  # compute
# Below the compute floor, the one LibTorch header allowed: c10's zip writer (the features tensor file writes
# torch.save's archive; no tensor library).
set(tiler_floor_torch_exceptions "writers/torch_tensor.cpp:caffe2/serialize/inline_container.h")
# LibTorch's umbrella headers, which no header of ours includes: every unit including that header would parse them
# (torch/torch.h 17.5 s, torch/script.h 10.8 s of parsing alone here, against torch/types.h's 8.6). A unit that
# needs TorchScript or torch::nn includes them itself.
set(tiler_header_torch_refused "torch/torch.h" "torch/script.h" "torch/all.h")

function(tiler_check_floors)
  set(floor 0)
  foreach(row IN LISTS tiler_floors)
    string(REGEX REPLACE "^[^:]*: " "" folders "${row}")
    string(REPLACE " " ";" folders "${folders}")
    foreach(folder IN LISTS folders)
      set(floor_of_${folder} ${floor})
    endforeach()
    math(EXPR floor "${floor} + 1")
  endforeach()
  file(GLOB_RECURSE files RELATIVE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src/*.cpp ${CMAKE_SOURCE_DIR}/src/*.hpp
       ${CMAKE_SOURCE_DIR}/include/*.hpp)
  set(errors "")
  foreach(file IN LISTS files)
    # A file's folder: its path less src/ or include/tiler/ and its name.
    string(REGEX REPLACE "^(src|include/tiler)/" "" rel ${file})
    get_filename_component(folder "${rel}" DIRECTORY)
    get_filename_component(dir "${file}" DIRECTORY)
    if("${folder}" STREQUAL "" OR NOT DEFINED floor_of_${folder})
      string(APPEND errors "  ${file}: folder '${folder}' is on no floor (cmake/floors.cmake)\n")
      continue()
    endif()
    file(STRINGS ${CMAKE_SOURCE_DIR}/${file} includes REGEX "^#include [<\"]")
    foreach(line IN LISTS includes)
      set(used "")
      if(line MATCHES "^#include [<\"]tiler/([a-z0-9_/]+)/[a-z0-9_]+\\.hpp[>\"]")
        set(used ${CMAKE_MATCH_1})
      elseif(line MATCHES "^#include \"([a-z0-9_./]+\\.hpp)\"")
        # A private header beside the file (src/), named relative to it.
        get_filename_component(target "${CMAKE_MATCH_1}" ABSOLUTE BASE_DIR ${CMAKE_SOURCE_DIR}/${dir})
        file(RELATIVE_PATH target ${CMAKE_SOURCE_DIR}/src ${target})
        get_filename_component(used "${target}" DIRECTORY)
      elseif(line MATCHES "^#include <((torch|ATen|c10|caffe2)/[^>]*)>" AND floor_of_${folder} LESS
             tiler_first_torch_floor)
        if(NOT "${rel}:${CMAKE_MATCH_1}" IN_LIST tiler_floor_torch_exceptions)
          string(APPEND errors "  ${file}: ${line}: LibTorch below the compute floor\n")
        endif()
      endif()
      if(file MATCHES "\\.hpp$" AND line MATCHES "^#include <([^>]*)>" AND CMAKE_MATCH_1 IN_LIST
         tiler_header_torch_refused)
        string(APPEND errors "  ${file}: ${line}: an umbrella LibTorch header in a header (torch/types.h suffices)\n")
      endif()
      if(NOT "${used}" STREQUAL "")
        if(NOT DEFINED floor_of_${used})
          string(APPEND errors "  ${file}: ${line}: folder '${used}' is on no floor\n")
        elseif(floor_of_${used} GREATER floor_of_${folder})
          string(APPEND errors "  ${file}: ${line} runs up a floor ('${folder}' is below '${used}')\n")
        endif()
      endif()
    endforeach()
  endforeach()
  if(errors)
    message(FATAL_ERROR "Includes against the floors (cmake/floors.cmake):\n${errors}")
  endif()
  # Within a floor and across floors, units that include each other (cmake/check_units.py names the lines).
  find_package(Python3 COMPONENTS Interpreter)
  if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed to check that tiler's units include no cycle (cmake/check_units.py)")
  endif()
  execute_process(COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/cmake/check_units.py ${CMAKE_SOURCE_DIR}
                  OUTPUT_VARIABLE cycles RESULT_VARIABLE cycles_found)
  if(NOT cycles_found EQUAL 0)
    message(FATAL_ERROR "Units that include each other (cmake/check_units.py):\n${cycles}")
  endif()
endfunction()
