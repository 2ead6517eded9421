// The server's pieces without HTTP: stop strings, the token -> text pipeline, the
// tool-call and ban constraints, and request parsing into engine parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/json_schema.h"
#include "runtime/reasoning_budget.h"
#include "server/anthropic.h"
#include "server/openai_request.h"
#include "server/reply_stream.h"
#include "server/tool_constraint.h"
#include "text/chat.h"
#include "text/reply_parser.h"
#include "text/tokenizer.h"

using namespace glm5;
using namespace glm5::server;
using ojson = nlohmann::ordered_json;

namespace {

struct Fixture {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<text::Tokenizer> tok;
    std::unique_ptr<text::ChatFormat> format;
    std::shared_ptr<const ToolVocab> tools;
    ModelContext mc;
};

const Fixture& fx() {
    static Fixture* f = [] {
        auto* x = new Fixture;
        x->file = gguf::File::open(std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf");
        x->tok = text::Tokenizer::from_gguf(*x->file);
        x->format = std::make_unique<text::ChatFormat>(text::ChatFormat::from_gguf(*x->file));
        x->tools = std::make_shared<const ToolVocab>(*x->tok);
        x->mc.tok = x->tok.get();
        x->mc.format = x->format.get();
        x->mc.id = "tiny";
        x->mc.names = {"tiny", "tiny.gguf"};
        x->mc.n_ctx = 2048;
        x->mc.json_vocab = std::make_shared<const runtime::JsonVocab>(*x->tok);
        x->mc.tool_vocab = x->tools;
        return x;
    }();
    return *f;
}

// Feeds `text` to a StopMatcher in pieces of `step` bytes.
std::string stop_run(const std::vector<std::string>& stops, const std::string& text, size_t step,
                     bool* matched = nullptr) {
    StopMatcher m(stops);
    std::string out;
    for (size_t i = 0; i < text.size(); i += step) out += m.feed(text.substr(i, step));
    if (!m.matched()) out += m.flush();
    if (matched) *matched = m.matched();
    return out;
}

TEST(StopMatcher, CutsAtTheFirstStopStringHoweverTheTextIsSplit) {
    const std::string text = "Hello world. The END is near; END again";
    for (size_t step = 1; step <= text.size(); ++step) {
        bool matched = false;
        EXPECT_EQ(stop_run({"END"}, text, step, &matched), "Hello world. The ") << step;
        EXPECT_TRUE(matched);
        // The earliest of several stop strings wins.
        EXPECT_EQ(stop_run({"near", "world"}, text, step), "Hello ") << step;
        // A prefix that never completes is released.
        EXPECT_EQ(stop_run({"ENDLESS"}, text, step, &matched), text) << step;
        EXPECT_FALSE(matched);
        EXPECT_EQ(stop_run({}, text, step), text);
    }
    // Multi-byte text stays whole.
    EXPECT_EQ(stop_run({"é!"}, "caféé!x", 1), "café");
}

TEST(StopMatcher, NothingHeldBackThatCannotStartAStop) {
    StopMatcher m({"STOP"});
    EXPECT_EQ(m.feed("abc S"), "abc ");
    EXPECT_EQ(m.feed("T"), "");
    EXPECT_EQ(m.feed("x"), "STx");
    EXPECT_EQ(m.feed("ST"), "");
    EXPECT_EQ(m.flush(), "ST");
}

std::vector<int32_t> ids(const std::string& s) {
    return fx().tok->encode(s, true);
}

// Pushes the tokens of `text` one at a time; the deltas' sum.
Delta stream_all(const ReplyStreamOptions& o, const std::string& text,
                 bool* ended_early = nullptr) {
    ReplyStream rs(*fx().tok, o);
    Delta sum;
    auto add = [&](const Delta& d) {
        sum.reasoning += d.reasoning;
        sum.content += d.content;
        sum.tool_calls.insert(sum.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    };
    bool early = false;
    for (int32_t t : ids(text)) {
        Delta d;
        const bool more = rs.push(t, d);
        add(d);
        if (!more) {
            early = true;
            break;
        }
    }
    Delta d;
    rs.finish(d);
    add(d);
    if (ended_early) *ended_early = early;
    return sum;
}

TEST(ReplyStream, SplitsReasoningContentAndToolCalls) {
    ReplyStreamOptions o;
    o.reasoning_open = true;
    const Delta d = stream_all(
        o,
        "I should look it up.</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>");
    EXPECT_EQ(d.reasoning, "I should look it up.");
    EXPECT_EQ(d.content, "Let me check.");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments.dump(), R"({"city":"Paris","days":3})");
    EXPECT_EQ(d.tool_calls[0].id.rfind("call_", 0), 0u);
    EXPECT_EQ(d.tool_calls[0].id.size(), 29u);
}

// A chat reply shows the structure's control tokens as reasoning and tool calls and
// drops the others (a stray <|assistant|>, <sop>, <think></think> once the answer has
// begun); completions keep them as text.
TEST(ReplyStream, ChatRepliesDropOtherControlTokens) {
    ReplyStreamOptions o;
    const Delta d =
        stream_all(o, "<think>hm</think>Hi<|assistant|> there<sop>.<|image|><think></think> Bye");
    EXPECT_EQ(d.reasoning, "hm");
    EXPECT_EQ(d.content, "Hi there. Bye");
    o.parse = false;
    EXPECT_EQ(stream_all(o, "Hi<|assistant|> there").content, "Hi<|assistant|> there");
}

TEST(ReplyStream, StopStringsApplyToContentNotReasoning) {
    ReplyStreamOptions o;
    o.reasoning_open = true;
    o.stop = {"STOP"};
    bool early = false;
    const Delta d = stream_all(o, "think STOP here</think>Answer: 42 STOP and more", &early);
    EXPECT_EQ(d.reasoning, "think STOP here");
    EXPECT_EQ(d.content, "Answer: 42 ");
    EXPECT_TRUE(early);  // the generation is told to stop right there
}

TEST(ReplyStream, CompletionsAreRawTextWithStops) {
    ReplyStreamOptions o;
    o.parse = false;
    o.stop = {"\n\n"};
    bool early = false;
    const Delta d = stream_all(o, "<think>not parsed</think> line one\n\nline two", &early);
    EXPECT_EQ(d.content, "<think>not parsed</think> line one");
    EXPECT_TRUE(early);
    EXPECT_TRUE(d.reasoning.empty());
}

TEST(ReplyStream, SingleToolCallEndsTheReply) {
    ReplyStreamOptions o;
    o.single_tool_call = true;
    bool early = false;
    const Delta d =
        stream_all(o,
                   "<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
                   "<tool_call>b</tool_call>",
                   &early);
    EXPECT_TRUE(early);
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "a");
}

const ojson kTools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"},"scale":{"type":"number"},
                  "unit":{"type":"string","enum":["celsius","fahrenheit"]},"detailed":{"type":"boolean"}},
    "required":["city","unit","days"]}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object",
    "properties":{"tz":{"type":"string"}}}}},
  {"type":"function","function":{"name":"ping"}}
])");

