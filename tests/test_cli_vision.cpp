// The CLI's image interfaces (docs/usage: glm5 run / logits --mmproj --image)
// against the vision goldens, and their refusals with exit code 2.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "util_cli.h"
#include "util_model.h"

using namespace glm5::test;

namespace {

const std::string T = std::string(GLM5_TEST_DATA) + "/glm5next/";

std::string ids_arg(const nlohmann::json& ids) {
    std::string s;
    for (const auto& v : ids) s += (s.empty() ? "" : ",") + std::to_string(v.get<int>());
    return s;
}

const nlohmann::json& golden() {
    static const nlohmann::json g = load_json(T + "vision.golden.json");
    return g;
}

std::string vision_flags(const std::string& image) {
    return "--model " + T + "tiny.gguf --mmproj " + T + "mmproj-tiny.gguf --image " + T + image +
           " --cache-type f32 -t 1";
}

}  // namespace

TEST(CliVision, LogitsAndGreedyIdsMatchTheGoldens) {
    for (const auto& g : golden()["images"]) {
        const std::string f = g["file"];
        const auto lg =
            run_glm5("logits " + vision_flags(f) + " --tokens " + ids_arg(g["prompt_ids"]));
        ASSERT_EQ(lg.code, 0) << lg.err;
        const auto j = nlohmann::json::parse(lg.out);
        ASSERT_EQ(j["logits"].size(), 1u);
        const double d = max_abs_diff(j["logits"][0].get<std::vector<float>>().data(),
                                      to_floats(g["last_logits"]));
        EXPECT_LE(d, 1e-3) << f;
        // --all: one row per position of the expanded sequence.
        const auto all =
            run_glm5("logits --all " + vision_flags(f) + " --tokens " + ids_arg(g["prompt_ids"]));
        ASSERT_EQ(all.code, 0) << all.err;
        EXPECT_EQ(nlohmann::json::parse(all.out)["logits"].size(), g["expanded_ids"].size());

        const auto run =
            run_glm5("run " + vision_flags(f) + " --tokens " + ids_arg(g["prompt_ids"]) +
                     " --print-ids --ignore-eos --temp 0 -n 8");
        ASSERT_EQ(run.code, 0) << run.err;
        std::stringstream ss(run.out);
        std::vector<int32_t> ids;
        for (int32_t x; ss >> x;) ids.push_back(x);
        EXPECT_EQ(ids, to_ids(g["greedy"])) << f;
    }
    // A chat turn with an image.
    const auto chat =
        run_glm5("run " + vision_flags("img-b.png") + " -p 'what is it?' -n 4 --temp 0");
    EXPECT_EQ(chat.code, 0) << chat.err;
}

TEST(CliVision, RefusalsExitWithCode2) {
    const std::string ids = ids_arg(golden()["images"][0]["prompt_ids"]);
    struct Case {
        std::string args, needle;
    };
    const Case cases[] = {
        {"--model " + T + "tiny.gguf --mmproj " + T + "mmproj-tiny.gguf --image " + T +
             "tiny.golden.json --tokens " + ids,
         "not a PNG or JPEG"},
        {"--model " + std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf --mmproj " + T +
             "mmproj-tiny.gguf --image " + T + "img-a.png --tokens 1,2",
         "text only"},
        {"--model " + T + "tiny.gguf --mmproj " + T + "tiny.gguf --image " + T +
             "img-a.png --tokens " + ids,
         "not an mmproj"},
        {"--model " + T + "tiny.gguf --image " + T + "img-a.png --tokens " + ids, "--mmproj"},
        {"--model " + T + "tiny.gguf --mmproj " + T + "mmproj-tiny.gguf --image " + T +
             "img-a.png --image " + T + "img-b.png --tokens " + ids,
         "placeholder"},
        {"--model " + T + "tiny.gguf --mmproj " + T +
             "mmproj-tiny.gguf --image /nonexistent.png "
             "--tokens " +
             ids,
         "cannot open"},
    };
    for (const auto& c : cases)
        for (const char* cmd : {"run ", "logits "}) {
            const auto r = run_glm5(cmd + c.args + " -t 1");
            EXPECT_EQ(r.code, 2) << cmd << c.args << "\n" << r.err;
            EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
        }
}

TEST(CliVision, MakeModelWritesAnMmprojTheCliLoads) {
    const std::string path = "/tmp/glm5-cli-vision-" + std::to_string(::getpid()) + ".gguf";
    const auto mk = run_glm5("make-model --arch mmproj --preset tiny --quiet -o " + path);
    ASSERT_EQ(mk.code, 0) << mk.err;
    const auto r =
        run_glm5("logits --model " + T + "tiny.gguf --mmproj " + path + " --image " + T +
                 "img-a.png -t 1 --tokens " + ids_arg(golden()["images"][0]["prompt_ids"]));
    EXPECT_EQ(r.code, 0) << r.err;
    std::remove(path.c_str());
}

// glm5 chat: /image PATH attaches an image to the next message; the turn's
// prompt then holds the image's 16 rows and its marker (47 tokens against 29
// for the text alone), and later turns keep it in the conversation.
TEST(CliVision, ChatImageCommand) {
    const std::string model = "--model " + T + "tiny.gguf -n 2 --temp 0 -t 1";
    const auto r = run_glm5(
        "chat " + model + " --mmproj " + T + "mmproj-tiny.gguf",
        "/image " + T + "img-a.png\nwhat is it?\nand now?\n/image " + T + "tiny.gguf\n/exit\n");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("attached to the next message"), std::string::npos) << r.out;
    EXPECT_NE((r.out + r.err).find("prompt 47 tokens"), std::string::npos) << r.out << r.err;
    EXPECT_NE(r.out.find("(image refused:"), std::string::npos) << r.out;
    const auto text = run_glm5("chat " + model, "what is it?\n/image " + T + "img-a.png\n/exit\n");
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_NE((text.out + text.err).find("prompt 29 tokens"), std::string::npos) << text.err;
    EXPECT_NE(text.out.find("no vision tower"), std::string::npos) << text.out;
}
