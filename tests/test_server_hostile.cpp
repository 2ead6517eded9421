// What a hostile client on the same machine tried against glm5 serve, each now refused or
// bounded: images sized from their headers and counted against the context before any is
// decoded, their pixels charged to the body budget; /tokenize's reply written as it is sent;
// slot files never written through a link nor over a file that is not one, 0600, in a folder
// only its owner writes, read only from a regular file whose header fits; a POST with no
// length has no body; slot ids that overflow name no slot; /metrics behind the key and keys
// compared as sent; completion prompts counted before they are encoded; a foreign Host or
// Origin refused; names that would forge a log line escaped. And what held, kept: names that
// leave the folder, forged slot files, a body framed two ways.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/server_process.h"

using glm5::test::base64;
using glm5::test::connect_loopback;
using glm5::test::http_get;
using glm5::test::http_post;
using glm5::test::http_raw;
using glm5::test::http_request;
using glm5::test::HttpReply;
using glm5::test::parse_reply;
using glm5::test::read_until_closed;
using glm5::test::send_all;
using glm5::test::ServerProcess;
using glm5::test::vm_kib;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(GLM5_TEST_DATA);
const std::string kModel = kData + "/glm-dsa/tiny.gguf";

std::string error_code(const HttpReply& r) {
    const json j = json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("error") || !j["error"].contains("code")) return "?";
    return j["error"]["code"].is_string() ? j["error"]["code"].get<std::string>() : "null";
}

std::string error_message(const HttpReply& r) {
    const json j = json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("error")) return "";
    return j["error"].value("message", "");
}

// The server's peak RSS is counted from here on (clear_refs 5 resets VmHWM).
void reset_peak(pid_t pid) {
    std::ofstream("/proc/" + std::to_string(pid) + "/clear_refs") << "5";
}

// An RGB PNG of w x h black pixels (compressed to a few KB).
std::string black_png(uint32_t w, uint32_t h) {
    std::string raw;
    const std::string row(size_t(w) * 3 + 1, '\0');  // filter byte 0, then the pixels
    raw.reserve(row.size() * h);
    for (uint32_t y = 0; y < h; ++y) raw += row;
    uLongf n = compressBound(uLong(raw.size()));
    std::string z(n, '\0');
    compress2(reinterpret_cast<Bytef*>(z.data()), &n, reinterpret_cast<const Bytef*>(raw.data()),
              uLong(raw.size()), 9);
    z.resize(n);
    auto be32 = [](uint32_t v) {
        return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
    };
    auto chunk = [&](const std::string& type, const std::string& data) {
        const std::string td = type + data;
        const uint32_t crc =
            uint32_t(crc32(0, reinterpret_cast<const Bytef*>(td.data()), uInt(td.size())));
        return be32(uint32_t(data.size())) + td + be32(crc);
    };
    std::string ihdr = be32(w) + be32(h) + std::string{8, 2, 0, 0, 0};
    return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", z) +
           chunk("IEND", "");
}

// A chat body with `n` copies of a PNG as data URLs.
std::string images_body(const std::string& png, int n) {
    json content = json::array({{{"type", "text"}, {"text", "what is it?"}}});
    const std::string url = "data:image/png;base64," + base64(png);
    for (int i = 0; i < n; ++i)
        content.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
    return json{{"messages", json::array({{{"role", "user"}, {"content", content}}})},
                {"max_tokens", 1},
                {"temperature", 0}}
        .dump();
}