// Samples uniformly among the allowed tokens until a stop token; the reply's text.
// Fails the test when the budget runs out first.
std::string sample_constrained(runtime::TokenConstraint& c, int64_t max_tokens, uint64_t seed,
                               bool* stopped) {
    const ToolVocab& v = *fx().tools;
    std::mt19937_64 rng(seed);
    text::StreamDecoder dec(*fx().tok);
    std::string out;
    *stopped = false;
    for (int64_t produced = 0; produced < max_tokens; ++produced) {
        c.set_remaining(max_tokens - produced);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < v.n_vocab(); ++t)
            if (c.allows(t)) allowed.push_back(t);
        if (allowed.empty()) {
            ADD_FAILURE() << "no token allowed after: " << out;
            return out;
        }
        const int32_t t = allowed[rng() % allowed.size()];
        if (v.is_stop(t)) {
            *stopped = true;
            break;
        }
        c.accept(t);
        out += dec.push(t);
    }
    return out + dec.flush();
}

TEST(ToolCallConstraint, RandomSamplingAlwaysGivesAValidCallWithinBudget) {
    for (bool think : {false, true}) {
        for (const std::string name : {"", "get_weather", "get_time", "ping"}) {
            for (int64_t budget : {60, 90, 400}) {
                for (uint64_t seed = 0; seed < 6; ++seed) {
                    SCOPED_TRACE("think " + std::to_string(think) + " tool '" + name + "' budget " +
                                 std::to_string(budget) + " seed " + std::to_string(seed));
                    ToolCallConstraint c(fx().tools, kTools, name, think);
                    ASSERT_LE(c.min_completion(), budget);
                    bool stopped = false;
                    const std::string text =
                        sample_constrained(c, budget, seed * 7919 + budget, &stopped);
                    EXPECT_TRUE(stopped) << text;
                    EXPECT_TRUE(c.complete());
                    text::ReplyParser p({think, kTools});
                    p.feed(text);
                    p.finish();
                    const text::ParsedReply& r = p.result();
                    ASSERT_EQ(r.tool_calls.size(), 1u) << text;
                    EXPECT_TRUE(r.content.empty()) << text;
                    const text::ToolCall& call = r.tool_calls[0];
                    if (!name.empty()) {
                        EXPECT_EQ(call.name, name);
                    }
                    const ojson& a = call.arguments;
                    ASSERT_TRUE(a.is_object()) << text;
                    if (call.name == "get_weather") {
                        ASSERT_TRUE(a.contains("city") && a.contains("unit") && a.contains("days"))
                            << text;
                        EXPECT_TRUE(a["city"].is_string());
                        EXPECT_TRUE(a["unit"] == "celsius" || a["unit"] == "fahrenheit")
                            << a.dump();
                        EXPECT_TRUE(a["days"].is_number_integer()) << a.dump();
                        if (a.contains("scale")) {
                            EXPECT_TRUE(a["scale"].is_number_float() ||
                                        a["scale"].is_number_integer())
                                << a.dump();
                            if (a["scale"].is_number_float()) {
                                EXPECT_TRUE(std::isfinite(a["scale"].get<double>())) << a.dump();
                            }
                        }
                        if (a.contains("detailed")) {
                            EXPECT_TRUE(a["detailed"].is_boolean()) << a.dump();
                        }
                    } else if (call.name == "get_time") {
                        if (a.contains("tz")) {
                            EXPECT_TRUE(a["tz"].is_string());
                        }
                    } else {
                        EXPECT_EQ(call.name, "ping");
                        EXPECT_TRUE(a.empty());
                    }
                }
            }
        }
    }
}

