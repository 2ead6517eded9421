// The GPU's command line: --device cuda[:N] and llama.cpp's -ngl, on the suite's machines
// (no GPU: refusals and warnings; the simulation build's simulator is told to show none,
// GLM5_SIM_DEVICES=0); on a machine with a GPU the same commands run there, which these
// tests assert instead (no test here is skipped). test_cuda_cli runs the model on a GPU.
#include <gtest/gtest.h>

#include <filesystem>

#include "util_cli.h"
#include "util_model.h"

using namespace glm5::test;

namespace {

const std::string kTiny = data_path("glm-dsa/tiny.gguf");
// A simulation build's simulator then has no device (a build with CUDA or without ignores it).
const std::string kNoSimulatedGpu = "GLM5_SIM_DEVICES=0";

// The NVIDIA driver's control node: without it no process here can reach a GPU.
bool driver_present() {
    return std::filesystem::exists("/dev/nvidiactl");
}

TEST(CliGpu, DeviceCudaWithoutAUsableGpuExitsTwoWithTheReason) {
    for (const char* dev : {"cuda", "cuda:1"}) {
        const CliResult r = run_glm5("run --model " + kTiny + " --tokens 1,2 -n 2 --device " + dev,
                                     "", kNoSimulatedGpu);
        EXPECT_TRUE(r.out.empty()) << r.out;
        if (!driver_present()) {
            EXPECT_EQ(r.code, 2) << r.err;
            // The reason (this build, the driver) and the remedy.
            EXPECT_TRUE(r.err.find("no CUDA backend") != std::string::npos ||
                        r.err.find("no usable CUDA device") != std::string::npos)
                << r.err;
            EXPECT_NE(r.err.find("--device none runs the model on the CPU"), std::string::npos)
                << r.err;
        } else if (r.code != 0) {
            // A GPU machine without that GPU (cuda:1 on one GPU), or without
            // GLM5_CUDA_FORWARD=1: the reason and the remedy.
            EXPECT_NE(r.err.find("--device none"), std::string::npos) << r.err;
        } else {
            // A GPU machine: the model runs there, and says so.
            EXPECT_NE(r.err.find("on cuda:"), std::string::npos) << r.err;
        }
    }
}

TEST(CliGpu, MalformedDevicesAreUsageErrors) {
    for (const char* dev : {"cuda:x", "cuda:", "gpu", "cuda:-1"}) {
        const CliResult r = run_glm5("run --model " + kTiny + " --tokens 1 -n 1 --device " + dev);
        EXPECT_EQ(r.code, 2) << dev << "\n" << r.err;
        EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
    }
}

TEST(CliGpu, PartialLayerOffloadIsRefusedNamingNCpuMoe) {
    // The tiny model has 7 blocks in its block_count.
    const CliResult r = run_glm5("run --model " + kTiny + " --tokens 1,2 -n 2 -ngl 1");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("--n-cpu-moe"), std::string::npos) << r.err;
    EXPECT_NE(run_glm5("run --model " + kTiny + " --tokens 1 -n 1 -ngl -2").code, 0);
    EXPECT_NE(run_glm5("run --model " + kTiny + " --tokens 1 -n 1 -ngl lots").code, 0);
}

// -ngl 99 / -1 / all: the whole model asked for the GPU. Without a usable GPU: a
// warning, and the CPU's tokens, the same as without the flag.
TEST(CliGpu, WholeModelOffloadWithoutAGpuWarnsAndRunsOnTheCpu) {
    const std::string args = "run --model " + kTiny + " --tokens 1,2,3 -n 6 --temp 0";
    const CliResult plain = run_glm5(args, "", kNoSimulatedGpu);
    ASSERT_EQ(plain.code, 0) << plain.err;
    for (const char* n : {"99", "-1", "all", "--n-gpu-layers=7"}) {
        const std::string flag = n[0] == '-' && n[1] == '-' ? n : std::string("-ngl ") + n;
        const CliResult r = run_glm5(args + " " + flag, "", kNoSimulatedGpu);
        ASSERT_EQ(r.code, 0) << flag << "\n" << r.err;
        if (driver_present()) {
            // A GPU machine: the whole model on it, or why not.
            EXPECT_TRUE(r.err.find("the whole model on") != std::string::npos ||
                        r.err.find("the CPU runs the model") != std::string::npos)
                << r.err;
            continue;
        }
        EXPECT_EQ(r.out, plain.out) << flag;
        EXPECT_NE(r.err.find("the CPU runs the model"), std::string::npos) << flag << "\n" << r.err;
    }
    // 0, the default, says nothing.
    const CliResult zero = run_glm5(args + " -ngl 0", "", kNoSimulatedGpu);
    EXPECT_EQ(zero.out, plain.out);
    EXPECT_EQ(zero.err.find("-ngl"), std::string::npos) << zero.err;
}

}  // namespace
