// Reply parser tests: reasoning / content / tool calls, streamed in every possible split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "text/chat.h"
#include "text/reply_parser.h"

using namespace glm5::text;
using ojson = nlohmann::ordered_json;

namespace {

ReplyParserOptions opts(bool reasoning_open, ojson tools = nullptr) {
    ReplyParserOptions o;
    o.reasoning_open = reasoning_open;
    o.tools = std::move(tools);
    return o;
}

// Feeds `chunks`, checks that the deltas add up to the final result, returns the result.
ParsedReply run(const ReplyParserOptions& o, const std::vector<std::string>& chunks) {
    ReplyParser p(o);
    ParsedReply sum;
    auto add = [&](const ReplyDelta& d) {
        sum.reasoning += d.reasoning;
        sum.content += d.content;
        sum.tool_calls.insert(sum.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    };
    for (const std::string& c : chunks) add(p.feed(c));
    add(p.finish());
    const ParsedReply& r = p.result();
    EXPECT_EQ(sum.reasoning, r.reasoning);
    EXPECT_EQ(sum.content, r.content);
    EXPECT_EQ(sum.tool_calls.size(), r.tool_calls.size());
    return r;
}

ParsedReply run1(const ReplyParserOptions& o, const std::string& text) {
    return run(o, {text});
}

std::string calls_json(const ParsedReply& r) {
    ojson a = ojson::array();
    for (const ToolCall& c : r.tool_calls)
        a.push_back({{"name", c.name}, {"arguments", c.arguments}});
    return a.dump();
}

void expect_same(const ParsedReply& a, const ParsedReply& b, const std::string& where) {
    EXPECT_EQ(a.reasoning, b.reasoning) << where;
    EXPECT_EQ(a.content, b.content) << where;
    EXPECT_EQ(calls_json(a), calls_json(b)) << where;
    EXPECT_EQ(a.reasoning_unterminated, b.reasoning_unterminated) << where;
    EXPECT_EQ(a.tool_call_unterminated, b.tool_call_unterminated) << where;
}

}  // namespace

TEST(TextReply, ReasoningThenContent) {
    ParsedReply r = run1(opts(true), "I should add.</think>The answer is 4.");
    EXPECT_EQ(r.reasoning, "I should add.");
    EXPECT_EQ(r.content, "The answer is 4.");
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_FALSE(r.reasoning_unterminated);
    // Newlines after </think> are not content.
    r = run1(opts(true), "\nplan\n</think>\n\nAnswer\n");
    EXPECT_EQ(r.reasoning, "\nplan\n");
    EXPECT_EQ(r.content, "Answer\n");
}

TEST(TextReply, NoThinkReply) {
    ParsedReply r = run1(opts(false), "Hello there.");
    EXPECT_EQ(r.reasoning, "");
    EXPECT_EQ(r.content, "Hello there.");
    // A stray </think> in content is content.
    r = run1(opts(false), "a </think> b");
    EXPECT_EQ(r.content, "a </think> b");
}

TEST(TextReply, ReplyThatOpensItsOwnThink) {
    ParsedReply r = run1(opts(false), "\n<think>hmm</think>\n\nOK");
    EXPECT_EQ(r.reasoning, "hmm");
    EXPECT_EQ(r.content, "OK");
    // Only at the very start: later it is plain text.
    r = run1(opts(false), "x <think>y</think>");
    EXPECT_EQ(r.reasoning, "");
    EXPECT_EQ(r.content, "x <think>y</think>");
    // A prefix of <think> that turns out not to be one.
    r = run(opts(false), {"<thi", "s is"});
    EXPECT_EQ(r.content, "<this is");
    r = run(opts(false), {"<th"});
    EXPECT_EQ(r.content, "<th");
}

TEST(TextReply, UnterminatedReasoning) {
    ParsedReply r = run(opts(true), {"thinking for", "ever </thi"});
    EXPECT_EQ(r.reasoning, "thinking forever </thi");
    EXPECT_EQ(r.content, "");
    EXPECT_TRUE(r.reasoning_unterminated);
}

TEST(TextReply, ToolCallWithTypedArguments) {
    const std::string reply =
        "Need weather.</think>Let me check.\n<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>"
        "<arg_key>flags</arg_key><arg_value>{\"a\": [1, true, null]}</arg_value>"
        "<arg_key>ratio</arg_key><arg_value>0.5</arg_value>"
        "<arg_key>quoted</arg_key><arg_value>\"x\"</arg_value>"
        "<arg_key>text</arg_key><arg_value>12 apples</arg_value>"
        "<arg_key>zip</arg_key><arg_value>01234</arg_value></tool_call>";
    ParsedReply r = run1(opts(true), reply);
    EXPECT_EQ(r.reasoning, "Need weather.");
    EXPECT_EQ(r.content, "Let me check.\n");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");
    EXPECT_EQ(
        r.tool_calls[0].arguments.dump(),
        R"({"city":"Oslo","days":2,"flags":{"a":[1,true,null]},"ratio":0.5,"quoted":"\"x\"","text":"12 apples","zip":"01234"})");
}

