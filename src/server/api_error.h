// Errors a request handler reports to the client, in OpenAI's shape:
//   HTTP <status>  {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// or, on Anthropic's paths, in Anthropic's (anthropic.h). Request parsing throws them; the
// HTTP layer turns them into the reply.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace glm5::server {

class ApiError : public std::runtime_error {
  public:
    // type defaults to "invalid_request_error" for 4xx and "server_error" for 5xx;
    // empty param / code become null.
    ApiError(int status, const std::string& message, std::string param = "", std::string code = "",
             std::string type = "");

    int status() const { return status_; }
    const std::string& type() const { return type_; }
    const std::string& param() const { return param_; }
    const std::string& code() const { return code_; }
    nlohmann::ordered_json body() const;
    // Seconds after which the same request may succeed (a Retry-After header); 0: none.
    int retry_after() const { return retry_after_; }
    ApiError& with_retry_after(int seconds) {
        retry_after_ = seconds;
        return *this;
    }
    // The message in Anthropic's wording where clients match it; empty: what().
    const std::string& anthropic_message() const { return anthropic_message_; }
    ApiError& with_anthropic_message(std::string message) {
        anthropic_message_ = std::move(message);
        return *this;
    }

  private:
    int status_;
    std::string param_, code_, type_;
    int retry_after_ = 0;
    std::string anthropic_message_;
};

// What a JSON value is, for error messages ("an integer", "an object", ...).
inline const char* json_kind(const nlohmann::ordered_json& v) {
    switch (v.type()) {
        case nlohmann::ordered_json::value_t::null:
            return "null";
        case nlohmann::ordered_json::value_t::boolean:
            return "a boolean";
        case nlohmann::ordered_json::value_t::number_integer:
        case nlohmann::ordered_json::value_t::number_unsigned:
            return "an integer";
        case nlohmann::ordered_json::value_t::number_float:
            return "a number";
        case nlohmann::ordered_json::value_t::string:
            return "a string";
        case nlohmann::ordered_json::value_t::array:
            return "an array";
        case nlohmann::ordered_json::value_t::object:
            return "an object";
        default:
            return "something else";
    }
}

// 400 invalid_request_error.
inline ApiError bad_request(const std::string& message, const std::string& param = "",
                            const std::string& code = "invalid_value") {
    return ApiError(400, message, param, code);
}

// 400 context_length_exceeded: a prompt of n_prompt tokens leaves no room for a reply in a
// context of n_ctx. Each API's own wording, which agent clients match to shorten their
// conversation (Claude Code compacts on Anthropic's).
ApiError context_length_exceeded(int64_t n_prompt, int64_t n_ctx, const std::string& param);

// 503 server_busy: what a request would make the server hold does not fit the request
// memory the server allows now (a BudgetHold that is not held).
ApiError request_memory_busy();

}  // namespace glm5::server
