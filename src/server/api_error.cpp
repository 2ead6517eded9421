#include "server/api_error.h"

namespace glm5::server {

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code,
                   std::string type)
    : std::runtime_error(message),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)),
      type_(std::move(type)) {
    if (type_.empty()) type_ = status_ >= 500 ? "server_error" : "invalid_request_error";
}

nlohmann::ordered_json ApiError::body() const {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["message"] = what();
    e["type"] = type_;
    e["param"] = param_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param_);
    e["code"] = code_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code_);
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["error"] = std::move(e);
    return j;
}

ApiError request_memory_busy() {
    return ApiError(503, "the server holds too much request memory; retry later", "",
                    "server_busy");
}

ApiError context_length_exceeded(int64_t n_prompt, int64_t n_ctx, const std::string& param) {
    const std::string n = std::to_string(n_prompt), m = std::to_string(n_ctx);
    ApiError e(400,
               "This model's maximum context length is " + m +
                   " tokens. However, your messages "
                   "resulted in " +
                   n + " tokens. Please reduce the length of the messages.",
               param, "context_length_exceeded");
    e.with_anthropic_message("prompt is too long: " + n + " tokens > " + m + " maximum");
    return e;
}

}  // namespace glm5::server
