// Tokenizer tests on the glm-dsa fixture vocabulary (tests/data/glm-dsa/vocab.json, the
// vocabulary embedded in every glm-dsa fixture): llama.cpp goldens, exact round trips,
// streaming decode, the pre-tokenizer's regex semantics, stop ids, speed on long input.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using namespace glm5::text;
using nlohmann::json;

namespace {

json load_json(const std::string& rel) {
    std::ifstream f(std::string(GLM5_TEST_DATA) + "/" + rel);
    EXPECT_TRUE(f.good()) << rel;
    return json::parse(f);
}

VocabData fixture_vocab() {
    json v = load_json("glm-dsa/vocab.json");
    VocabData d;
    d.pre = v["pre"].get<std::string>();
    d.tokens = v["tokens"].get<std::vector<std::string>>();
    for (int t : v["token_types"]) d.types.push_back(static_cast<TokenType>(t));
    d.merges = v["merges"].get<std::vector<std::string>>();
    // The ids the fixture GGUFs carry (shared/fixtures/README.md); eot / eom are left
    // out on purpose so that the lookup by text is exercised.
    const json& sp = v["special_ids"];
    d.special.bos = sp["[gMASK]"].get<int>();
    d.special.eos = sp["<|endoftext|>"].get<int>();
    d.special.unk = d.special.eos;
    d.special.pad = d.special.eos;
    return d;
}

const Tokenizer& fixture_tokenizer() {
    static const std::unique_ptr<Tokenizer> tok = std::make_unique<Tokenizer>(fixture_vocab());
    return *tok;
}

std::vector<std::string> pieces(std::string_view text) {
    std::vector<std::string_view> p;
    pretokenize_glm4(text, p);
    return {p.begin(), p.end()};
}

std::string random_utf8(std::mt19937& rng, size_t n_chars) {
    // Mostly ASCII and Latin with a sprinkling of every plane, newlines and odd spaces.
    static const uint32_t specials[] = {'\n',  '\r',   '\t',    ' ',      ' ',
                                        '\'',  0xA0,   0x3000,  0x2028,   0x85,
                                        0x301, 0xFFFD, 0x1F680, 0x10FFFF, 0};
    std::uniform_int_distribution<int> kind(0, 9);
    std::string s;
    for (size_t i = 0; i < n_chars; ++i) {
        uint32_t cp;
        switch (kind(rng)) {
            case 0:
                cp = specials[rng() % std::size(specials)];
                break;
            case 1:
                cp = 0x80 + rng() % (0x800 - 0x80);
                break;
            case 2:
                cp = 0x800 + rng() % (0xD800 - 0x800);
                break;
            case 3:
                cp = 0x10000 + rng() % (0x110000 - 0x10000);
                break;
            case 4:
                cp = '0' + rng() % 10;
                break;
            default:
                cp = 0x20 + rng() % 0x5F;
                break;
        }
        append_utf8(s, cp);
    }
    return s;
}

}  // namespace

TEST(TextTokenizer, LlamaCppGoldenWithAndWithoutSpecialParsing) {
    const Tokenizer& tok = fixture_tokenizer();
    json g = load_json("glm-dsa/tokenization.golden.json");
    ASSERT_GE(g["cases"].size(), 10u);
    for (const json& c : g["cases"]) {
        const std::string text = c["text"].get<std::string>();
        SCOPED_TRACE(text);
        const auto ids = c["ids"].get<std::vector<TokenId>>();
        EXPECT_EQ(tok.encode(text, true), ids);
        EXPECT_EQ(tok.encode(text, false), c["ids_no_parse_special"].get<std::vector<TokenId>>());
        const auto exp_pieces = c["pieces"].get<std::vector<std::string>>();
        ASSERT_EQ(exp_pieces.size(), ids.size());
        for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tok.token_text(ids[i]), exp_pieces[i]);
        EXPECT_EQ(tok.decode(ids), text);
        EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
    }
}

