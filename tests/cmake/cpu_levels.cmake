# The kernel levels this host has below its own (GLM5_CPU forces one): the model
# parity tests run at each, and the SIMD kernel tests at each level that has
# SIMD kernels, so an AVX-512 host also runs the AVX2 kernels end to end. The
# default runs (no GLM5_CPU) cover the host's own level. A level is registered
# only where the host has it, and a skipped test fails the run.
set(glm5_cpu_flags "")
if(EXISTS /proc/cpuinfo)
  file(STRINGS /proc/cpuinfo glm5_cpu_flags REGEX "^flags" LIMIT_COUNT 1)
endif()
set(glm5_levels "")
if(glm5_cpu_flags MATCHES " avx2 " AND glm5_cpu_flags MATCHES " fma " AND glm5_cpu_flags MATCHES " f16c ")
  list(APPEND glm5_levels scalar)
  if(glm5_cpu_flags MATCHES " avx512f " AND glm5_cpu_flags MATCHES " avx512bw " AND
     glm5_cpu_flags MATCHES " avx512vl " AND glm5_cpu_flags MATCHES " avx512dq ")
    list(APPEND glm5_levels avx2)
    if(glm5_cpu_flags MATCHES " avx512_vnni ")
      list(APPEND glm5_levels avx512)
      if(glm5_cpu_flags MATCHES " amx_int8 " AND glm5_cpu_flags MATCHES " amx_tile " AND
         glm5_cpu_flags MATCHES " avx512vbmi ")
        list(APPEND glm5_levels vnni)
      endif()
    endif()
  endif()
endif()
foreach(level ${glm5_levels})
  set(bins test_glm_dsa_parity test_glm5next test_glm5next_state test_cpu_level)
  # The SIMD kernel tests: the single-row i-quant kernels against the reference,
  # the backend's attention, indexer and KDA row helpers against their plain
  # forms, and the multi-activation kernels (at a level without any, none may be
  # offered).
  if(NOT level STREQUAL "scalar")
    list(APPEND bins test_quant_iq_simd test_backend_attention)
  endif()
  list(APPEND bins test_quant_multi)
  # Below an AMX host's own level: the VNNI GEMM the tile kernels stand in for.
  if(level STREQUAL "vnni")
    list(APPEND bins test_quant_repack)
  endif()
  foreach(bin ${bins})
    add_test(NAME cpu_${level}.${bin} COMMAND ${bin})
    set_tests_properties(cpu_${level}.${bin} PROPERTIES
      ENVIRONMENT "GLM5_CPU=${level}" TIMEOUT 900
      FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endforeach()
endforeach()
message(STATUS "kernel levels tested below this host's own: ${glm5_levels}")