std::vector<std::string> vision_server(const std::string& ctx, std::vector<std::string> more = {}) {
    std::vector<std::string> a = {"-m",           kData + "/glm5next/tiny.gguf",
                                  "--mmproj",     kData + "/glm5next/mmproj-tiny.gguf",
                                  "--port",       "0",
                                  "-t",           "1",
                                  "--ctx-size",   ctx,
                                  "--cache-type", "f32"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
}

// A folder of the test's own (mode 0700), removed with it.
struct Folder {
    Folder() {
        char t[] = "/tmp/glm5-hostile-XXXXXX";
        path = mkdtemp(t);
    }
    ~Folder() { fs::remove_all(path); }
    std::string path;
};

std::string slot_action(int port, const std::string& slot, const std::string& action,
                        const std::string& filename, HttpReply* reply = nullptr) {
    const HttpReply r = http_post(port, "/slots/" + slot + "?action=" + action,
                                  json{{"filename", filename}}.dump());
    if (reply) *reply = r;
    return std::to_string(r.status) + " " + error_code(r);
}

// The server's slot 0 holds a sequence to save.
void fill_slot(int port) {
    const HttpReply r = http_post(
        port, "/v1/completions",
        json{{"prompt", "In the beginning"}, {"max_tokens", 1}, {"temperature", 0}}.dump());
    ASSERT_EQ(r.status, 200) << r.raw;
}

}  // namespace

// ---- images ----------------------------------------------------------------------------------

// Four 2500 x 2500 images (a few KB each as PNGs, about 8,000 tokens each) past a 512-token
// context: refused from their headers, nothing decoded (each decoded to about 90 MB of pixels
// and canvas before the context was checked).
TEST(ServerHostile, ImagesPastTheContextAreRefusedBeforeDecoding) {
    ServerProcess s(vision_server("512"));
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string body = images_body(black_png(2500, 2500), 4);
    ASSERT_LT(body.size(), size_t(1) << 20);  // a small body: outside the body budget
    reset_peak(s.pid());
    const long base = vm_kib(s.pid(), "VmHWM:");
    const HttpReply r = http_post(s.port(), "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << r.raw.substr(0, 400);
    EXPECT_EQ(error_code(r), "context_length_exceeded") << r.body;
    EXPECT_LT(vm_kib(s.pid(), "VmHWM:") - base, 48 * 1024) << "the refusal decoded pixels";
}

TEST(ServerHostile, ARequestHoldsAtMostMaxImages) {
    ServerProcess s(vision_server("2048", {"--max-images", "3"}));
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string png = black_png(56, 56);
    const HttpReply many = http_post(s.port(), "/v1/chat/completions", images_body(png, 4));
    EXPECT_EQ(many.status, 400) << many.raw;
    EXPECT_EQ(error_code(many), "too_many_images");
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", images_body(png, 3)).status, 200);
}

// Decoded pixels are charged to the body budget (here 2 x 1 MiB). Each request holds a
// 1900 x 1900 image (about 60 MB of pixels, resized copy and canvas while it is decoded) and
// then a truncated one, whose decode fails: four such requests sent at once decode one at a
// time, so their peak is about one request's (each decoding at once, four times that).
TEST(ServerHostile, DecodedPixelsAreChargedToTheBodyBudget) {
    ServerProcess s(vision_server("16384", {"--max-body", "1M"}));
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string png = black_png(1900, 1900);
    json content = json::array({{{"type", "text"}, {"text", "what is it?"}}});
    for (const std::string& image : {png, png.substr(0, png.size() / 2)})
        content.push_back({{"type", "image_url"},
                           {"image_url", {{"url", "data:image/png;base64," + base64(image)}}}});
    const std::string body = json{
        {"messages", json::array({{{"role", "user"}, {"content", content}}})},
        {"max_tokens", 1}}.dump();
    auto post = [&] { return http_post(s.port(), "/v1/chat/completions", body); };
    // One alone: what a request's decodes cost.
    reset_peak(s.pid());
    long base = vm_kib(s.pid(), "VmHWM:");
    const HttpReply alone = post();
    EXPECT_EQ(error_code(alone), "invalid_image") << alone.raw.substr(0, 300);
    const long one = vm_kib(s.pid(), "VmHWM:") - base;
    EXPECT_GT(one, 32 * 1024);  // the decode's pixels were counted
    reset_peak(s.pid());
    base = vm_kib(s.pid(), "VmHWM:");
    std::vector<std::thread> clients;
    std::vector<std::string> codes(4);
    for (int i = 0; i < 4; ++i)
        clients.emplace_back([&, i] { codes[size_t(i)] = error_code(post()); });
    for (auto& t : clients) t.join();
    for (const std::string& c : codes) EXPECT_EQ(c, "invalid_image");
    const long four = vm_kib(s.pid(), "VmHWM:") - base;
    EXPECT_LT(four, one * 2) << "four at once took " << four / 1024 << " MiB, one " << one / 1024;
}

// ---- /tokenize -------------------------------------------------------------------------------

// 2 MiB of punctuation, a token a byte, with pieces: over 40 MB of reply, written as it is
// sent; the server holds the ids (each piece object was once built whole: about 270 times the
// body).
TEST(ServerHostile, TokenizeWithPiecesStreamsItsReply) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string text(size_t(2) << 20, '!');
    reset_peak(s.pid());
    const long base = vm_kib(s.pid(), "VmHWM:");
    const HttpReply r =
        http_post(s.port(), "/tokenize", json{{"content", text}, {"with_pieces", true}}.dump());
    ASSERT_EQ(r.status, 200) << r.raw.substr(0, 300);
    const long grew = vm_kib(s.pid(), "VmHWM:") - base;
    size_t ids = 0;
    for (size_t at = r.body.find("\"id\":"); at != std::string::npos;
         at = r.body.find("\"id\":", at + 5))
        ++ids;
    EXPECT_GT(ids, size_t(1) << 18);  // every token came back
    EXPECT_EQ(r.body.substr(0, 11), "{\"tokens\":[");
    EXPECT_EQ(r.body.substr(r.body.size() - 2), "]}");
    EXPECT_LT(grew, 96 * 1024) << "tokenize took " << grew / 1024 << " MiB";
}