TEST(TextReply, SchemaStringParametersStayStrings) {
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {
          "code": {"type": "string"}, "n": {"type": "integer"}, "maybe": {"type": ["string", "null"]}}}}}])");
    ParsedReply r = run1(opts(false, tools),
                         "<tool_call>lookup<arg_key>code</arg_key><arg_value>12345</arg_value>"
                         "<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>maybe</arg_key>"
                         "<arg_value>true</arg_value></tool_call>");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].arguments.dump(), R"({"code":"12345","n":7,"maybe":"true"})");
    // Another tool's parameters are not affected.
    r = run1(opts(false, tools),
             "<tool_call>other<arg_key>code</arg_key><arg_value>12345</arg_value></tool_call>");
    EXPECT_EQ(r.tool_calls[0].arguments.dump(), R"({"code":12345})");
}

TEST(TextReply, SeveralCallsAndWhitespace) {
    ParsedReply r = run1(opts(false),
                         "<tool_call>a</tool_call>\n<tool_call> b \n<arg_key> x </arg_key>\n"
                         "<arg_value>1</arg_value>\n</tool_call>\n");
    ASSERT_EQ(r.tool_calls.size(), 2u);
    EXPECT_EQ(r.tool_calls[0].name, "a");
    EXPECT_EQ(r.tool_calls[0].arguments.dump(), "{}");
    EXPECT_EQ(r.tool_calls[1].name, "b");
    EXPECT_EQ(r.tool_calls[1].arguments.dump(), R"({"x":1})");
    EXPECT_EQ(r.content, "");
    // Text after a call is content.
    r = run1(opts(false), "<tool_call>a</tool_call>\n\nDone.");
    EXPECT_EQ(r.content, "Done.");
}

TEST(TextReply, MalformedAndUnterminatedCallsBecomeContent) {
    ParsedReply r = run1(opts(false), "<tool_call><arg_key>x</arg_key></tool_call>");
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_EQ(r.content, "<tool_call><arg_key>x</arg_key></tool_call>");
    r = run1(opts(false), "<tool_call>f<arg_key>x</arg_key>oops</tool_call>");
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_EQ(r.content, "<tool_call>f<arg_key>x</arg_key>oops</tool_call>");
}

// A call the generation cut off (max_tokens) is the call as far as it came: its name and
// the arguments whose values arrived whole, never its markup as content; no call at all
// when even its name was cut off.
TEST(TextReply, CutOffCallsKeepTheirNameAndWholeArguments) {
    ParsedReply r = run(opts(false), {"ok <tool_call>f<arg_key>x</arg_", "key><arg_value>1"});
    EXPECT_TRUE(r.tool_call_unterminated);
    EXPECT_EQ(r.content, "ok ");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "f");
    EXPECT_EQ(r.tool_calls[0].arguments, ojson::object());

    r = run1(opts(false),
             "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days"
             "</arg_key><arg_value>2");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");
    EXPECT_EQ(r.tool_calls[0].arguments, ojson({{"city", "Oslo"}}));
    EXPECT_TRUE(r.content.empty()) << r.content;

    r = run1(opts(false), "<tool_call>get_weather<arg_k");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");

    // Nothing after the name: a call only when it names one of the tools.
    r = run1(opts(false), "<tool_call>get_wea");
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_TRUE(r.content.empty()) << r.content;
    EXPECT_TRUE(r.tool_call_unterminated);
    const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather"}}])");
    r = run1(opts(true, tools), "</think><tool_call>get_weather");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");
    r = run1(opts(false), "<tool_call>");
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_TRUE(r.content.empty());
}

TEST(TextReply, EverySplitPointGivesTheSameResult) {
    const std::vector<std::pair<bool, std::string>> replies = {
        {true,
         "Need weather.</think>Let me check.\n<tool_call>get_weather<arg_key>city</arg_key>"
         "<arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"},
        {false, "\n<think>東京?</think>\n\nIt is <b>hot</b> in 東京 <tool_c <think> </tool_call>"},
        {false, "<tool_call>f<arg_key>k</arg_key><arg_value>[1, 2]</arg_value></tool_call>\nafter"},
        {true, "no end </thin"},
    };
    for (const auto& [open, text] : replies) {
        const ParsedReply whole = run1(opts(open), text);
        // Two chunks, split at every byte.
        for (size_t i = 0; i <= text.size(); ++i)
            expect_same(run(opts(open), {text.substr(0, i), text.substr(i)}), whole,
                        text + " @" + std::to_string(i));
        // One byte at a time.
        std::vector<std::string> bytes;
        for (char c : text) bytes.emplace_back(1, c);
        expect_same(run(opts(open), bytes), whole, text + " bytewise");
        // Random splits, empty chunks included.
        std::mt19937 rng(42);
        for (int t = 0; t < 200; ++t) {
            std::vector<std::string> chunks;
            for (size_t p = 0; p < text.size();) {
                size_t len = rng() % 6;
                chunks.push_back(text.substr(p, len));
                p += len;
            }
            expect_same(run(opts(open), chunks), whole, text + " random");
        }
    }
    // And the whole-text results are the right ones.
    ParsedReply r = run1(opts(false), replies[1].second);
    EXPECT_EQ(r.reasoning, "東京?");
    EXPECT_EQ(r.content, "It is <b>hot</b> in 東京 <tool_c <think> </tool_call>");
}