TEST(ToolCallConstraint, TooSmallABudgetStillHeadsForTheEnd) {
    ToolCallConstraint c(fx().tools, kTools, "get_weather", false);
    int64_t need = c.min_completion();
    ASSERT_GT(need, 8);
    // Five tokens left where about `need` are wanted: every token gets strictly closer.
    for (int64_t left = 5; left > 0; --left) {
        c.set_remaining(left);
        int32_t pick = -1;
        for (int32_t t = 0; t < fx().tools->n_vocab() && pick < 0; ++t)
            if (c.allows(t)) pick = t;
        ASSERT_GE(pick, 0);
        c.accept(pick);
        EXPECT_LT(c.min_completion(), need);
        need = c.min_completion();
    }
}

TEST(ToolCallConstraint, RefusesWhatCannotBeForced) {
    EXPECT_THROW(ToolCallConstraint(fx().tools, kTools, "nope", false), Error);
}

TEST(BanConstraint, BansOnlyItsTokens) {
    BanConstraint b({fx().tools->tool_open});
    EXPECT_FALSE(b.allows(fx().tools->tool_open));
    EXPECT_TRUE(b.allows(fx().tools->tool_close));
    EXPECT_TRUE(b.allows(ids("hello")[0]));
}

ojson chat(const std::string& extra) {
    return ojson::parse(R"({"messages":[{"role":"user","content":"Hi"}])" +
                        (extra.empty() ? "" : "," + extra) + "}");
}

TEST(RequestParsing, ChatOptionsBecomeEngineParameters) {
    const ModelContext& mc = fx().mc;
    GenRequest g = parse_chat_request(
        chat(
            R"("temperature":0.5,"top_k":7,"top_p":0.9,"min_p":0.1,"seed":11,"n":3,"max_tokens":9,"stop":["x","yy"],"stream":true,"stream_options":{"include_usage":true})"),
        mc);
    EXPECT_TRUE(g.stream);
    EXPECT_TRUE(g.include_usage);
    EXPECT_EQ(g.choices(), 3);
    EXPECT_EQ(g.stop, (std::vector<std::string>{"x", "yy"}));
    EXPECT_FALSE(g.reasoning_open);
    for (int k = 0; k < 3; ++k) {
        runtime::RequestParams p = engine_params(g, k, mc);
        EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
        EXPECT_EQ(p.sampling.top_k, 7);
        EXPECT_EQ(p.sampling.seed, 11u + uint64_t(k));  // each choice its own seed
        EXPECT_EQ(p.max_tokens, 9);
        EXPECT_EQ(p.prompt, g.prompts[0].tokens);
        for (int32_t s : fx().tok->stop_ids()) EXPECT_TRUE(p.stop_ids.count(s));
        // No tools: the tool-call marker is banned.
        ASSERT_TRUE(p.constraint);
        EXPECT_FALSE(p.constraint->allows(fx().tools->tool_open));
    }
    // The prompt is the chat format's rendering of the messages.
    text::RenderedPrompt rp = fx().format->render({text::text_message("user", "Hi")}, nullptr, {});
    EXPECT_EQ(g.prompts[0].tokens, text::encode_prompt(*fx().tok, rp));
}

TEST(RequestParsing, DeveloperMessagesAreSystemMessages) {
    const ModelContext& mc = fx().mc;
    const GenRequest dev = parse_chat_request(
        ojson::parse(
            R"({"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}]})"),
        mc);
    const GenRequest sys = parse_chat_request(
        ojson::parse(
            R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})"),
        mc);
    EXPECT_EQ(dev.prompts[0].tokens, sys.prompts[0].tokens);
}