// ---- slot files ------------------------------------------------------------------------------

// A link at the name the save wrote its temporary through (<name>.tmp) or at the name itself,
// and a file that is not a slot file, are left as they are; what is saved is 0600.
TEST(ServerHostile, SlotSavesFollowNoLinkAndReplaceOnlySlotFiles) {
    Folder dir, outside;
    const std::string target = outside.path + "/victim";
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path});
    ASSERT_GT(s.port(), 0) << s.log();
    fill_slot(s.port());
    fs::create_symlink(target, dir.path + "/x.bin.tmp");
    EXPECT_EQ(slot_action(s.port(), "0", "save", "x.bin"), "200 ?");
    EXPECT_FALSE(fs::exists(target)) << "the save wrote through the link";
    struct stat st;
    ASSERT_EQ(::stat((dir.path + "/x.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // Saved again over itself: fine.
    EXPECT_EQ(slot_action(s.port(), "0", "save", "x.bin"), "200 ?");
    // A link at the name, and a file of something else: refused, untouched.
    std::ofstream(target) << "precious";
    fs::create_symlink(target, dir.path + "/link.bin");
    HttpReply r;
    EXPECT_EQ(slot_action(s.port(), "0", "save", "link.bin", &r), "400 slot_action_failed");
    EXPECT_NE(error_message(r).find("not replaced"), std::string::npos) << r.body;
    std::ofstream(dir.path + "/notes.txt") << "my notes";
    EXPECT_EQ(slot_action(s.port(), "0", "save", "notes.txt", &r), "400 slot_action_failed");
    std::ifstream in(target), notes(dir.path + "/notes.txt");
    std::string a, b;
    std::getline(in, a);
    std::getline(notes, b);
    EXPECT_EQ(a, "precious");
    EXPECT_EQ(b, "my notes");
}

TEST(ServerHostile, ASlotFolderOthersMayWriteIsRefused) {
    Folder dir;
    ::chmod(dir.path.c_str(), 0777);
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path});
    EXPECT_EQ(s.wait_exit(std::chrono::seconds(30)), 2) << s.log();
    EXPECT_NE(s.log().find("may be written by others"), std::string::npos) << s.log();
}

