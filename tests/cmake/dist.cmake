# --layer-split and --tp under mpirun, end to end (tests/dist/layer_split.sh): over
# loopback only, ranks oversubscribed on the CI's two cores.
if(NOT GLM5_DIST_LIB)
  message(FATAL_ERROR "Open MPI is required for the layer-split tests (scripts/deps.sh installs "
                      "openmpi-bin and libopenmpi-dev)")
endif()
foreach(case logits run serve faults bench hosts tp refusals)
  add_test(NAME dist_layer_split_${case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dist/layer_split.sh ${case}
                   $<TARGET_FILE:glm5> ${PROJECT_SOURCE_DIR})
  set_tests_properties(dist_layer_split_${case} PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION "PASS")
endforeach()
# The server again, its model shared by tensor parallelism.
add_test(NAME dist_tp_serve
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dist/layer_split.sh serve $<TARGET_FILE:glm5>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(dist_tp_serve PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION "PASS"
                     ENVIRONMENT "MODE=--tp 2")
