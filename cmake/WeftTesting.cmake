# weft_add_test(NAME n SOURCES s... LIBS l... LABELS unit|mpi|gpu|e2e [NP ranks] [TIMEOUT s])
# A GoogleTest binary registered with ctest under a label. With NP the test
# runs under `mpirun --oversubscribe -np NP`. GPU tests exit 77 when no GPU is
# present, which ctest reports as skipped. Tests not labelled gpu run with
# WEFT_DEVICE=cpu.
function(weft_add_test)
  cmake_parse_arguments(T "" "NAME;NP;TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  # The test's own code at -O1, -O0 under the sanitizers (the top-level
  # CMakeLists.txt says why). Tests that run the weft binary and read what
  # it wrote (e2e, and mpi tests that start mpirun themselves, without NP)
  # compute nothing of their own: -O0 always, 40% less compile time than -O1.
  if("e2e" IN_LIST T_LABELS OR ("mpi" IN_LIST T_LABELS AND NOT T_NP))
    target_compile_options(${T_NAME} PRIVATE $<$<CONFIG:Release,RelWithDebInfo,MinSizeRel>:-O0>)
  else()
    target_compile_options(${T_NAME} PRIVATE ${WEFT_LEAN_OPTIMIZE})
  endif()
  # Three or more units parse the common headers once (weft_precompile).
  list(LENGTH T_SOURCES n_sources)
  if(n_sources GREATER_EQUAL 3)
    weft_precompile(${T_NAME} gtest)
  endif()
  if(WEFT_TESTS_NOT_BUILT AND T_NAME MATCHES "${WEFT_TESTS_NOT_BUILT}")
    set_target_properties(${T_NAME} PROPERTIES EXCLUDE_FROM_ALL TRUE)
  endif()
  if(T_NP)
    add_test(NAME ${T_NAME}
             COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${T_NP}
                     $<TARGET_FILE:${T_NAME}>)
    set_tests_properties(${T_NAME} PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  else()
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77)
  # COST: about the seconds it takes on two cores. ctest -j starts the
  # costliest first, so on a fresh clone (no timings of its own yet) the
  # long tests do not start last and leave one core idle at the end.
  if(T_COST)
    set_tests_properties(${T_NAME} PROPERTIES COST ${T_COST})
  endif()
  # Every test but the GPU ones pins the CPU trainer: on a machine with a GPU,
  # `weft train` (which the e2e and mpi tests run) would otherwise pick it,
  # and several ranks would share one device.
  if(NOT "gpu" IN_LIST T_LABELS)
    set_property(TEST ${T_NAME} APPEND PROPERTY ENVIRONMENT "WEFT_DEVICE=cpu")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  # The limits catch hangs; under ASan and UBSan the same work runs 5 to 15
  # times slower, and the two-core machines differ twofold by the hour.
  if(WEFT_SANITIZE)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 2")
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT})
endfunction()