// What restore is pointed at is checked from its metadata and header, never read whole on the
// engine's thread: a pipe (which blocked generation for good), a folder (a 500), a link, a
// large file that is not a slot file (read whole: twice its size in memory).
TEST(ServerHostile, RestoreReadsOnlyASlotFileThatFits) {
    Folder dir, outside;
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path});
    ASSERT_GT(s.port(), 0) << s.log();
    ASSERT_EQ(::mkfifo((dir.path + "/pipe.bin").c_str(), 0600), 0);
    fs::create_directory(dir.path + "/folder.bin");
    std::ofstream(outside.path + "/real") << "GLM5SLOT";
    fs::create_symlink(outside.path + "/real", dir.path + "/link.bin");
    {
        const int fd = ::open((dir.path + "/big.bin").c_str(), O_CREAT | O_WRONLY, 0600);
        ASSERT_EQ(::ftruncate(fd, off_t(1) << 30), 0);  // sparse: no disk taken
        ::close(fd);
    }
    // The pipe: an answer, within seconds (the connection is given 10 s).
    const int sock = connect_loopback(s.port());
    send_all(sock, http_request("POST", "/slots/0?action=restore",
                                json{{"filename", "pipe.bin"}}.dump()));
    const HttpReply piped = parse_reply(read_until_closed(sock, 10));
    ::close(sock);
    EXPECT_EQ(piped.status, 400) << "no answer for a pipe: " << piped.raw;
    EXPECT_NE(error_message(piped).find("not a regular file"), std::string::npos) << piped.body;
    HttpReply r;
    EXPECT_EQ(slot_action(s.port(), "0", "restore", "folder.bin", &r), "400 slot_action_failed");
    EXPECT_EQ(slot_action(s.port(), "0", "restore", "link.bin", &r), "400 slot_action_failed");
    EXPECT_NE(error_message(r).find("symbolic link"), std::string::npos) << r.body;
    reset_peak(s.pid());
    const long base = vm_kib(s.pid(), "VmHWM:");
    EXPECT_EQ(slot_action(s.port(), "0", "restore", "big.bin", &r), "400 slot_action_failed");
    EXPECT_NE(error_message(r).find("not a saved sequence"), std::string::npos) << r.body;
    EXPECT_LT(vm_kib(s.pid(), "VmHWM:") - base, 32 * 1024);
    // A forged header stating a state far larger than the file: refused without allocating it.
    {
        std::ofstream f(dir.path + "/forged.bin", std::ios::binary);
        f << "GLM5SLOT";
        const uint32_t v = 1, fp = 0;
        const uint64_t tokens = 0, state = uint64_t(1) << 40;
        f.write(reinterpret_cast<const char*>(&v), 4);
        f.write(reinterpret_cast<const char*>(&fp), 4);
        f.write(reinterpret_cast<const char*>(&tokens), 8);
        f.write(reinterpret_cast<const char*>(&state), 8);
    }
    EXPECT_EQ(slot_action(s.port(), "0", "restore", "forged.bin"), "400 slot_action_failed");
    EXPECT_EQ(http_get(s.port(), "/health").status, 200);
}

TEST(ServerHostile, SlotSavesKeepToTheFolderLimit) {
    Folder dir;
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path,
                     "--slot-save-max", "1K"});
    ASSERT_GT(s.port(), 0) << s.log();
    fill_slot(s.port());
    HttpReply r;
    EXPECT_EQ(slot_action(s.port(), "0", "save", "x.bin", &r), "400 slot_action_failed");
    EXPECT_NE(error_message(r).find("--slot-save-max"), std::string::npos) << r.body;
    EXPECT_FALSE(fs::exists(dir.path + "/x.bin"));
}