// max_tokens past the context is taken, and the reply runs to the context's end (as
// llama-server's does); only a prompt that leaves no room for one token is refused, in
// OpenAI's wording on its endpoints and Anthropic's on /v1/messages.
TEST(RequestParsing, MaxTokensPastTheContextRunsToItsEnd) {
    const ModelContext& mc = fx().mc;
    GenRequest big = parse_chat_request(chat(R"("max_tokens":100000)"), mc);
    EXPECT_EQ(engine_params(big, 0, mc).max_tokens,
              mc.n_ctx - int64_t(big.prompts[0].tokens.size()));
    GenRequest fits = parse_chat_request(chat(R"("max_tokens":100)"), mc);
    EXPECT_EQ(engine_params(fits, 0, mc).max_tokens, 100);
    GenRequest d = parse_chat_request(chat(""), mc);
    EXPECT_EQ(engine_params(d, 0, mc).max_tokens, mc.n_ctx - int64_t(d.prompts[0].tokens.size()));
    GenRequest e = parse_chat_request(chat(R"("ignore_eos":true)"), mc);
    EXPECT_TRUE(engine_params(e, 0, mc).stop_ids.empty());

    std::string words;
    for (int i = 0; i < 1500; ++i) words += "word ";
    const ojson long_chat = {{"messages", {{{"role", "user"}, {"content", words}}}}};
    const int64_t n = count_chat_prompt(long_chat, mc);
    EXPECT_GT(n, mc.n_ctx);
    try {
        parse_chat_request(long_chat, mc);
        FAIL() << "a prompt past the context accepted";
    } catch (const ApiError& err) {
        EXPECT_EQ(err.status(), 400);
        EXPECT_EQ(err.param(), "messages");
        EXPECT_EQ(err.code(), "context_length_exceeded");
        EXPECT_EQ(err.body()["error"]["message"],
                  "This model's maximum context length is 2048 tokens. However, your messages "
                  "resulted in " +
                      std::to_string(n) + " tokens. Please reduce the length of the messages.");
        EXPECT_EQ(anthropic::error_body(err)["error"]["message"],
                  "prompt is too long: " + std::to_string(n) + " tokens > 2048 maximum");
        EXPECT_EQ(anthropic::error_body(err)["error"]["type"], "invalid_request_error");
    }
    try {
        parse_completion_request(ojson{{"prompt", words}}, mc);
        FAIL() << "a prompt past the context accepted";
    } catch (const ApiError& err) {
        EXPECT_EQ(err.param(), "prompt");
        EXPECT_EQ(err.code(), "context_length_exceeded");
    }
}

TEST(RequestParsing, ReasoningSwitches) {
    const ModelContext& mc = fx().mc;
    EXPECT_FALSE(parse_chat_request(chat(""), mc).reasoning_open);
    EXPECT_TRUE(parse_chat_request(chat(R"("think":true)"), mc).reasoning_open);
    EXPECT_TRUE(parse_chat_request(chat(R"("reasoning_effort":"low")"), mc).reasoning_open);
    EXPECT_TRUE(parse_chat_request(chat(R"("chat_template_kwargs":{"enable_thinking":true})"), mc)
                    .reasoning_open);
    EXPECT_FALSE(parse_chat_request(chat(R"("reasoning_effort":"none")"), mc).reasoning_open);
    EXPECT_FALSE(
        parse_chat_request(chat(R"("think":false,"reasoning_effort":"high")"), mc).reasoning_open);
    // low / medium / high render the format's Low / Max / High.
    auto prompt_text = [&](const char* effort) {
        GenRequest g =
            parse_chat_request(chat(std::string("\"reasoning_effort\":\"") + effort + "\""), mc);
        return fx().tok->decode(g.prompts[0].tokens);
    };
    EXPECT_NE(prompt_text("low").find("Reasoning Effort: Low"), std::string::npos);
    EXPECT_NE(prompt_text("medium").find("Reasoning Effort: Max"), std::string::npos);
    EXPECT_NE(prompt_text("high").find("Reasoning Effort: High"), std::string::npos);
}

TEST(RequestParsing, ToolChoiceAndResponseFormatPickTheConstraint) {
    const ModelContext& mc = fx().mc;
    const std::string tools = "\"tools\":" + kTools.dump();
    GenRequest named = parse_chat_request(
        chat(tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}})"), mc);
    EXPECT_NE(dynamic_cast<ToolCallConstraint*>(engine_params(named, 0, mc).constraint.get()),
              nullptr);
    GenRequest req = parse_chat_request(chat(tools + R"(,"tool_choice":"required")"), mc);
    EXPECT_NE(dynamic_cast<ToolCallConstraint*>(engine_params(req, 0, mc).constraint.get()),
              nullptr);
    GenRequest aut = parse_chat_request(chat(tools), mc);
    EXPECT_EQ(engine_params(aut, 0, mc).constraint, nullptr);  // auto: the model decides
    GenRequest none = parse_chat_request(chat(tools + R"(,"tool_choice":"none")"), mc);
    EXPECT_NE(dynamic_cast<BanConstraint*>(engine_params(none, 0, mc).constraint.get()), nullptr);
    // tool_choice none: the tools are not rendered into the prompt.
    EXPECT_LT(none.prompts[0].tokens.size(), aut.prompts[0].tokens.size());
    GenRequest js = parse_chat_request(chat(R"("response_format":{"type":"json_object"})"), mc);
    EXPECT_NE(dynamic_cast<runtime::GrammarConstraint*>(engine_params(js, 0, mc).constraint.get()),
              nullptr);
    EXPECT_THROW(
        parse_chat_request(
            chat(tools + R"(,"tool_choice":"required","response_format":{"type":"json_object"})"),
            mc),
        ApiError);
}