TEST(TextTokenizer, SpecialIdsAndStopSet) {
    const Tokenizer& tok = fixture_tokenizer();
    EXPECT_EQ(tok.n_vocab(), 768);
    EXPECT_EQ(tok.find("<|user|>"), 749);
    EXPECT_EQ(tok.find("<|observation|>"), 751);
    EXPECT_EQ(tok.find("no such token"), kNoToken);
    // eot / eom were not given: found by their text.
    EXPECT_EQ(tok.special().eot, 749);
    EXPECT_EQ(tok.special().eom, 751);
    EXPECT_EQ(tok.stop_ids(), (std::vector<TokenId>{742, 749, 751}));
    EXPECT_TRUE(tok.is_stop(749));
    EXPECT_FALSE(tok.is_stop(750));  // <|assistant|> does not end a generation
    EXPECT_FALSE(tok.is_stop(744));
    EXPECT_TRUE(tok.is_control(758));
    EXPECT_FALSE(tok.is_control(100));
}

TEST(TextTokenizer, ControlTokensRenderAsText) {
    const Tokenizer& tok = fixture_tokenizer();
    const auto ids = tok.encode("<|assistant|><think>hi</think>");
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids[0], 750);
    EXPECT_EQ(ids[1], 758);
    EXPECT_EQ(ids.back(), 759);
    EXPECT_EQ(tok.decode(ids), "<|assistant|><think>hi</think>");
    EXPECT_EQ(tok.decode(ids, /*render_special=*/false), "hi");
}

TEST(TextTokenizer, SpecialTokenMatchingCornerCases) {
    const Tokenizer& tok = fixture_tokenizer();
    // Adjacent, repeated, at both ends, and a broken one that must stay text.
    auto ids = tok.encode("<|user|><|user|>x<|user|");
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids[0], 749);
    EXPECT_EQ(ids[1], 749);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 749), 2);
    EXPECT_EQ(tok.decode(ids), "<|user|><|user|>x<|user|");
    // Without special parsing no control id can appear.
    for (TokenId id : tok.encode("[gMASK]<sop><|system|>a</think>", false)) EXPECT_LT(id, 742);
}

TEST(TextTokenizer, RoundTripRandomUtf8) {
    const Tokenizer& tok = fixture_tokenizer();
    std::mt19937 rng(1234);
    for (int i = 0; i < 3000; ++i) {
        const std::string s = random_utf8(rng, rng() % 40);
        ASSERT_EQ(tok.decode(tok.encode(s, true)), s);
        ASSERT_EQ(tok.decode(tok.encode(s, false)), s);
    }
}

TEST(TextTokenizer, RoundTripArbitraryBytes) {
    // Invalid UTF-8 goes through the byte tokens and comes back unchanged.
    const Tokenizer& tok = fixture_tokenizer();
    std::mt19937 rng(99);
    for (int i = 0; i < 2000; ++i) {
        std::string s(rng() % 24, '\0');
        for (char& c : s) c = char(rng() % 256);
        ASSERT_EQ(tok.decode(tok.encode(s, false)), s);
    }
}

TEST(TextTokenizer, StreamingDecodeEqualsWholeDecode) {
    const Tokenizer& tok = fixture_tokenizer();
    std::mt19937 rng(7);
    for (int i = 0; i < 500; ++i) {
        const std::string s = random_utf8(rng, 1 + rng() % 30);
        const auto ids = tok.encode(s);
        StreamDecoder dec(tok);
        std::string streamed;
        for (TokenId id : ids) {
            std::string part = dec.push(id);
            ASSERT_TRUE(is_valid_utf8(part));  // never half a character
            streamed += part;
        }
        streamed += dec.flush();
        ASSERT_EQ(streamed, s);
    }
    // Arbitrary byte strings pushed in random splits: the stream equals the sanitized
    // whole, and every piece is valid UTF-8.
    for (int i = 0; i < 2000; ++i) {
        std::string bytes(rng() % 16, '\0');
        for (char& c : bytes) c = char(0x80 + rng() % 0x80 - (rng() % 3 == 0 ? 0x40 : 0));
        StreamDecoder dec(tok);
        std::string streamed;
        for (size_t p = 0; p < bytes.size();) {
            size_t len = 1 + rng() % 3;
            std::string part = dec.push_bytes(std::string_view(bytes).substr(p, len));
            ASSERT_TRUE(is_valid_utf8(part));
            streamed += part;
            p += len;
        }
        streamed += dec.flush();
        ASSERT_EQ(streamed, sanitize_utf8(bytes));
    }
}

