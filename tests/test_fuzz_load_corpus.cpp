// Replays the load-path fuzz corpus (fuzz/corpus/load) through the fuzz
// target's own code: every input loads or is refused with glm5::Error, never
// anything else. The seeds (fixture headers) must load; past crashes must be refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../fuzz/load_one.h"

namespace fs = std::filesystem;

namespace {

TEST(FuzzLoadCorpus, EveryInputLoadsOrIsRefused) {
    const fs::path dir = fs::path(GLM5_SOURCE_DIR) / "fuzz" / "corpus" / "load";
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    size_t loaded = 0, refused = 0, seeds = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        std::ifstream f(e.path(), std::ios::binary);
        const std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const int r = glm5::fuzz::load_one(reinterpret_cast<const uint8_t*>(b.data()), b.size());
        (r == 0 ? loaded : refused)++;
        if (e.path().filename().string().rfind("seed-", 0) == 0) {
            ++seeds;
            EXPECT_EQ(r, 0) << e.path() << ": a fixture header must load";
        }
        if (e.path().filename().string().rfind("crash-", 0) == 0) {
            EXPECT_EQ(r, 1) << e.path() << ": a past crash must be refused";
        }
    }
    EXPECT_GE(seeds, 5u);  // both architectures and the mmproj
    std::printf("load corpus: %zu loaded, %zu refused\n", loaded, refused);
}

}  // namespace
