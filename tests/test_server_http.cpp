// glm5 serve at the HTTP level: every kind of bad input gets a 4xx JSON error in
// OpenAI's shape and the server goes on serving; the API key; SIGINT / SIGTERM finish
// or cancel what is in flight and exit with code 0.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/server_process.h"
#include "server/shared_server.h"

using glm5::test::http_get;
using glm5::test::http_post;
using glm5::test::HttpReply;
using glm5::test::ServerProcess;
using glm5::test::SharedServer;
using json = nlohmann::json;

namespace {

const std::string kModel = std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf";

std::string chat_body(const std::string& extra) {
    return R"({"messages":[{"role":"user","content":"Hello there"}],"temperature":0,"max_tokens":4)" +
           (extra.empty() ? "" : "," + extra) + "}";
}

void expect_api_error(const HttpReply& r, int status, const std::string& param,
                      const std::string& code) {
    EXPECT_EQ(r.status, status) << r.raw.substr(0, 2000);
    EXPECT_NE(r.headers.find("application/json"), std::string::npos) << r.headers;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    const json& e = j["error"];
    ASSERT_TRUE(e.is_object());
    ASSERT_TRUE(e.contains("message") && e["message"].is_string());
    EXPECT_FALSE(e["message"].get<std::string>().empty());
    EXPECT_EQ(e.value("type", ""), status >= 500 ? "server_error" : "invalid_request_error");
    ASSERT_TRUE(e.contains("param"));
    ASSERT_TRUE(e.contains("code"));
    if (param.empty()) {
        EXPECT_TRUE(e["param"].is_null()) << e.dump();
    } else {
        EXPECT_EQ(e["param"], param) << e.dump();
    }
    if (!code.empty()) {
        EXPECT_EQ(e["code"], code) << e.dump();
    }
}

class ServerHttp : public SharedServer<ServerHttp> {
  public:
    static std::vector<std::string> flags() {
        return {"-m",         kModel, "--port",     "0",   "-t",         "1",
                "--ctx-size", "256",  "--max-body", "64K", "--parallel", "2"};
    }