TEST(TextReply, PartialMarkersNeverLeak) {
    // While a chunk ends in something that may still become a marker, nothing of it is out.
    ReplyParser p(opts(true));
    ReplyDelta d = p.feed("abc</th");
    EXPECT_EQ(d.reasoning, "abc");
    d = p.feed("ink>x<tool_");
    EXPECT_EQ(d.reasoning, "");
    EXPECT_EQ(d.content, "x");
    d = p.feed("call>f");
    EXPECT_TRUE(d.empty());
    d = p.feed("</tool_call>");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "f");
    EXPECT_TRUE(p.finish().empty());
}

TEST(TextReply, RendererAndParserAgree) {
    // A tool call rendered into a past turn parses back to the same call.
    ToolCall c;
    c.name = "search";
    c.arguments = ojson::parse(R"({"query": "glm <5>", "limit": 3, "filters": {"lang": ["en"]}})");
    ChatMessage a;
    a.role = "assistant";
    a.reasoning_content = "Look it up.";
    a.tool_calls = {c};
    ChatMessage u;
    u.role = "user";
    u.content = "find";
    ChatOptions o;
    o.thinking = true;
    o.add_generation_prompt = false;
    const std::string prompt = ChatFormat(ChatStyle::GlmDsa).render({u, a}, nullptr, o).text;
    const std::string head = "<|assistant|><think>";
    const size_t at = prompt.find(head);
    ASSERT_NE(at, std::string::npos);
    ParsedReply r = run1(opts(true), prompt.substr(at + head.size()));
    EXPECT_EQ(r.reasoning, "Look it up.");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "search");
    EXPECT_EQ(r.tool_calls[0].arguments, c.arguments);
}

TEST(TextReply, ReplyJoinsTheHistory) {
    // One chat turn: render, "generate", parse, append, render the next turn.
    ChatFormat f(ChatStyle::GlmDsa);
    ChatOptions o;
    o.thinking = true;
    std::vector<ChatMessage> history(1);
    history[0].role = "user";
    history[0].content = "Hi";
    RenderedPrompt p = f.render(history, nullptr, o);
    ASSERT_TRUE(p.reasoning_open);
    ReplyParser parser(opts(p.reasoning_open));
    parser.feed("Greet back.</think>Hello!");
    parser.finish();
    history.push_back(assistant_message(parser.result()));
    ChatMessage u;
    u.role = "user";
    u.content = "Bye";
    history.push_back(u);
    EXPECT_EQ(f.render(history, nullptr, o).text,
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think></think>"
              "Hello!<|user|>Bye<|assistant|><think>");
    EXPECT_EQ(ChatFormat(ChatStyle::Glm5Next).render(history).text,
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think>Greet "
              "back.</think>Hello!<|user|>Bye<|assistant|><think>");
}

// Model output is bounded like a request body: an argument nested deeper than 64
// levels stays the raw string (nested JSON is written out recursively later), and
// a call whose text passes 1 MiB without its close is given up as content.
TEST(TextReply, ToolCallArgumentsAreBoundedInDepthAndSize) {
    const std::string deep = std::string(100, '[') + std::string(100, ']');
    const std::string ok = std::string(60, '[') + std::string(60, ']');
    ParsedReply r = run1(opts(false), "<tool_call>f<arg_key>a</arg_key><arg_value>" + deep +
                                          "</arg_value><arg_key>b</arg_key><arg_value>" + ok +
                                          "</arg_value></tool_call>");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_TRUE(r.tool_calls[0].arguments["a"].is_string());
    EXPECT_EQ(r.tool_calls[0].arguments["a"].get<std::string>(), deep);
    EXPECT_TRUE(r.tool_calls[0].arguments["b"].is_array());

    ReplyParser p(opts(false));
    std::string content;
    content += p.feed("<tool_call>f<arg_key>a</arg_key><arg_value>").content;
    const std::string piece(4096, 'x');
    for (int i = 0; i < 300; ++i) content += p.feed(piece).content;  // 1.2 MiB
    EXPECT_GT(content.size(), size_t(1) << 20) << "the oversized call was still buffered";
    EXPECT_EQ(content.rfind("<tool_call>f", 0), 0u);
    content += p.feed("</arg_value></tool_call>").content;
    content += p.finish().content;
    EXPECT_TRUE(p.result().tool_calls.empty());
    std::string all = "<tool_call>f<arg_key>a</arg_key><arg_value>";
    for (int i = 0; i < 300; ++i) all += piece;
    EXPECT_EQ(content, all + "</arg_value></tool_call>");  // nothing lost, nothing parsed
}