TEST(RequestParsing, CompletionPromptForms) {
    const ModelContext& mc = fx().mc;
    GenRequest s =
        parse_completion_request(ojson::parse(R"({"prompt":"Once upon","echo":true})"), mc);
    ASSERT_EQ(s.prompts.size(), 1u);
    EXPECT_EQ(s.prompts[0].tokens, ids("Once upon"));
    EXPECT_EQ(s.prompts[0].text, "Once upon");
    EXPECT_TRUE(s.echo);
    GenRequest t = parse_completion_request(ojson::parse(R"({"prompt":[5,6,7]})"), mc);
    EXPECT_EQ(t.prompts[0].tokens, (std::vector<int32_t>{5, 6, 7}));
    GenRequest many =
        parse_completion_request(ojson::parse(R"({"prompt":["a b",[1,2],"c"],"n":2})"), mc);
    EXPECT_EQ(many.prompts.size(), 3u);
    EXPECT_EQ(many.choices(), 6);
    EXPECT_EQ(engine_params(many, 3, mc).prompt, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(engine_params(many, 0, mc).constraint, nullptr);  // raw completions ban nothing
    try {
        parse_completion_request(ojson::parse(R"({"prompt":"x","n":9,"model":"tiny"})"), mc);
        parse_completion_request(ojson::parse(R"({"prompt":["a","b"],"n":9})"), mc);
        FAIL() << "18 choices accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 400);
        EXPECT_EQ(e.param(), "n");
    }
}

TEST(RequestParsing, ErrorsNameTheField) {
    const ModelContext& mc = fx().mc;
    auto err = [&](const std::string& body) -> ApiError {
        try {
            parse_chat_request(parse_body(body), mc);
        } catch (const ApiError& e) {
            return e;
        }
        return ApiError(0, "accepted");
    };
    EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"model":"other"})").status(), 404);
    EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"top_k":"5"})").param(), "top_k");
    EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"n":99})").param(), "n");
    EXPECT_EQ(
        err(R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})")
            .param(),
        "stop");
    const ApiError body = err("{");
    EXPECT_EQ(body.status(), 400);
    EXPECT_EQ(body.code(), "invalid_json");
    const ojson shape = body.body();
    EXPECT_EQ(shape["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(shape["error"]["param"].is_null());
}

// What OpenAI's API reference refuses, this server refuses too, each with a 400
// that names 'messages' and says what is wrong.
TEST(RequestValidation, MessagesAsOpenAIDefinesThem) {
    const ModelContext& mc = fx().mc;
    auto refused = [&](const std::string& messages, const std::string& says) {
        SCOPED_TRACE(messages);
        try {
            parse_chat_request(parse_body(R"({"messages":)" + messages + "}"), mc);
            ADD_FAILURE() << "accepted";
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status(), 400);
            EXPECT_EQ(e.param(), "messages");
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
    };
    auto accepted = [&](const std::string& messages) {
        SCOPED_TRACE(messages);
        EXPECT_NO_THROW(parse_chat_request(parse_body(R"({"messages":)" + messages + "}"), mc));
    };
    const std::string call =
        R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"UTC\"}"}}]})";
    const std::string user = R"({"role":"user","content":"Hi"})";

    refused("[]", "must not be empty");
    refused(R"([{"role":"user","content":null}])", "content is required");
    refused(R"([{"role":"user"}])", "content is required");
    refused(R"([{"role":"system","content":null},)" + user + "]", "content is required");
    refused(R"([{"role":"developer"},)" + user + "]", "content is required");
    refused(R"([{"role":"assistant","content":null}])", "unless the message has tool_calls");
    refused(R"([{"role":"user","content":5}])", "must be a string or an array");
    refused(R"([{"role":"user","content":[]}])", "empty array");
    refused(R"([{"role":"user","content":["Hi"]}])", "must be an object");
    refused(R"([{"role":"user","content":[{"type":"text"}]}])", ".text must be a string");
    refused(R"([{"role":"user","content":[{"type":"text","text":null}]}])",
            ".text must be a string");
    refused(R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])",
            "text only");
    refused(R"([{"role":"user","content":[{"type":"refusal","refusal":"no"}]}])",
            "unknown content part type");
    refused(R"([{"role":"user","content":[{"text":"Hi"}]}])", ".type must be a string");
    refused(R"([{"role":"wizard","content":"Hi"}])", "is not one of");
    refused(R"([{"role":"function","content":"Hi","name":"f"}])", "is not one of");
    refused(R"([{"role":null,"content":"Hi"}])", "role is required");
    refused(R"([{"content":"Hi"}])", "role is required");
    refused(R"([{"role":7,"content":"Hi"}])", "role must be a string");
    refused(R"([null])", "must be an object");
    refused(R"([{"role":"user","content":"Hi","name":5}])", "name must be a string");
    // Tool messages answer a call of the assistant message right before them.
    refused("[" + user + R"(,{"role":"tool","tool_call_id":"c1","content":"12:00"}])",
            "must answer a tool call");
    refused("[" + user + "," + call + R"(,{"role":"tool","tool_call_id":"c2","content":"x"}])",
            "matches no unanswered tool call");
    refused("[" + user + "," + call + R"(,{"role":"tool","content":"x"}])",
            "tool_call_id must be a string");
    refused("[" + user + "," + call + R"(,{"role":"tool","tool_call_id":"c1","content":null}])",
            "content is required");
    refused("[" + user + "," + call + R"(,{"role":"tool","tool_call_id":"c1","content":"a"},)" +
                R"({"role":"tool","tool_call_id":"c1","content":"b"}])",
            "matches no unanswered tool call");
    refused("[" + user + "," + call + "," + user +
                R"(,{"role":"tool","tool_call_id":"c1","content":"late"}])",
            "must answer a tool call");
    // Tool calls themselves.
    refused("[" + user + R"(,{"role":"assistant","content":null,"tool_calls":[]}])",
            "non-empty array");
    refused(
        "[" + user +
            R"(,{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}])",
        ".id must be");
    refused(
        "[" + user +
            R"(,{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":null,"arguments":"{}"}}]}])",
        "function.name");
    refused(
        "[" + user +
            R"(,{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f"}}]}])",
        "arguments must be");
    refused(
        "[" + user +
            R"(,{"role":"assistant","tool_calls":[{"id":"a","type":"code","function":{"name":"f","arguments":"{}"}}]}])",
        ".type must be");
    refused("[" + user + R"(,{"role":"assistant","content":"x","refusal":3}])",
            "refusal must be a string");
    std::string deep(200, '[');
    deep += std::string(200, ']');
    refused(
        "[" + user +
            R"(,{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":")" +
            deep + R"("}}]}])",
        "nested deeper");

    accepted("[" + user + "]");
    accepted(R"([{"role":"user","content":""}])");
    accepted(R"([{"role":"user","content":[{"type":"text","text":"Hi"}]}])");
    accepted(R"([{"role":"system","content":[{"type":"text","text":"Be brief."}]},)" + user + "]");
    accepted("[" + user + "," + call +
             R"(,{"role":"tool","tool_call_id":"c1","content":"12:00"}])");
    accepted("[" + user + "," + call +
             R"(,{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"12:00"}]}])");
    accepted("[" + user +
             R"(,{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}])");
    accepted("[" + user + R"(,{"role":"assistant","content":"Hello","name":"bot"},)" + user + "]");
}