  protected:
    // A good request right after a bad one still gets its reply.
    void expect_still_serving() {
        const HttpReply r = http_post(port(), "/v1/chat/completions", chat_body(""));
        ASSERT_EQ(r.status, 200) << r.raw;
        json j = json::parse(r.body);
        EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
        EXPECT_GE(j["usage"]["completion_tokens"].get<int>(), 1);
    }
};

struct BadCase {
    const char* what;
    const char* path;
    std::string body;
    int status;
    const char* param;  // "" = null
    const char* code;   // "" = not checked
};

TEST_F(ServerHttp, MalformedRequestsGetOpenAIErrors) {
    const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
    const std::string long_text(4000, 'x');
    std::string deep(5000, '[');
    const std::vector<BadCase> cases = {
        {"not JSON", "/v1/chat/completions", "{\"messages\": [", 400, "", "invalid_json"},
        {"empty body", "/v1/chat/completions", "", 400, "", "invalid_json"},
        {"JSON array body", "/v1/chat/completions", "[1,2]", 400, "", "invalid_json"},
        {"invalid UTF-8", "/v1/chat/completions", "{\"messages\":\"\xff\xfe\"}", 400, "",
         "invalid_json"},
        {"nested too deep", "/v1/chat/completions", deep, 400, "", "invalid_json"},
        {"no messages", "/v1/chat/completions", R"({"temperature":0})", 400, "messages",
         "missing_required_parameter"},
        {"messages not an array", "/v1/chat/completions", R"({"messages":"hi"})", 400, "messages",
         "invalid_type"},
        {"messages empty", "/v1/chat/completions", R"({"messages":[]})", 400, "messages", ""},
        {"message without role", "/v1/chat/completions", R"({"messages":[{"content":"hi"}]})", 400,
         "messages", ""},
        {"unknown role", "/v1/chat/completions",
         R"({"messages":[{"role":"wizard","content":"hi"}]})", 400, "messages", ""},
        {"content a number", "/v1/chat/completions",
         R"({"messages":[{"role":"user","content":5}]})", 400, "messages", ""},
        {"unknown model", "/v1/chat/completions", "{\"model\":\"gpt-9\"," + msgs + "}", 404,
         "model", "model_not_found"},
        {"model not a string", "/v1/chat/completions", "{\"model\":7," + msgs + "}", 400, "model",
         "invalid_type"},
        {"temperature a string", "/v1/chat/completions", "{\"temperature\":\"hot\"," + msgs + "}",
         400, "temperature", "invalid_type"},
        {"temperature negative", "/v1/chat/completions", "{\"temperature\":-1," + msgs + "}", 400,
         "temperature", ""},
        {"top_p above 1", "/v1/chat/completions", "{\"top_p\":1.5," + msgs + "}", 400, "top_p", ""},
        {"max_tokens 0", "/v1/chat/completions", "{\"max_tokens\":0," + msgs + "}", 400,
         "max_tokens", ""},
        {"max_tokens negative", "/v1/chat/completions", "{\"max_tokens\":-3," + msgs + "}", 400,
         "max_tokens", ""},
        {"max_tokens a string", "/v1/chat/completions", "{\"max_tokens\":\"10\"," + msgs + "}", 400,
         "max_tokens", "invalid_type"},
        {"max_tokens fractional", "/v1/chat/completions", "{\"max_tokens\":2.5," + msgs + "}", 400,
         "max_tokens", "invalid_type"},
        {"max_completion_tokens 0", "/v1/chat/completions",
         "{\"max_completion_tokens\":0," + msgs + "}", 400, "max_completion_tokens", ""},
        {"n 0", "/v1/chat/completions", "{\"n\":0," + msgs + "}", 400, "n", ""},
        {"stream not a boolean", "/v1/chat/completions", "{\"stream\":\"yes\"," + msgs + "}", 400,
         "stream", "invalid_type"},
        {"stream_options without stream", "/v1/chat/completions",
         "{\"stream_options\":{\"include_usage\":true}," + msgs + "}", 400, "stream_options", ""},
        {"stop a number", "/v1/chat/completions", "{\"stop\":5," + msgs + "}", 400, "stop",
         "invalid_type"},
        {"stop empty string", "/v1/chat/completions", "{\"stop\":[\"\"]," + msgs + "}", 400, "stop",
         ""},
        {"top_logprobs over 20", "/v1/chat/completions",
         "{\"logprobs\":true,\"top_logprobs\":50," + msgs + "}", 400, "top_logprobs", ""},
        {"top_logprobs without logprobs", "/v1/chat/completions",
         "{\"top_logprobs\":2," + msgs + "}", 400, "top_logprobs", ""},
        {"presence_penalty out of range", "/v1/chat/completions",
         "{\"presence_penalty\":5," + msgs + "}", 400, "presence_penalty", ""},
        {"a GBNF grammar", "/v1/chat/completions", "{\"grammar\":\"root ::= x\"," + msgs + "}", 400,
         "grammar", "unsupported_parameter"},
        {"logprobs with echo", "/v1/completions", R"({"prompt":"a","echo":true,"logprobs":2})", 400,
         "logprobs", "unsupported_parameter"},
        {"prompt longer than the context", "/v1/chat/completions",
         R"({"messages":[{"role":"user","content":")" + long_text + "\"}]}", 400, "messages",
         "context_length_exceeded"},
        {"response_format unknown type", "/v1/chat/completions",
         "{\"response_format\":{\"type\":\"yaml\"}," + msgs + "}", 400, "response_format", ""},
        {"response_format not an object", "/v1/chat/completions",
         "{\"response_format\":\"json\"," + msgs + "}", 400, "response_format", "invalid_type"},
        {"unsupported schema keyword", "/v1/chat/completions",
         R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"^a+$"}}},)" +
             msgs + "}",
         400, "response_format", ""},
        {"unsupported schema keyword (minimum)", "/v1/chat/completions",
         R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"integer","minimum":3}}}}},)" +
             msgs + "}",
         400, "response_format", ""},
        {"tools not an array", "/v1/chat/completions", "{\"tools\":{}," + msgs + "}", 400, "tools",
         "invalid_type"},
        {"tool without a name", "/v1/chat/completions",
         "{\"tools\":[{\"type\":\"function\",\"function\":{}}]," + msgs + "}", 400, "tools", ""},
        {"tool schema with an unknown type", "/v1/chat/completions",
         R"({"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"x":{"type":"nonsense"}}}}}],"tool_choice":"required",)" +
             msgs + "}",
         400, "tools", ""},
        {"tool schema that is a $ref to itself", "/v1/chat/completions",
         R"({"tools":[{"type":"function","function":{"name":"a","parameters":{"$ref":"#"}}}],)" +
             msgs + "}",
         400, "tools", ""},
        {"tool schema with a $ref cycle", "/v1/chat/completions",
         R"({"tools":[{"type":"function","function":{"name":"a","parameters":{"$defs":{"p":{"$ref":"#/$defs/q"},"q":{"$ref":"#/$defs/p"}},"$ref":"#/$defs/p"}}}],)" +
             msgs + "}",
         400, "tools", ""},
        {"tool schema with a required recursion", "/v1/chat/completions",
         R"({"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"self":{"$ref":"#"}},"required":["self"]}}}],"tool_choice":"required",)" +
             msgs + "}",
         400, "tools", ""},
        {"tool_choice names a missing tool", "/v1/chat/completions",
         R"({"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":{"type":"function","function":{"name":"b"}},)" +
             msgs + "}",
         400, "tool_choice", ""},
        {"tool_choice required without tools", "/v1/chat/completions",
         "{\"tool_choice\":\"required\"," + msgs + "}", 400, "tool_choice", ""},
        {"tool_choice unknown", "/v1/chat/completions",
         "{\"tool_choice\":\"sometimes\"," + msgs + "}", 400, "tool_choice", ""},
        {"reasoning_effort unknown", "/v1/chat/completions",
         "{\"reasoning_effort\":\"extreme\"," + msgs + "}", 400, "reasoning_effort", ""},
        {"think not a boolean", "/v1/chat/completions", "{\"think\":1," + msgs + "}", 400, "think",
         "invalid_type"},
        {"completion without prompt", "/v1/completions", R"({"max_tokens":3})", 400, "prompt",
         "missing_required_parameter"},
        {"completion prompt a number", "/v1/completions", R"({"prompt":12})", 400, "prompt",
         "invalid_type"},
        {"completion token outside the vocabulary", "/v1/completions", R"({"prompt":[1,2,99999]})",
         400, "prompt", ""},
        {"completion empty prompt", "/v1/completions", R"({"prompt":""})", 400, "prompt", ""},
        {"completion suffix", "/v1/completions", R"({"prompt":"a","suffix":"b"})", 400, "suffix",
         "unsupported_parameter"},
    };
    for (const BadCase& c : cases) {
        SCOPED_TRACE(c.what);
        expect_api_error(http_post(port(), c.path, c.body), c.status, c.param, c.code);
        expect_still_serving();
    }
}

