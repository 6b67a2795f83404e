# kvtier_add_test(NAME SOURCES a.cc b.cc LIBS lib1 lib2 [LABELS l] [SERIAL])
# One GoogleTest binary per call, registered with ctest per test case.
# SERIAL: ctest runs its cases alone (RUN_SERIAL), for tests that measure
# latency ratios and would otherwise share the cores with other tests.
function(kvtier_add_test name)
  cmake_parse_arguments(T "SERIAL" "" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT KVTIER_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${T_SOURCES})
  # absl status and strings: tests/testutil/status_matchers.h, which any
  # test may include.
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main
    absl::status absl::statusor absl::strings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  # A list value would be split into separate PROPERTIES arguments.
  string(REPLACE ";" "\\;" labels "${T_LABELS}")
  if(T_SERIAL)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${labels}" RUN_SERIAL TRUE)
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${labels}")
  endif()
endfunction()