// Null where a value is required, outside the messages.
TEST(RequestValidation, NullsAndTypesOfOtherFields) {
    const ModelContext& mc = fx().mc;
    auto status = [&](const std::string& body, bool chat_endpoint = true) {
        try {
            if (chat_endpoint)
                parse_chat_request(parse_body(body), mc);
            else
                parse_completion_request(parse_body(body), mc);
        } catch (const ApiError& e) {
            return e.status();
        }
        return 200;
    };
    EXPECT_EQ(status(R"({"messages":null})"), 400);
    EXPECT_EQ(status(R"({})"), 400);
    EXPECT_EQ(status(R"({"messages":{"role":"user","content":"Hi"}})"), 400);
    EXPECT_EQ(status(R"({"prompt":null})", false), 400);
    EXPECT_EQ(status(R"({"prompt":[]})", false), 400);
    EXPECT_EQ(status(R"({"prompt":[[]]})", false), 400);
    EXPECT_EQ(status(R"({"prompt":[1,null]})", false), 400);
    EXPECT_EQ(status(R"({"prompt":["a",null]})", false), 400);
    const std::string m = R"("messages":[{"role":"user","content":"Hi"}])";
    EXPECT_EQ(status("{" + m + R"(,"tools":[{"type":"function","function":null}]})"), 400);
    EXPECT_EQ(status("{" + m + R"(,"tools":[{"type":null,"function":{"name":"f"}}]})"), 400);
    EXPECT_EQ(status("{" + m + R"(,"tools":[{"type":"function","function":{"name":null}}]})"), 400);
    EXPECT_EQ(status("{" + m + R"(,"tool_choice":{"type":"function","function":null}})"), 400);
    EXPECT_EQ(status("{" + m + R"(,"stop":[null]})"), 400);
    EXPECT_EQ(status("{" + m + R"(,"response_format":{"type":null}})"), 400);
    EXPECT_EQ(status("{" + m + R"(,"stream_options":{"include_usage":true}})"), 400);
    // Optional fields may be null: the default applies, as with OpenAI.
    EXPECT_EQ(status("{" + m +
                     R"(,"n":null,"max_tokens":null,"temperature":null,"stop":null,"tools":null,)"
                     R"("tool_choice":null,"stream":null,"seed":null,"response_format":null})"),
              200);
}

}  // namespace