// ---- agent clients: the context, count_tokens, structured output, billing header ----------

namespace {

// A user message of `words` words (the same tokens each).
json user_words(int words) {
    std::string text;
    for (int i = 0; i < words; ++i) text += "word ";
    return json::array({{{"role", "user"}, {"content", text}}});
}

int64_t count_tokens(int port, const json& body) {
    const HttpReply r = http_post(port, "/v1/messages/count_tokens", body.dump());
    EXPECT_EQ(r.status, 200) << r.raw.substr(0, 2000);
    const json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j.value("input_tokens", int64_t(-1)) : -1;
}

}  // namespace

// Claude Code asks for max_tokens 32000 whatever the context: the reply runs to the
// context's end and says so (stop_reason max_tokens, finish_reason length).
TEST_F(ServerHttp, MaxTokensPastTheContextRunsToItsEnd) {
    json body = {{"model", "claude-x"},
                 {"max_tokens", 32000},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    const HttpReply r = http_post(port(), "/v1/messages", body.dump());
    ASSERT_EQ(r.status, 200) << r.raw.substr(0, 2000);
    const json j = json::parse(r.body);
    EXPECT_EQ(j["stop_reason"], "max_tokens") << r.body.substr(0, 500);
    const json& u = j["usage"];
    const int64_t prompt =
        u["input_tokens"].get<int64_t>() + u["cache_read_input_tokens"].get<int64_t>();
    EXPECT_EQ(prompt, count_tokens(port(), body));
    EXPECT_EQ(prompt + u["output_tokens"].get<int64_t>(), 256) << u.dump();

    const json chat = {{"max_tokens", 32000},
                       {"temperature", 0},
                       {"ignore_eos", true},
                       {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    const HttpReply c = http_post(port(), "/v1/chat/completions", chat.dump());
    ASSERT_EQ(c.status, 200) << c.raw.substr(0, 2000);
    const json cj = json::parse(c.body);
    EXPECT_EQ(cj["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(cj["usage"]["prompt_tokens"].get<int64_t>() +
                  cj["usage"]["completion_tokens"].get<int64_t>(),
              256)
        << cj["usage"].dump();
}

// A prompt that alone fills the context: Anthropic's wording on /v1/messages (Claude Code
// compacts its conversation on it), OpenAI's on the OpenAI endpoints.
TEST_F(ServerHttp, PromptPastTheContextGetsEachAPIsWording) {
    const json msgs = user_words(150);
    const json anth = {{"model", "claude-x"}, {"max_tokens", 10}, {"messages", msgs}};
    const int64_t n = count_tokens(port(), anth);
    EXPECT_GT(n, 256);
    HttpReply r = http_post(port(), "/v1/messages", anth.dump());
    EXPECT_EQ(r.status, 400) << r.raw.substr(0, 2000);
    EXPECT_EQ(json::parse(r.body), json({{"type", "error"},
                                         {"error",
                                          {{"type", "invalid_request_error"},
                                           {"message", "prompt is too long: " + std::to_string(n) +
                                                           " tokens > 256 maximum"}}}}));

    r = http_post(port(), "/v1/chat/completions", json({{"messages", msgs}}).dump());
    EXPECT_EQ(r.status, 400) << r.raw.substr(0, 2000);
    json e = json::parse(r.body)["error"];
    const std::string m = e.value("message", "");
    const std::string head =
        "This model's maximum context length is 256 tokens. However, your "
        "messages resulted in ";
    ASSERT_EQ(m.substr(0, head.size()), head) << m;
    const int64_t chat_n = std::stoll(m.substr(head.size()));
    EXPECT_GT(chat_n, 256);
    EXPECT_EQ(e, json({{"message", head + std::to_string(chat_n) +
                                       " tokens. Please reduce the length of the messages."},
                       {"type", "invalid_request_error"},
                       {"param", "messages"},
                       {"code", "context_length_exceeded"}}));

    std::string words;
    for (int i = 0; i < 150; ++i) words += "word ";
    r = http_post(port(), "/v1/completions", json({{"prompt", words}}).dump());
    EXPECT_EQ(r.status, 400) << r.raw.substr(0, 2000);
    e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], "prompt");
    EXPECT_EQ(e["code"], "context_length_exceeded");
    expect_still_serving();
}

// count_tokens only tokenizes: a prompt longer than the context is counted.
TEST_F(ServerHttp, CountTokensCountsPastTheContext) {
    const int64_t small = count_tokens(port(), {{"messages", user_words(100)}});
    const int64_t big = count_tokens(port(), {{"messages", user_words(1000)}});
    EXPECT_GT(small, 100);
    EXPECT_GT(big, 1000);
    const int64_t two = count_tokens(port(), {{"messages", user_words(200)}});
    EXPECT_EQ(big - small, (two - small) * 9);  // every word its tokens, however many
}

// output_config.format constrains the reply to the schema (Claude Code's title request,
// the SDK's messages.parse).
TEST_F(ServerHttp, OutputConfigFormatConstrainsTheReply) {
    const json schema = {
        {"type", "object"},
        {"properties",
         {{"title", {{"type", "string"}, {"maxLength", 12}}}, {"done", {{"type", "boolean"}}}}},
        {"required", {"title", "done"}},
        {"additionalProperties", false}};
    for (const char* spelling : {"output_config", "output_format"}) {
        SCOPED_TRACE(spelling);
        json body = {{"model", "claude-x"},
                     {"max_tokens", 60},
                     {"temperature", 0},
                     {"messages", {{{"role", "user"}, {"content", "Title this chat"}}}}};
        const json fmt = {{"type", "json_schema"}, {"schema", schema}};
        if (std::string(spelling) == "output_config")
            body["output_config"] = {{"format", fmt}};
        else
            body["output_format"] = fmt;
        const HttpReply r = http_post(port(), "/v1/messages", body.dump());
        ASSERT_EQ(r.status, 200) << r.raw.substr(0, 2000);
        const json j = json::parse(r.body);
        ASSERT_EQ(j["content"].size(), 1u) << r.body;
        EXPECT_EQ(j["stop_reason"], "end_turn") << r.body;
        const json out = json::parse(j["content"][0].value("text", ""), nullptr, false);
        ASSERT_TRUE(out.is_object()) << r.body;
        EXPECT_EQ(out.size(), 2u) << out.dump();
        ASSERT_TRUE(out.contains("title") && out["title"].is_string()) << out.dump();
        const std::string title = out["title"].get<std::string>();
        size_t chars = 0;  // maxLength counts characters
        for (unsigned char ch : title) chars += (ch & 0xC0) != 0x80;
        EXPECT_LE(chars, 12u) << title;
        ASSERT_TRUE(out.contains("done") && out["done"].is_boolean()) << out.dump();
    }
    json bad = {{"max_tokens", 10},
                {"output_config", {{"effort", "extreme"}}},
                {"messages", {{{"role", "user"}, {"content", "x"}}}}};
    const HttpReply r = http_post(port(), "/v1/messages", bad.dump());
    EXPECT_EQ(r.status, 400);
    const json j = json::parse(r.body);
    EXPECT_EQ(j["type"], "error");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("output_config.effort"),
              std::string::npos);
}

// Claude Code's x-anthropic-billing-header system block changes between requests: it is
// not part of the prompt.
TEST_F(ServerHttp, BillingHeaderBlockIsNotThePrompts) {
    auto body = [](const std::string& cch) {
        return json{{"model", "claude-x"},
                    {"system",
                     {{{"type", "text"},
                       {"text",
                        "x-anthropic-billing-header: cc_version=2.1.3; "
                        "cc_entrypoint=cli; cch=" +
                            cch + ";"}},
                      {{"type", "text"}, {"text", "You are a helpful assistant."}}}},
                    {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    };
    const int64_t a = count_tokens(port(), body("0f3a1"));
    EXPECT_EQ(a, count_tokens(port(), body("9b27c4d88e")));
    json plain = body("x");
    plain["system"].erase(0);
    EXPECT_EQ(a, count_tokens(port(), plain));
}

// Recursion through optional members is a legal tool schema, and a forced call of
// it is a call, with keywords the grammar does not enforce accepted.
TEST(ServerTools, RecursiveToolSchemaThroughOptionalMembersIsCalled) {
    ServerProcess server({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "2048"});
    ASSERT_GT(server.port(), 0) << server.log();
    const std::string body =
        R"({"messages":[{"role":"user","content":"Make a tree"}],"temperature":0,"max_tokens":60,)"
        R"("tools":[{"type":"function","function":{"name":"tree","parameters":{"type":"object",)"
        R"("properties":{"label":{"type":"string","pattern":"^[a-z]+$"},"children":{"type":"array",)"
        R"("items":{"$ref":"#"}}},"required":["label"]}}}],"tool_choice":"required"})";
    const HttpReply r = http_post(server.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.raw.substr(0, 2000);
    const json j = json::parse(r.body);
    const json& m = j["choices"][0]["message"];
    ASSERT_TRUE(m.contains("tool_calls")) << r.body;
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "tree");
    EXPECT_TRUE(m["content"].is_null()) << r.body;
}

TEST_F(ServerHttp, OversizedBodyIs413) {
    const std::string big =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"" + std::string(70000, 'a') + "\"}]}";
    expect_api_error(http_post(port(), "/v1/chat/completions", big), 413, "", "body_too_large");
    expect_still_serving();
}

TEST_F(ServerHttp, UnknownEndpointsAndBrokenHttp) {
    expect_api_error(http_get(port(), "/v1/engines"), 404, "", "not_found");
    expect_api_error(http_get(port(), "/v1/chat/completions"), 404, "", "not_found");
    expect_api_error(http_get(port(), "/v1/models/gpt-9"), 404, "model", "model_not_found");
    const HttpReply r = glm5::test::http_raw(port(), "NONSENSE\r\n\r\n");
    EXPECT_EQ(r.status, 400) << r.raw;
    expect_still_serving();
}

TEST_F(ServerHttp, HealthModelsMetrics) {
    const HttpReply h = http_get(port(), "/health");
    ASSERT_EQ(h.status, 200);
    EXPECT_EQ(json::parse(h.body)["status"], "ok");
    const HttpReply m = http_get(port(), "/v1/models");
    ASSERT_EQ(m.status, 200);
    const json models = json::parse(m.body);
    ASSERT_EQ(models["data"].size(), 1u);
    // The model id is the GGUF's general.name; it is accepted back in requests.
    const std::string id = models["data"][0]["id"];
    EXPECT_EQ(id, "GLM-DSA random test fixture (tiny)");
    EXPECT_EQ(
        http_post(port(), "/v1/chat/completions", chat_body("\"model\":" + json(id).dump())).status,
        200);
    EXPECT_EQ(
        http_post(port(), "/v1/chat/completions", chat_body("\"model\":\"tiny.gguf\"")).status,
        200);
    const HttpReply one = http_get(port(), "/v1/models/" + std::string("tiny.gguf"));
    EXPECT_EQ(one.status, 200);
    const std::string metrics = http_get(port(), "/metrics").body;
    for (const char* name :
         {"glm5_requests_total", "glm5_prompt_tokens_total", "glm5_generated_tokens_total",
          "glm5_generated_tokens_per_second", "glm5_queue_depth", "glm5_busy_slots"})
        EXPECT_GE(glm5::test::metric_value(metrics, name), 0) << name << "\n" << metrics;
    EXPECT_EQ(glm5::test::metric_value(metrics, "glm5_slots"), 2);
    EXPECT_GT(glm5::test::metric_value(metrics, "glm5_generated_tokens_total"), 0);
    EXPECT_NE(metrics.find("glm5_http_responses_total{code=\"200\"}"), std::string::npos);
}

TEST(ServerAuth, ApiKeyGuardsTheApi) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--api-key", "sekrit"});
    ASSERT_GT(s.port(), 0) << s.log();
    expect_api_error(http_post(s.port(), "/v1/chat/completions", chat_body("")), 401, "",
                     "invalid_api_key");
    expect_api_error(http_post(s.port(), "/v1/chat/completions", chat_body(""),
                               "Authorization: Bearer wrong\r\n"),
                     401, "", "invalid_api_key");
    expect_api_error(http_get(s.port(), "/v1/models"), 401, "", "invalid_api_key");
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", chat_body(""),
                        "Authorization: Bearer sekrit\r\n")
                  .status,
              200);
    EXPECT_EQ(http_get(s.port(), "/health").status, 200);  // probes need no key
}

