# glm5 serve end to end: the node suites drive the real server with the official
# openai and @anthropic-ai/sdk clients, and its chat page in Debian's Chromium through
# playwright-core (tests/server/*.test.mjs), and a short load run checks every
# response under concurrency. The HTTP-level and unit tests are the gtest binaries
# test_server_http and test_server_unit.
find_program(NODE_BIN node)
if(NOT NODE_BIN)
  message(FATAL_ERROR "node is required for the server tests (scripts/deps.sh installs it)")
endif()
set(GLM5_SERVER_TESTS ${CMAKE_CURRENT_SOURCE_DIR}/server)
if(NOT EXISTS ${GLM5_SERVER_TESTS}/node_modules/openai/package.json)
  message(WARNING "tests/server/node_modules is missing: run scripts/deps.sh (npm ci in tests/server) "
                  "before ctest, or the server_e2e tests fail")
endif()
set(server_env "GLM5_BINARY=$<TARGET_FILE:glm5>"
               "GLM5_MODEL=${CMAKE_CURRENT_SOURCE_DIR}/data/glm-dsa/tiny.gguf")
foreach(suite chat tools json concurrency speculative anthropic webui compat slots)
  add_test(NAME server_e2e_${suite}
           COMMAND ${NODE_BIN} --test --test-reporter=spec ${GLM5_SERVER_TESTS}/${suite}.test.mjs
           WORKING_DIRECTORY ${GLM5_SERVER_TESTS})
  set_tests_properties(server_e2e_${suite} PROPERTIES TIMEOUT 180 ENVIRONMENT "${server_env}")
endforeach()
# 8 clients for 15 s (the full run is `node tests/server/load.mjs --duration 60`).
add_test(NAME server_load_short
         COMMAND ${NODE_BIN} ${GLM5_SERVER_TESTS}/load.mjs --duration 15 --streams 8
         WORKING_DIRECTORY ${GLM5_SERVER_TESTS})
set_tests_properties(server_load_short PROPERTIES TIMEOUT 180 ENVIRONMENT "${server_env}"
                     PASS_REGULAR_EXPRESSION "PASS")
# The soak's short version: 8 clients for 60 s with cancellations, malformed and
# oversized requests, JSON-schema replies and a small prefix cache (the full run is
# `node tests/server/soak.mjs --duration 600`; docs/reliability.md).
add_test(NAME server_soak_short
         COMMAND ${NODE_BIN} ${GLM5_SERVER_TESTS}/soak.mjs --duration 60 --streams 8
         WORKING_DIRECTORY ${GLM5_SERVER_TESTS})
set_tests_properties(server_soak_short PROPERTIES TIMEOUT 400 ENVIRONMENT "${server_env}"
                     PASS_REGULAR_EXPRESSION "PASS")