// The reasoning budget: `budget` tokens of reasoning, then only </think>; after it the
// inner constraint decides alone, and it sees every token.
TEST(ReasoningBudget, ForcesThinkEndAtTheBudgetAndPassesTheRestOn) {
    constexpr int32_t kEnd = 7, kBanned = 3;
    auto inner = std::make_unique<BanConstraint>(std::vector<int32_t>{kBanned});
    runtime::ReasoningBudget b(2, kEnd, std::move(inner));
    EXPECT_TRUE(b.allows(1));
    EXPECT_FALSE(b.allows(kBanned));
    b.accept(1);
    EXPECT_TRUE(b.allows(kEnd));
    b.accept(2);
    for (int32_t t : {0, 1, 2, 5}) EXPECT_FALSE(b.allows(t)) << t;
    EXPECT_TRUE(b.allows(kEnd));
    b.accept(kEnd);
    EXPECT_TRUE(b.allows(1));
    EXPECT_FALSE(b.allows(kBanned));
    runtime::ReasoningBudget zero(0, kEnd, nullptr);
    EXPECT_FALSE(zero.allows(1));
    EXPECT_TRUE(zero.allows(kEnd));
    // </think> before the budget ends the reasoning early.
    runtime::ReasoningBudget early(5, kEnd, nullptr);
    early.accept(kEnd);
    EXPECT_TRUE(early.allows(1));
}

// Anthropic's request as the chat body: tool results become tool messages before the
// user's own text, assistant blocks become content, reasoning and tool calls, and the
// choices map onto the chat fields.
TEST(AnthropicRequest, MapsOntoTheChatBody) {
    const ojson body = ojson::parse(R"({
      "model": "claude-x", "max_tokens": 100, "stop_sequences": ["END"], "top_k": 5,
      "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
      "metadata": {"user_id": "u"},
      "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"},
                 "cache_control": {"type": "ephemeral"}}],
      "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
      "thinking": {"type": "enabled", "budget_tokens": 10},
      "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "ok"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "r"}], "is_error": true},
                                     {"type": "text", "text": "and"}, {"type": "text", "text": "more"}]}]})");
    const ojson chat = anthropic::to_chat_body(body, false);
    EXPECT_EQ(chat["max_tokens"], 100);
    EXPECT_EQ(chat["stop"], ojson::array({"END"}));
    EXPECT_EQ(chat["top_k"], 5);
    EXPECT_EQ(chat["tool_choice"], "required");
    EXPECT_EQ(chat["parallel_tool_calls"], false);
    EXPECT_EQ(chat["think"], true);
    EXPECT_EQ(chat["reasoning_budget"], 10);
    EXPECT_EQ(chat["tools"][0]["function"]["parameters"], ojson({{"type", "object"}}));
    const ojson& m = chat["messages"];
    ASSERT_EQ(m.size(), 5u) << m.dump();
    EXPECT_EQ(m[0], ojson({{"role", "system"}, {"content", "A\n\nB"}}));
    EXPECT_EQ(m[1]["role"], "user");
    EXPECT_EQ(m[2]["content"], "ok");
    EXPECT_EQ(m[2]["reasoning_content"], "hm");
    EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
    EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], ojson({{"x", 1}}));
    EXPECT_EQ(m[3],
              ojson({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "Error: r"}}));
    EXPECT_EQ(m[4]["content"][0]["text"], "and\n\nmore");
    // The chat parser takes what came out.
    EXPECT_EQ(anthropic::to_chat_body(
                  ojson::parse(R"({"messages":[{"role":"user","content":"x"}]})"), true)
                  .contains("max_tokens"),
              false);
    for (
        const char* bad :
        {R"({"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":5,"messages":[{"role":"tool","content":"x"}]})",
         R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"document"}]}]})",
         R"({"max_tokens":5,"tools":[{"type":"bash_20250124","name":"bash"}],"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":5,"tool_choice":{"type":"sometimes"},"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":9},"messages":[{"role":"user","content":"x"}]})"}) {
        EXPECT_THROW(anthropic::to_chat_body(ojson::parse(bad), false), ApiError) << bad;
    }
    EXPECT_EQ(anthropic::error_body(429, "m")["error"]["type"], "rate_limit_error");
    EXPECT_EQ(anthropic::error_body(401, "m")["error"]["type"], "authentication_error");
    EXPECT_EQ(anthropic::error_body(503, "m")["error"]["type"], "overloaded_error");
    EXPECT_EQ(anthropic::tool_use_id("call_abc"), "toolu_abc");
}

