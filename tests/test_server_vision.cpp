// glm5 serve --mmproj: OpenAI image_url content parts with data URLs (PNG and
// JPEG) enter the prompt; a remote URL, a malformed data URL, bytes that are
// not an image and images sent to a server without a vision tower get a 400
// in OpenAI's shape, and the server goes on serving.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "server/server_process.h"

using glm5::test::base64;
using glm5::test::http_post;
using glm5::test::HttpReply;
using glm5::test::ServerProcess;
using json = nlohmann::json;

namespace {

const std::string kData = std::string(GLM5_TEST_DATA);

std::string file(const std::string& rel) {
    std::ifstream f(kData + "/" + rel, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string image_body(const std::string& url, const std::string& role = "user") {
    json part = {{"type", "image_url"}, {"image_url", {{"url", url}}}};
    json msg = {{"role", role},
                {"content", json::array({{{"type", "text"}, {"text", "what is it?"}}, part})}};
    return json{{"messages", json::array({msg})}, {"max_tokens", 4}, {"temperature", 0}}.dump();
}

void expect_400(const HttpReply& r, const std::string& code, const std::string& needle) {
    EXPECT_EQ(r.status, 400) << r.raw.substr(0, 1000);
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["code"], code) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
}

}  // namespace

TEST(ServerVision, DataUrlImagesAndRefusals) {
    ServerProcess s({"-m", kData + "/glm5next/tiny.gguf", "--mmproj",
                     kData + "/glm5next/mmproj-tiny.gguf", "--port", "0", "-t", "1", "--ctx-size",
                     "256", "--cache-type", "f32"});
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string png = "data:image/png;base64," + base64(file("glm5next/img-a.png"));
    const std::string jpg = "data:image/jpeg;base64," + base64(file("image/img-a.jpg"));
    const HttpReply a = http_post(s.port(), "/v1/chat/completions", image_body(png));
    ASSERT_EQ(a.status, 200) << a.raw;
    const HttpReply b = http_post(s.port(), "/v1/chat/completions", image_body(jpg));
    ASSERT_EQ(b.status, 200) << b.raw;
    const HttpReply text = http_post(
        s.port(), "/v1/chat/completions",
        R"({"messages":[{"role":"user","content":"what is it?"}],"max_tokens":4,"temperature":0})");
    ASSERT_EQ(text.status, 200) << text.raw;
    // The image is 112 x 112: 16 rows in place of the one <|image|>, and its
    // marker's two other tokens.
    const int with = json::parse(a.body)["usage"]["prompt_tokens"];
    const int without = json::parse(text.body)["usage"]["prompt_tokens"];
    EXPECT_EQ(with, without + 18);
    EXPECT_EQ(json::parse(b.body)["usage"]["prompt_tokens"], with);

    expect_400(http_post(s.port(), "/v1/chat/completions", image_body("https://example.com/a.png")),
               "remote_image_url", "only data URLs");
    expect_400(http_post(s.port(), "/v1/chat/completions", image_body("data:image/png;base64,@@@")),
               "invalid_image_url", "base64");
    expect_400(http_post(s.port(), "/v1/chat/completions", image_body("data:image/png,abc")),
               "invalid_image_url", "base64");
    expect_400(http_post(s.port(), "/v1/chat/completions",
                         image_body("data:image/png;base64," + base64("hello, not an image"))),
               "invalid_image", "not a PNG or JPEG");
    const std::string half = file("glm5next/img-a.png").substr(0, 3000);
    expect_400(http_post(s.port(), "/v1/chat/completions",
                         image_body("data:image/png;base64," + base64(half))),
               "invalid_image", "PNG");
    // Images are read in user messages only.
    expect_400(http_post(s.port(), "/v1/chat/completions", image_body(png, "system")),
               "unsupported_content", "not supported");
    // Still serving.
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", image_body(png)).status, 200);
}

TEST(ServerVision, NoVisionTowerRefusesImages) {
    ServerProcess s(
        {"-m", kData + "/glm5next/tiny.gguf", "--port", "0", "-t", "1", "--ctx-size", "256"});
    ASSERT_GT(s.port(), 0) << s.log();
    expect_400(http_post(s.port(), "/v1/chat/completions",
                         image_body("data:image/png;base64," + base64(file("glm5next/img-a.png")))),
               "unsupported_content", "text only");
}

// Anthropic's image blocks (base64 sources) are the same images: the same prompt as
// the OpenAI data URL, and the refusals in Anthropic's shape.
TEST(ServerVision, AnthropicImageBlocks) {
    ServerProcess s({"-m", kData + "/glm5next/tiny.gguf", "--mmproj",
                     kData + "/glm5next/mmproj-tiny.gguf", "--port", "0", "-t", "1", "--ctx-size",
                     "256", "--cache-type", "f32"});
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string data = base64(file("glm5next/img-a.png"));
    auto body = [](const json& source) {
        json blocks = json::array(
            {{{"type", "text"}, {"text", "what is it?"}}, {{"type", "image"}, {"source", source}}});
        return json{{"model", "claude-x"},
                    {"max_tokens", 4},
                    {"temperature", 0},
                    {"messages", json::array({{{"role", "user"}, {"content", blocks}}})}}
            .dump();
    };
    const HttpReply a =
        http_post(s.port(), "/v1/messages",
                  body({{"type", "base64"}, {"media_type", "image/png"}, {"data", data}}));
    ASSERT_EQ(a.status, 200) << a.raw;
    const json ja = json::parse(a.body);
    EXPECT_EQ(ja["type"], "message");
    const HttpReply o =
        http_post(s.port(), "/v1/chat/completions", image_body("data:image/png;base64," + data));
    ASSERT_EQ(o.status, 200) << o.raw;
    EXPECT_EQ(
        ja["usage"]["input_tokens"].get<int>() + ja["usage"]["cache_read_input_tokens"].get<int>(),
        json::parse(o.body)["usage"]["prompt_tokens"].get<int>());

    for (const json& bad :
         {json{{"type", "url"}, {"url", "https://example.com/a.png"}},
          json{{"type", "base64"}, {"media_type", "image/png"}, {"data", "@@@"}}}) {
        const HttpReply r = http_post(s.port(), "/v1/messages", body(bad));
        EXPECT_EQ(r.status, 400) << r.raw;
        const json j = json::parse(r.body, nullptr, false);
        ASSERT_TRUE(j.is_object()) << r.body;
        EXPECT_EQ(j["type"], "error");
        EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
    }
}
