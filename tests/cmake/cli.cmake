# The interactive chat, driven in a pseudo-terminal by expect.
find_program(EXPECT_BIN expect)
if(EXPECT_BIN)
  add_test(NAME cli_chat_pty
           COMMAND ${EXPECT_BIN} ${CMAKE_CURRENT_SOURCE_DIR}/cli/chat.exp $<TARGET_FILE:glm5>
                   ${CMAKE_CURRENT_SOURCE_DIR}/data/glm-dsa/tiny.gguf)
  set_tests_properties(cli_chat_pty PROPERTIES TIMEOUT 180 PASS_REGULAR_EXPRESSION "PASS")
else()
  message(FATAL_ERROR "expect is required for the chat test (scripts/deps.sh installs it)")
endif()

# scripts/run.sh's main job on the embedded (trained) default model prints English.
add_test(NAME cli_default_model_english
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/english_reply.sh $<TARGET_FILE:glm5>)
set_tests_properties(cli_default_model_english PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION "PASS")