// A slot id past an int's range names no slot (atoi wrapped 4294967296 onto slot 0).
TEST(ServerHostile, SlotIdsThatOverflowNameNoSlot) {
    Folder dir;
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path});
    ASSERT_GT(s.port(), 0) << s.log();
    fill_slot(s.port());
    const HttpReply r = http_post(s.port(), "/slots/4294967296?action=erase", "{}");
    EXPECT_EQ(r.status, 400) << r.raw;
    EXPECT_EQ(error_code(r), "invalid_slot");
    EXPECT_EQ(slot_action(s.port(), "0", "save", "kept.bin"), "200 ?");  // slot 0 still holds it
}

// ---- the transport, keys, prompts ---------------------------------------------------------------

// A POST with neither Content-Length nor Transfer-Encoding has no body (RFC 9112): answered at
// once (llama.cpp's documented `curl -X POST .../slots/0?action=erase` waited for the read
// timeout, then got a 408).
TEST(ServerHostile, APostWithNoLengthHasNoBody) {
    Folder dir;
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path,
                     "--read-timeout", "60"});
    ASSERT_GT(s.port(), 0) << s.log();
    const int sock = connect_loopback(s.port());
    send_all(sock,
             "POST /slots/0?action=erase HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Connection: close\r\n\r\n");
    const HttpReply r = parse_reply(read_until_closed(sock, 10));
    ::close(sock);
    EXPECT_EQ(r.status, 200) << "no answer within 10 s: " << r.raw;
    EXPECT_EQ(json::parse(r.body, nullptr, false).value("n_erased", -1), 0) << r.body;
}

TEST(ServerHostile, MetricsNeedTheKeyAndKeysAreComparedAsSent) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--api-key", "k%41y"});
    ASSERT_GT(s.port(), 0) << s.log();
    EXPECT_EQ(http_get(s.port(), "/metrics").status, 401);
    EXPECT_EQ(http_get(s.port(), "/metrics", "Authorization: Bearer k%41y\r\n").status, 200);
    EXPECT_EQ(http_get(s.port(), "/health").status, 200);
    // Not decoded: "%41" is not "A", and "Bearer%20" is not "Bearer ".
    EXPECT_EQ(http_get(s.port(), "/v1/models", "Authorization: Bearer kAy\r\n").status, 401);
    EXPECT_EQ(http_get(s.port(), "/v1/models", "x-api-key: k%41y\r\n").status, 200);
    ServerProcess t({"-m", kModel, "--port", "0", "-t", "1", "--api-key", "sekrit"});
    ASSERT_GT(t.port(), 0) << t.log();
    EXPECT_EQ(http_get(t.port(), "/v1/models", "Authorization: Bearer%20sekrit\r\n").status, 401);
}

// 200,000 one-character prompts: refused for their number before any is encoded.
TEST(ServerHostile, CompletionPromptsAreCountedBeforeTheyAreEncoded) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    const json prompts = json(std::vector<std::string>(200000, "a"));
    const HttpReply r =
        http_post(s.port(), "/v1/completions", json{{"prompt", prompts}, {"max_tokens", 1}}.dump());
    EXPECT_EQ(r.status, 400) << r.raw.substr(0, 300);
    EXPECT_NE(error_message(r).find("(200000)"), std::string::npos) << r.body;
}

// Four refused 20 MB bodies, one after another, leave the server's resident memory within a
// fifth of what it was (glibc's rising mmap threshold kept 16 MiB in a thread's arena, over a
// whole base of 13 MiB here).
TEST(ServerHostile, RefusedLargeBodiesLeaveNoMemoryBehind) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "4096"});
    ASSERT_GT(s.port(), 0) << s.log();
    ASSERT_EQ(http_post(s.port(), "/v1/chat/completions",
                        R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2})")
                  .status,
              200);
    const long base = vm_kib(s.pid(), "VmRSS:");
    std::string text;
    while (text.size() < (size_t(20) << 20)) text += "In the beginning God created the heaven. ";
    const std::string body = json{
        {"messages", json::array({{{"role", "user"}, {"content", text}}})},
        {"max_tokens", 2}}.dump();
    for (int i = 0; i < 4; ++i)
        EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", body).status, 400);
    long now = 0;
    for (int i = 0; i < 100 && (now = vm_kib(s.pid(), "VmRSS:")) - base > base / 5; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(now - base, base / 5) << "kept " << (now - base) << " KiB over " << base;
}

