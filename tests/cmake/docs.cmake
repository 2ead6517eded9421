# The user guide's shell blocks run on the tiny fixture model (docs/usage.md).
add_test(NAME docs_usage_guide
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs/run_guide.sh
                 ${PROJECT_SOURCE_DIR}/docs/usage.md $<TARGET_FILE:glm5>
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/glm-dsa/tiny.gguf
                 ${CMAKE_CURRENT_SOURCE_DIR}/server)
set_tests_properties(docs_usage_guide PROPERTIES TIMEOUT 600 FAIL_REGULAR_EXPRESSION "FAIL")