// output_config: format is response_format's JSON schema, effort the reasoning effort;
// output_format is format's beta spelling; values the API does not define are refused.
TEST(AnthropicRequest, OutputConfigMapsOntoResponseFormatAndEffort) {
    const std::string msgs = R"("max_tokens":50,"messages":[{"role":"user","content":"x"}])";
    auto body = [&](const std::string& extra) {
        return ojson::parse("{" + msgs + "," + extra + "}");
    };
    const ojson schema = {
        {"type", "object"}, {"properties", {{"ok", {{"type", "boolean"}}}}}, {"required", {"ok"}}};
    const ojson want = {{"type", "json_schema"},
                        {"json_schema", {{"name", "output"}, {"schema", schema}}}};
    const ojson fmt = {{"type", "json_schema"}, {"schema", schema}};
    ojson chat =
        anthropic::to_chat_body(body(R"("output_config":{"format":)" + fmt.dump() + "}"), false);
    EXPECT_EQ(chat["response_format"], want);
    EXPECT_TRUE(parse_chat_request(chat, fx().mc).grammar);
    chat = anthropic::to_chat_body(body(R"("output_format":)" + fmt.dump()), false);
    EXPECT_EQ(chat["response_format"], want);

    for (const char* e : {"low", "medium", "high"})
        EXPECT_EQ(
            anthropic::to_chat_body(body(std::string(R"("output_config":{"effort":")") + e + "\"}"),
                                    false)["reasoning_effort"],
            e);
    for (const char* e : {"xhigh", "max"})
        EXPECT_EQ(
            anthropic::to_chat_body(body(std::string(R"("output_config":{"effort":")") + e + "\"}"),
                                    false)["reasoning_effort"],
            "max");
    // With thinking on, the effort is the prompt's.
    const GenRequest g = parse_chat_request(
        anthropic::to_chat_body(
            body(R"("thinking":{"type":"adaptive"},"output_config":{"effort":"low"})"), false),
        fx().mc);
    EXPECT_NE(fx().tok->decode(g.prompts[0].tokens).find("Reasoning Effort: Low"),
              std::string::npos);

    for (
        const char* bad : {
            R"("output_config":{"effort":"extreme"})",
            R"("output_config":{"effort":3})",
            R"("output_config":{"format":{"type":"text"}})",
            R"("output_config":{"format":{"type":"json_schema"}})",
            R"("output_config":{"task_budget":{"type":"tokens","total":1000}})",
            R"("output_config":"fast")",
            R"("output_format":{"type":"json_schema","schema":{"type":"object"}},"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}})",
        }) {
        try {
            anthropic::to_chat_body(body(bad), false);
            ADD_FAILURE() << "accepted " << bad;
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status(), 400) << bad;
            EXPECT_EQ(anthropic::error_body(e)["error"]["type"], "invalid_request_error");
            EXPECT_NE(std::string(e.what()).find("output_"), std::string::npos) << e.what();
        }
    }
}

// Fields of the Messages API that need what this server does not run are refused, naming
// them; those that ask for nothing it lacks are taken.
TEST(AnthropicRequest, FieldsItCannotServeAreRefusedByName) {
    const std::string msgs = R"("max_tokens":50,"messages":[{"role":"user","content":"x"}])";
    auto body = [&](const std::string& extra) {
        return ojson::parse("{" + msgs + "," + extra + "}");
    };
    for (const auto& [extra, name] : std::vector<std::pair<std::string, std::string>>{
             {R"("container":"c1")", "container"},
             {R"("mcp_servers":[{"type":"url","url":"https://x","name":"x"}])", "mcp_servers"},
             {R"("fallbacks":[{"model":"m"}])", "fallbacks"},
             {R"("speed":"fast")", "speed"},
             {R"("service_tier":"priority")", "service_tier"},
             {R"("thinking":{"type":"adaptive","display":"omitted"})", "thinking.display"},
             {R"("context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]})",
              "context_management"},
         }) {
        try {
            anthropic::to_chat_body(body(extra), false);
            ADD_FAILURE() << "accepted " << extra;
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status(), 400) << extra;
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    }
    for (const char* ok :
         {R"("mcp_servers":[])", R"("speed":"standard")", R"("service_tier":"auto")",
          R"("inference_geo":"us")", R"("cache_control":{"type":"ephemeral"})",
          R"("thinking":{"type":"adaptive","display":"summarized"})"})
        EXPECT_NO_THROW(anthropic::to_chat_body(body(ok), false)) << ok;
    const ojson chat = anthropic::to_chat_body(
        body(R"("context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]})"),
        false);
    EXPECT_EQ(chat["chat_template_kwargs"]["clear_thinking"], false);
}

// Claude Code's billing-header system block is metadata: two requests that differ only
// in it are one prompt.
TEST(AnthropicRequest, BillingHeaderSystemBlockIsDropped) {
    auto prompt = [](const std::string& system) {
        const ojson body = ojson::parse(R"({"max_tokens":50,"system":)" + system +
                                        R"(,"messages":[{"role":"user","content":"x"}]})");
        return parse_chat_request(anthropic::to_chat_body(body, false), fx().mc).prompts[0].tokens;
    };
    const std::string a =
        R"([{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=1;"},{"type":"text","text":"You are helpful."}])";
    const std::string b =
        R"([{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=2;"},{"type":"text","text":"You are helpful."}])";
    EXPECT_EQ(prompt(a), prompt(b));
    EXPECT_EQ(prompt(a), prompt(R"([{"type":"text","text":"You are helpful."}])"));
    EXPECT_NE(prompt(a), prompt(R"([{"type":"text","text":"You are brief."}])"));
    // Only that block: the same words elsewhere stay.
    EXPECT_NE(prompt(R"([{"type":"text","text":"Note x-anthropic-billing-header: 1"}])"),
              prompt(R"([{"type":"text","text":"Note x-anthropic-billing-header: 2"}])"));
    // A system of that block alone is no system message at all.
    const ojson only = anthropic::to_chat_body(
        ojson::parse(
            R"({"max_tokens":5,"system":[{"type":"text","text":"x-anthropic-billing-header: a;"}],"messages":[{"role":"user","content":"x"}]})"),
        false);
    EXPECT_EQ(only["messages"].size(), 1u) << only.dump();
}
