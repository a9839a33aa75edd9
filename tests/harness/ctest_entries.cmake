# Read by ctest, not by cmake (tests/CMakeLists.txt names one call of it per
# binary in TEST_INCLUDE_FILES): the ctest entries of a test binary with
# per-transport cases (GS_TEST_TP), made when ctest starts from what the
# binary says (`BIN --transports`):
#   NAME.<transport>  `BIN --transport <transport>`, for each transport this
#                     machine can use: verbs only where a device has an
#                     active port (inside the tests/rxe-vm guest)
#   NAME              `BIN --transport none`, its other cases, if it has any
# A binary that cannot say (not built yet) is one entry, NAME, that runs it
# whole, so that ctest reports why.
function(gs_ctest_entry name timeout env)
  add_test(${name} ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout} ENVIRONMENT "${env}")
endfunction()

function(gs_ctest_entries name bin timeout env)
  execute_process(COMMAND ${bin} --transports RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
  if(NOT rc EQUAL 0)
    gs_ctest_entry(${name} ${timeout} "${env}" ${bin})
    return()
  endif()
  string(REGEX REPLACE "\n$" "" out "${out}")
  string(REPLACE "\n" ";" groups "${out}")
  foreach(group ${groups})
    if(group STREQUAL "none")
      gs_ctest_entry(${name} ${timeout} "${env}" ${bin} --transport none)
    else()
      gs_ctest_entry(${name}.${group} ${timeout} "${env}" ${bin} --transport ${group})
    endif()
  endforeach()
endfunction()
