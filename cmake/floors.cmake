# The floors of tiler's units, lowest first (docs/design.md says what each unit is). Every source and header
# of src/ and include/tiler/ is a unit here, by its file stem; a unit may include the headers of its own floor
# and those below, never one above, and LibTorch's headers only from the compute floor up. Configuring checks
# it (tiler_check_floors), so an include that runs up a floor stops the build with the file and the line.
set(tiler_floors
    "ground: error slots fault platform"
    "plain logic: grid sampler cpu_layout cli build_info version queue job_options output_kinds launcher rendezvous npy model_card agent failures options signals streams worker_group handler registry static c10d"
    "pixels: image_io handle_pool remote_input readers tiff_support tiff_reader openslide_reader jpeg_reader opencv_reader resolution mask annotations train_metrics polygons geojson blend zarr_writer map_writers"
    "planning: catalog window_outputs instances"
    "compute: torch_compat runtime_info block_cache model model_runtime torchscript_runtime pt2_runtime dist loader exchange session device_stitch outputs report tasks/task tasks/registry tasks/segment tasks/classify tasks/embed tasks/detect tasks/instances tasks/heads"
    "jobs: pipeline finetune infer/plan infer/forward infer/routing infer/summary infer/job"
    "tools: commands tiler_main ctrun_main bench_main")
set(tiler_first_torch_floor 4)  # compute
# Below the compute floor, the one LibTorch header allowed: c10's zip writer (the features tensor file writes
# torch.save's archive; no tensor library).
set(tiler_floor_torch_exceptions "window_outputs.cpp:caffe2/serialize/inline_container.h")

function(tiler_check_floors)
  set(floor 0)
  foreach(row IN LISTS tiler_floors)
    string(REGEX REPLACE "^[^:]*: " "" units "${row}")
    string(REPLACE " " ";" units "${units}")
    foreach(unit IN LISTS units)
      set(floor_of_${unit} ${floor})
    endforeach()
    math(EXPR floor "${floor} + 1")
  endforeach()
  file(GLOB files ${CMAKE_SOURCE_DIR}/src/*.cpp ${CMAKE_SOURCE_DIR}/src/*.hpp ${CMAKE_SOURCE_DIR}/src/tools/*.cpp
       ${CMAKE_SOURCE_DIR}/src/tools/*.hpp ${CMAKE_SOURCE_DIR}/include/tiler/*.hpp ${CMAKE_SOURCE_DIR}/src/tasks/*.cpp
       ${CMAKE_SOURCE_DIR}/include/tiler/tasks/*.hpp ${CMAKE_SOURCE_DIR}/src/infer/*.cpp
       ${CMAKE_SOURCE_DIR}/include/tiler/infer/*.hpp)
  # ctrun's layers (src/ctrun/, include/tiler/ctrun/): units by their file stems.
  file(GLOB ctrun_files ${CMAKE_SOURCE_DIR}/src/ctrun/*.cpp ${CMAKE_SOURCE_DIR}/src/ctrun/rendezvous/*.cpp
       ${CMAKE_SOURCE_DIR}/include/tiler/ctrun/*.hpp ${CMAKE_SOURCE_DIR}/include/tiler/ctrun/rendezvous/*.hpp)
  list(APPEND files ${ctrun_files})
  set(errors "")
  foreach(file IN LISTS files)
    get_filename_component(unit ${file} NAME_WE)
    # A task's file is unit tasks/<stem> (tasks/instances beside instances), an infer part's infer/<stem>.
    if(file MATCHES "/(tasks|infer)/[^/]*$")
      set(unit ${CMAKE_MATCH_1}/${unit})
    endif()
    get_filename_component(name ${file} NAME)
    file(RELATIVE_PATH shown ${CMAKE_SOURCE_DIR} ${file})
    if(NOT DEFINED floor_of_${unit})
      string(APPEND errors "  ${shown}: unit '${unit}' is on no floor (cmake/floors.cmake)\n")
      continue()
    endif()
    file(STRINGS ${file} includes REGEX "^#include [<\"]")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"tiler/ctrun/(rendezvous/)?" "#include \"tiler/" line "${line}")
      if(line MATCHES "^#include \"(tiler/)?(((tasks|infer)/)?[a-z0-9_]+)\\.hpp\"")
        set(used ${CMAKE_MATCH_2})
        if(DEFINED floor_of_${used} AND floor_of_${used} GREATER floor_of_${unit})
          string(APPEND errors "  ${shown}: ${line} runs up a floor ('${unit}' is below '${used}')\n")
        endif()
      elseif(line MATCHES "^#include <((torch|ATen|c10|caffe2)/[^>]*)>" AND floor_of_${unit} LESS
             tiler_first_torch_floor)
        if(NOT "${name}:${CMAKE_MATCH_1}" IN_LIST tiler_floor_torch_exceptions)
          string(APPEND errors "  ${shown}: ${line}: LibTorch below the compute floor\n")
        endif()
      endif()
    endforeach()
  endforeach()
  if(errors)
    message(FATAL_ERROR "Includes against the floors (cmake/floors.cmake):\n${errors}")
  endif()
endfunction()
