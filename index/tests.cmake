# Unit tests of the index (one binary per area; each runs in well under a
# second).
kvtier_add_test(kvtier_index_summary_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/summary/summary_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/summary/summary_builder_test.cc
  LIBS kvtier_index kvtier_testutil LABELS index)
kvtier_add_test(kvtier_index_scorer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/select/scorer_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/placement_test.cc
  LIBS kvtier_index kvtier_testutil LABELS index)
kvtier_add_test(kvtier_index_tree_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/context_tree_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/select/stability_test.cc
  LIBS kvtier_index LABELS index)
kvtier_add_test(kvtier_index_selector_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/select/selector_test.cc ${CMAKE_CURRENT_LIST_DIR}/select/rank_test.cc
  LIBS kvtier_index kvtier_testutil LABELS index)
kvtier_add_test(kvtier_index_key_scorers_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/select/key_scorers_test.cc
  LIBS kvtier_index kvtier_testutil LABELS index)
kvtier_add_test(kvtier_index_level_scorer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/select/level_scorer_test.cc
  LIBS kvtier_index LABELS index)
# Replaces the global operator new (counts allocations): its own binary.
kvtier_add_test(kvtier_index_selector_alloc_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/select/selector_alloc_test.cc
  LIBS kvtier_index LABELS index)
kvtier_add_test(kvtier_index_simd_stats_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels/simd_stats_test.cc
  LIBS kvtier_index LABELS index)
kvtier_add_test(kvtier_index_selkv_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/selkv_test.cc
  LIBS kvtier_index LABELS index)
kvtier_add_test(kvtier_index_int8_dot_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels/int8_dot_test.cc ${CMAKE_CURRENT_LIST_DIR}/select/worker_pool_test.cc
  LIBS kvtier_index LABELS index)
kvtier_add_test(kvtier_index_mass_tree_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/select/mass_tree_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/select/mass_reuse_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/select/copy_tracking_test.cc
  LIBS kvtier_index kvtier_testutil LABELS index)