TEST(TextTokenizer, StreamDecoderHoldsIncompleteCharacter) {
    const Tokenizer& tok = fixture_tokenizer();
    StreamDecoder dec(tok);
    // "東" = E6 9D B1, fed one byte at a time.
    EXPECT_EQ(dec.push_bytes("\xE6"), "");
    EXPECT_TRUE(dec.has_pending());
    EXPECT_EQ(dec.push_bytes("\x9D"), "");
    EXPECT_EQ(dec.push_bytes("\xB1!"), "東!");
    EXPECT_FALSE(dec.has_pending());
    // A lead byte followed by a non-continuation: U+FFFD, then the byte's own text.
    EXPECT_EQ(dec.push_bytes("\xE6"), "");
    EXPECT_EQ(dec.push_bytes("a"),
              "\xEF\xBF\xBD"
              "a");
    // Unfinished at the end of the stream.
    EXPECT_EQ(dec.push_bytes("\xF0\x9F"), "");
    EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

TEST(TextUnicode, SanitizeUsesMaximalSubparts) {
    EXPECT_EQ(sanitize_utf8("ok"), "ok");
    EXPECT_EQ(sanitize_utf8("\xE6\x9D"), "\xEF\xBF\xBD");              // truncated: one
    EXPECT_EQ(sanitize_utf8("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // two stray
    EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
    EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
    EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
    EXPECT_TRUE(is_valid_utf8("\xF4\x8F\xBF\xBF"));
}

TEST(TextUnicode, CharacterClasses) {
    EXPECT_EQ(char_class('a'), CharClass::Letter);
    EXPECT_EQ(char_class(0x6771), CharClass::Letter);  // 東
    EXPECT_EQ(char_class(0x01C5), CharClass::Letter);  // Lt
    EXPECT_EQ(char_class('7'), CharClass::Number);
    EXPECT_EQ(char_class(0x00BD), CharClass::Number);  // ½ (No)
    EXPECT_EQ(char_class(0x216B), CharClass::Number);  // Ⅻ (Nl)
    EXPECT_EQ(char_class(0x3000), CharClass::Space);
    EXPECT_EQ(char_class(0x0085), CharClass::Space);
    EXPECT_EQ(char_class(0x001C), CharClass::Other);  // not White_Space
    EXPECT_EQ(char_class(0x200B), CharClass::Other);  // zero-width space is Cf
    EXPECT_EQ(char_class(0x0301), CharClass::Other);  // combining mark
    EXPECT_EQ(char_class(0x1F680), CharClass::Other);
    EXPECT_EQ(char_class(0x110000), CharClass::Other);
}

// Expected splits written from the regex by hand.
TEST(TextPretokenize, RegexSemantics) {
    using V = std::vector<std::string>;
    EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
    EXPECT_EQ(pieces("I'LL don't"), (V{"I", "'LL", " don", "'t"}));
    EXPECT_EQ(pieces("1234567"), (V{"123", "456", "7"}));
    EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
    EXPECT_EQ(pieces("a   "), (V{"a", "   "}));
    EXPECT_EQ(pieces("x \n\n  y"), (V{"x", " \n\n", " ", " y"}));
    EXPECT_EQ(pieces("(a) ..."), (V{"(a", ")", " ..."}));
    EXPECT_EQ(pieces("end.\n\nNext"), (V{"end", ".\n\n", "Next"}));
    EXPECT_EQ(pieces("\tword"), (V{"\tword"}));
    EXPECT_EQ(pieces("3rd"), (V{"3", "rd"}));
    EXPECT_EQ(pieces("a\r\n"), (V{"a", "\r\n"}));
    EXPECT_EQ(pieces(" !?x"), (V{" !?", "x"}));
    EXPECT_EQ(pieces("'x"), (V{"'x"}));
    EXPECT_EQ(pieces("東京 🚀!"), (V{"東京", " 🚀!"}));
    EXPECT_EQ(pieces("é\xCC\x81t"), (V{"é", "\xCC\x81t"}));  // a combining mark is not \p{L}
    EXPECT_EQ(pieces(""), V{});
}

TEST(TextTokenizer, LongInputsAreFastAndExact) {
    const Tokenizer& tok = fixture_tokenizer();
    std::mt19937 rng(5);
    std::string text;
    static const char* words[] = {"the ",   "quick ", "brown ", "fox ",   "jumps\n", "12345 ",
                                  "naïve ", "東京 ",  "(x) ",   "don't ", "  ",      "<|user|>"};
    while (text.size() < 100000) text += words[rng() % std::size(words)];
    auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(tok.decode(ids), text);
    EXPECT_LT(ms, 2000.0) << "100 KB prompt took " << ms << " ms";
    std::printf("[ info ] 100 KB mixed text: %zu tokens in %.1f ms\n", ids.size(), ms);

    // One 100 KB "word" and one 100 KB punctuation run: BPE must not go quadratic.
    for (std::string big : {std::string(100000, 'a'), std::string(100000, '=')}) {
        t0 = std::chrono::steady_clock::now();
        const auto big_ids = tok.encode(big);
        const double big_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        EXPECT_EQ(tok.decode(big_ids), big);
        EXPECT_LT(big_ms, 2000.0);
        std::printf("[ info ] 100 KB of '%c': %zu tokens in %.1f ms\n", big[0], big_ids.size(),
                    big_ms);
    }
}

TEST(TextTokenizer, BpeMergesByRankThenLeftmost) {
    // A hand-made vocabulary: bytes for a, b, c plus merges chosen so that rank order and
    // position order disagree.
    VocabData d;
    d.tokens = {"a", "b", "c", "ab", "bc", "abc", "aa"};
    d.merges = {"b c", "a b", "a bc", "a a"};
    Tokenizer tok(std::move(d));
    EXPECT_EQ(tok.encode("abc"), (std::vector<TokenId>{5}));  // b c first, then a bc
    EXPECT_EQ(tok.encode("ab"), (std::vector<TokenId>{3}));
    EXPECT_EQ(tok.encode("aaa"), (std::vector<TokenId>{6, 0}));  // leftmost of equal ranks
    EXPECT_EQ(tok.encode("abab"), (std::vector<TokenId>{3, 3}));
    // Bytes the vocabulary lacks have no token: nothing is invented for them.
    EXPECT_EQ(tok.encode("ad"), (std::vector<TokenId>{0}));
}

TEST(TextTokenizer, RejectsBadVocabularies) {
    VocabData d;
    d.tokens = {"a", "b"};
    d.pre = "llama3";
    EXPECT_THROW(Tokenizer{d}, glm5::Error);
    d.pre = "glm4";
    d.merges = {"ab"};
    EXPECT_THROW(Tokenizer{d}, glm5::Error);
    d.merges = {};
    d.special.eos = 7;
    EXPECT_THROW(Tokenizer{d}, glm5::Error);
    d.special.eos = kNoToken;
    d.types = {TokenType::Normal};
    EXPECT_THROW(Tokenizer{d}, glm5::Error);
}

TEST(TextTokenizer, UserDefinedTokensMatchEvenWithoutSpecialParsing) {
    VocabData d = fixture_vocab();
    const TokenId user_def = TokenId(d.tokens.size());
    d.tokens.push_back("<my_tool>");
    d.types.push_back(TokenType::UserDefined);
    const TokenId ctrl = TokenId(d.tokens.size());
    d.tokens.push_back("<|ctl|>");
    d.types.push_back(TokenType::Control);
    Tokenizer tok(std::move(d));
    const std::string text = "a<my_tool>b<|ctl|>c";
    const auto on = tok.encode(text, true);
    const auto off = tok.encode(text, false);
    EXPECT_EQ(std::count(on.begin(), on.end(), user_def), 1);
    EXPECT_EQ(std::count(on.begin(), on.end(), ctrl), 1);
    EXPECT_EQ(std::count(off.begin(), off.end(), user_def), 1);  // still matched
    EXPECT_EQ(std::count(off.begin(), off.end(), ctrl), 0);      // plain text now
    EXPECT_EQ(tok.decode(on), text);
    EXPECT_EQ(tok.decode(off), text);
    // Rendering without special tokens drops control tokens only.
    EXPECT_EQ(tok.decode(on, false), "a<my_tool>bc");
}

TEST(TextTokenizer, LongerSpecialTokensAreCutFirst) {
    VocabData d = fixture_vocab();
    const TokenId ab = TokenId(d.tokens.size());
    d.tokens.push_back("<ab>");
    d.types.push_back(TokenType::Control);
    const TokenId abc = TokenId(d.tokens.size());
    d.tokens.push_back("<ab>c");
    d.types.push_back(TokenType::Control);
    const TokenId bcd = TokenId(d.tokens.size());
    d.tokens.push_back("b>cdef");
    d.types.push_back(TokenType::Control);
    Tokenizer tok(std::move(d));
    // "<ab>c" is longer than "<ab>", so it wins where both fit.
    EXPECT_EQ(tok.encode("<ab>c<ab>"), (std::vector<TokenId>{abc, ab}));
    // Longest token first over the whole text (not leftmost first): "b>cdef" is cut before
    // "<ab>" or "<ab>c" could match, leaving "<a" as text.
    const auto ids = tok.encode("<ab>cdef");
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), bcd);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), ab), 0);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), abc), 0);
    EXPECT_EQ(tok.decode(ids), "<ab>cdef");
}

