# One fat binary for everything that needs libtorch.
add_executable(dedit_engine_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/common/test_util.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/common/qwen3_model_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/common/dedit_drafter_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/common/sampling_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/common/speculative_engine_test.cc)
dedit_target_defaults(dedit_engine_tests)
target_link_libraries(dedit_engine_tests PRIVATE dedit::common
  GTest::gtest GTest::gmock GTest::gtest_main)
target_compile_definitions(dedit_engine_tests PRIVATE
  DEDIT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_precompile_headers(dedit_engine_tests REUSE_FROM dedit_common)
gtest_discover_tests(dedit_engine_tests
  PROPERTIES LABELS "engine"
  DISCOVERY_TIMEOUT 120)