// Streams a long reply on its own connection; the raw bytes come back when the
// server closes it.
struct BackgroundStream {
    explicit BackgroundStream(int port, int max_tokens) {
        sock = glm5::test::connect_loopback(port);
        const std::string body =
            R"({"messages":[{"role":"user","content":"Tell me a long story"}],"temperature":0,"ignore_eos":true,"stream":true,"max_tokens":)" +
            std::to_string(max_tokens) + "}";
        glm5::test::send_all(sock, glm5::test::http_request("POST", "/v1/chat/completions", body));
        // Wait for the first chunk: the request is being generated.
        char buf[4096];
        const ssize_t n = ::recv(sock, buf, sizeof(buf), 0);
        if (n > 0) raw.append(buf, size_t(n));
        started = n > 0;  // read here: `raw` belongs to the reader from now on
        reader = std::thread([this] {
            char b[65536];
            for (;;) {
                const ssize_t k = ::recv(sock, b, sizeof(b), 0);
                if (k <= 0) break;
                raw.append(b, size_t(k));
            }
        });
    }
    std::string finish() {
        reader.join();
        ::close(sock);
        return glm5::test::parse_reply(raw).body;
    }
    int sock = -1;
    std::string raw;
    bool started = false;
    std::thread reader;
};

TEST(ServerShutdown, SigtermFinishesInFlightStreamsAndExitsZero) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    BackgroundStream stream(s.port(), 2500);
    ASSERT_TRUE(stream.started);
    s.signal(SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    // Draining: new work is refused, the stream goes on.
    const HttpReply refused = http_post(s.port(), "/v1/chat/completions", chat_body(""));
    if (refused.status != 0) expect_api_error(refused, 503, "", "shutting_down");
    const std::string body = stream.finish();
    EXPECT_NE(body.find("\"finish_reason\":\"length\""), std::string::npos)
        << body.substr(body.size() - 500);
    EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
    EXPECT_EQ(s.wait_exit(std::chrono::seconds(30)), 0) << s.log();
    EXPECT_NE(s.log().find("stopped"), std::string::npos);
}