// The scan keeps only the units of the piece it is reading: over a text long enough
// to drop them many times, every piece is the one a scan starting at its first byte
// finds (a piece depends on the text from its start only, but for digits, which
// \p{N}{1,3} groups from the start of their run), and the pieces add up to the text.
TEST(TextTokenizer, LongTextScannedInPiecesKeepsEveryPiece) {
    std::mt19937 rng(7);
    const std::string text = random_utf8(rng, 200000);
    std::vector<std::string_view> p;
    pretokenize_glm4(text, p);
    ASSERT_GT(p.size(), 20000u);
    std::string joined;
    for (auto s : p) joined += s;
    EXPECT_EQ(joined, text);
    size_t checked = 0;
    for (size_t k = 0; k < p.size(); k += 97) {
        if (char_class(utf8_decode(p[k], 0).cp) == CharClass::Number) continue;
        ++checked;
        const size_t at = size_t(p[k].data() - text.data());
        std::string_view first;
        pretokenize_glm4(std::string_view(text).substr(at), [&](std::string_view s) {
            first = s;
            return false;
        });
        ASSERT_EQ(first, p[k]) << "piece " << k;
    }
    EXPECT_GT(checked, 150u);
}

// encode_append with a limit: the whole encoding when it fits, a refusal with a
// prefix of it when it does not, however the text is too long (many pieces, one
// piece longer than any encoding of the limit, special tokens).
TEST(TextTokenizer, EncodeStopsPastItsLimit) {
    const Tokenizer& tok = fixture_tokenizer();
    ASSERT_GE(tok.max_token_bytes(), 1u);
    for (size_t i = 0; i < size_t(tok.n_vocab()); ++i)
        EXPECT_LE(tok.token_bytes(TokenId(i)).size(), tok.max_token_bytes());
    std::mt19937 rng(3);
    const std::string text = random_utf8(rng, 3000) + "<|user|>" + random_utf8(rng, 3000);
    const std::vector<TokenId> all = tok.encode(text, true);
    ASSERT_GT(all.size(), 100u);

    std::vector<TokenId> out;
    EXPECT_TRUE(tok.encode_append(text, true, out, all.size()));
    EXPECT_EQ(out, all);
    for (size_t limit : {size_t(0), size_t(1), size_t(50), all.size() / 2, all.size() - 1}) {
        out.clear();
        EXPECT_FALSE(tok.encode_append(text, true, out, limit)) << limit;
        ASSERT_LE(out.size(), all.size());
        EXPECT_TRUE(std::equal(out.begin(), out.end(), all.begin())) << limit;
    }
    // Appending counts what `out` already holds.
    out.assign(10, 0);
    EXPECT_FALSE(tok.encode_append(text, true, out, all.size() + 9));
    out.assign(10, 0);
    EXPECT_TRUE(tok.encode_append(text, true, out, all.size() + 10));

    // One piece (a run of letters) longer than any 100-token encoding: refused.
    const std::string run(size_t(4) << 20, 'a');
    out.clear();
    EXPECT_FALSE(tok.encode_append(run, true, out, 100));
    EXPECT_LE(out.size(), 101u);
    // A text whose bytes alone cannot fit is refused before it is looked at.
    out.clear();
    EXPECT_FALSE(tok.encode_append(text, true, out, text.size() / tok.max_token_bytes() - 1));
    EXPECT_TRUE(out.empty());
}