// ---- where requests come from
// --------------------------------------------------------------------

TEST(ServerHostile, ForeignOriginsAndHostsAreRefused) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string own = "http://127.0.0.1:" + std::to_string(s.port());
    // A page elsewhere, posting text/plain (no preflight): refused.
    HttpReply r = http_raw(s.port(), "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:" +
                                         std::to_string(s.port()) +
                                         "\r\nOrigin: http://evil.example\r\nContent-Type: "
                                         "text/plain\r\nContent-Length: 2\r\nConnection: "
                                         "close\r\n\r\n{}");
    EXPECT_EQ(r.status, 403) << r.raw;
    EXPECT_EQ(error_code(r), "origin_not_allowed");
    // The server's own page (a browser names its host and port), and clients that send no
    // Origin: served.
    r = http_raw(s.port(), "GET /props HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(s.port()) +
                               "\r\nOrigin: " + own + "\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(r.status, 200) << r.raw;
    EXPECT_NE(r.headers.find("Access-Control-Allow-Origin: " + own), std::string::npos);
    EXPECT_EQ(http_get(s.port(), "/props").status, 200);
    // A rebound DNS name reaching a loopback server: refused.
    r = http_raw(s.port(),
                 "GET /props HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(r.status, 403) << r.raw;
    EXPECT_EQ(error_code(r), "host_not_allowed");

    ServerProcess t({"-m", kModel, "--port", "0", "-t", "1", "--cors-origins",
                     "https://app.example", "--allowed-hosts", "llm.example"});
    ASSERT_GT(t.port(), 0) << t.log();
    EXPECT_EQ(http_get(t.port(), "/props", "Origin: https://app.example\r\n").status, 200);
    EXPECT_EQ(http_get(t.port(), "/props", "Origin: http://evil.example\r\n").status, 403);
    EXPECT_EQ(
        http_raw(t.port(), "GET /props HTTP/1.1\r\nHost: llm.example\r\nConnection: close\r\n\r\n")
            .status,
        200);
}

// Names that would forge or reorder a log line (U+0085, U+202E) are refused as file names and
// escaped where they are echoed.
TEST(ServerHostile, NamesThatWouldForgeALogLineAreRefused) {
    Folder dir;
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path});
    ASSERT_GT(s.port(), 0) << s.log();
    fill_slot(s.port());
    for (const char* name : {"a\u0085b.bin", "evil\u202Eexe.bin"}) {
        HttpReply r;
        EXPECT_EQ(slot_action(s.port(), "0", "save", name, &r), "400 invalid_value") << name;
        EXPECT_EQ(r.body.find(name), std::string::npos) << r.body;
        EXPECT_NE(error_message(r).find("\\u"), std::string::npos) << r.body;
    }
}

// ---- what held --------------------------------------------------------------------------------

TEST(ServerHostile, WhatHeldStillHolds) {
    Folder dir;
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--slot-save-path", dir.path});
    ASSERT_GT(s.port(), 0) << s.log();
    fill_slot(s.port());
    // Names that leave the folder.
    for (const char* name : {"../escape.bin", "/etc/passwd", "a/b.bin", ".hidden", "x\\y"})
        EXPECT_EQ(slot_action(s.port(), "0", "save", name), "400 invalid_value") << name;
    EXPECT_FALSE(fs::exists(fs::path(dir.path).parent_path() / "escape.bin"));
    // A body framed two ways (Content-Length and chunked): refused from the head, never
    // read as two requests.
    const HttpReply r =
        http_raw(s.port(),
                 "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                 "5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /props "
                 "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    EXPECT_EQ(r.status, 400) << r.raw;
    EXPECT_EQ(r.raw.find("HTTP/1.1 200"), std::string::npos) << r.raw;
}
