// GLM5_CPU forces the kernel level: each name means the highest level allowed,
// nothing above it is dispatched, and what cannot be honoured is refused with a
// message (exit code 2 in the CLI). ctest runs this binary at every level the
// host has (tests/cmake/cpu_levels.cmake).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "quant/ops.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "util_cli.h"

using namespace glm5;
using namespace glm5::quant;

namespace {

TEST(CpuLevel, NamesMapToLevelsAndRefuseWhatCannotBeHonoured) {
    EXPECT_EQ(cpu_level_for(nullptr, CpuLevel::Vnni), CpuLevel::Vnni);
    EXPECT_EQ(cpu_level_for("", CpuLevel::Avx2), CpuLevel::Avx2);
    EXPECT_EQ(cpu_level_for("scalar", CpuLevel::Avx2), CpuLevel::Scalar);
    EXPECT_EQ(cpu_level_for("avx2", CpuLevel::Vnni), CpuLevel::Avx2);
    EXPECT_EQ(cpu_level_for("avx512", CpuLevel::Vnni), CpuLevel::Avx512);
    EXPECT_EQ(cpu_level_for("vnni", CpuLevel::Vnni), CpuLevel::Vnni);
    EXPECT_EQ(cpu_level_for("vnni", CpuLevel::Amx), CpuLevel::Vnni);
    EXPECT_EQ(cpu_level_for("amx", CpuLevel::Amx), CpuLevel::Amx);
    auto refused = [](const char* name, CpuLevel detected, const std::string& says) {
        try {
            cpu_level_for(name, detected);
            ADD_FAILURE() << name << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
    };
    refused("vnni", CpuLevel::Avx2, "does not have it (it has avx2)");
    refused("avx512", CpuLevel::Avx2, "does not have it");
    refused("avx2", CpuLevel::Scalar, "does not have it (it has scalar)");
    refused("amx", CpuLevel::Vnni, "does not have it (it has vnni)");
    refused("AVX2", CpuLevel::Vnni, "unknown kernel level");
    refused("sse4", CpuLevel::Vnni, "unknown kernel level");
}

// The level in force (GLM5_CPU, or the CPU's) decides every dispatch.
TEST(CpuLevel, TheLevelInForceDispatchesNothingAboveIt) {
    const char* env = std::getenv("GLM5_CPU");
    const CpuLevel want =
        env && *env ? cpu_level_for(env, cpu_detected_level()) : cpu_detected_level();
    ASSERT_EQ(cpu_level(), want);
    EXPECT_EQ(cpu_has_avx2(), want >= CpuLevel::Avx2);
    EXPECT_EQ(cpu_has_avx512(), want >= CpuLevel::Vnni);
    EXPECT_EQ(cpu_has_amx(), want >= CpuLevel::Amx);
    // Each format's dot: the scalar reference below AVX2, the AVX2 kernel up to
    // the VNNI level, the AVX-512 one from there.
    for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::IQ2_XXS}) {
        const FormatOps* o = kquant_ops(t);
        if (!o) o = legacy_ops(t);
        if (!o) o = iquant_ops(t);
        ASSERT_TRUE(o) << name(t);
        ASSERT_TRUE(o->vec_dot_avx2 && o->vec_dot_avx512) << name(t);
        const VecDotFn expect = want >= CpuLevel::Vnni   ? o->vec_dot_avx512
                                : want >= CpuLevel::Avx2 ? o->vec_dot_avx2
                                                         : o->vec_dot_ref;
        EXPECT_EQ(vec_dot_fn(t), expect) << name(t);
        const VecDotMultiFn multi = want >= CpuLevel::Vnni   ? o->vec_dot_multi_avx512
                                    : want >= CpuLevel::Avx2 ? o->vec_dot_multi_avx2
                                                             : nullptr;
        EXPECT_EQ(vec_dot_multi_fn(t), multi) << name(t);
    }
    // The repacked GEMM is an AVX-512 VNNI kernel, many tokens of it AMX ones.
    EXPECT_EQ(repack_rows(Type::Q4_K) != 0, want >= CpuLevel::Vnni);
    EXPECT_EQ(amx_gemm(Type::Q4_K, 256), want >= CpuLevel::Amx);
}

TEST(CpuLevel, TheCliRefusesWhatCannotBeHonouredWithExitCode2) {
    for (const std::string bad : {"sse4", "AMX"}) {
        const auto t = glm5::test::run_glm5("tokenize --help", "", "GLM5_CPU=" + bad);
        EXPECT_EQ(t.code, 2) << bad << ": " << t.err;
        EXPECT_NE(t.err.find("GLM5_CPU=" + bad), std::string::npos) << t.err;
    }
    for (CpuLevel l : {CpuLevel::Vnni, CpuLevel::Amx}) {
        if (cpu_detected_level() >= l) continue;
        const auto t = glm5::test::run_glm5("tokenize --help", "",
                                            std::string("GLM5_CPU=") + cpu_level_name(l));
        EXPECT_EQ(t.code, 2) << t.err;
        EXPECT_NE(t.err.find("does not have it"), std::string::npos) << t.err;
    }
    const auto ok = glm5::test::run_glm5("tokenize --help", "", "GLM5_CPU=scalar");
    EXPECT_EQ(ok.code, 0) << ok.err;
}

}  // namespace