TEST(ServerShutdown, SecondSigintCancelsAndExitsZero) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "100000"});
    ASSERT_GT(s.port(), 0) << s.log();
    BackgroundStream stream(s.port(), 90000);  // minutes of work
    s.signal(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    s.signal(SIGINT);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string body = stream.finish();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    // The stream ends with an error event saying why, then [DONE].
    EXPECT_NE(body.find("shutting_down"), std::string::npos)
        << body.substr(body.size() > 500 ? body.size() - 500 : 0);
    EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
    EXPECT_EQ(s.wait_exit(std::chrono::seconds(20)), 0) << s.log();
}

TEST(ServerShutdown, IdleSigintExitsZeroQuickly) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", chat_body("")).status, 200);
    s.signal(SIGINT);
    EXPECT_EQ(s.wait_exit(std::chrono::seconds(15)), 0) << s.log();
}

TEST(ServerStartup, RefusesABusyPort) {
    ServerProcess a({"-m", kModel, "--port", "0", "-t", "1"});
    ASSERT_GT(a.port(), 0);
    ServerProcess b({"-m", kModel, "--port", std::to_string(a.port()), "-t", "1"});
    EXPECT_EQ(b.port(), 0);
    EXPECT_EQ(b.wait_exit(std::chrono::seconds(10)), 2) << b.log();
    EXPECT_NE(b.log().find("cannot listen"), std::string::npos) << b.log();
}

}  // namespace
