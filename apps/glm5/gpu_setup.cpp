#include "gpu_setup.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "args.h"
#include "core/error.h"
#include "core/format.h"
#ifdef GLM5_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#endif

namespace glm5::app {

namespace {

// Why no GPU is usable, or "" with `found` describing the device.
std::string gpu_unusable(int ordinal, std::string* found) {
#ifdef GLM5_HAVE_CUDA
    std::string why;
    const std::vector<backend::cuda::DeviceInfo> all = backend::cuda::list_devices(&why);
    if (all.empty()) return "no usable CUDA device: " + why;
    if (ordinal >= int(all.size()))
        return "CUDA device " + std::to_string(ordinal) + " does not exist (" +
               std::to_string(all.size()) +
               " visible: cuda:0 .. cuda:" + std::to_string(all.size() - 1) + ")";
    const backend::cuda::DeviceInfo& d = all[size_t(ordinal)];
    *found = "GPU " + std::to_string(d.ordinal) + " (" + d.name + ", sm_" +
             std::to_string(d.cc_major) + std::to_string(d.cc_minor) + ", " +
             human_bytes(double(backend::cuda::device_free_bytes(ordinal))) + " free of " +
             human_bytes(double(d.total_bytes)) + ")";
    if (backend::cuda::simulated())
        *found +=
            ", simulated: this build runs the GPU's kernels on the CPU, for checking, not "
            "for speed";
    return "";
#else
    (void)ordinal;
    (void)found;
    return "this build has no CUDA backend (nvcc was not found when it was configured: build "
           "with -DGLM5_CUDA=ON where the CUDA toolkit is installed)";
#endif
}

}  // namespace

std::optional<int> cuda_ordinal(const std::string& device) {
    if (device == "cuda") return 0;
    if (device.rfind("cuda:", 0) != 0) return std::nullopt;
    const std::string n = device.substr(5);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos)
        throw UsageError("--device " + device + ": the GPU is cuda or cuda:N (N = 0, 1, ...)");
    return std::stoi(n);
}

void require_gpu(int ordinal) {
    std::string found;
    const std::string why = gpu_unusable(ordinal, &found);
    if (!why.empty())
        throw ResourceError("--device cuda:" + std::to_string(ordinal) + ": " + why +
                            "; --device none runs the model on the CPU");
    std::fprintf(stderr, "glm5: %s\n", found.c_str());
}

uint64_t gpu_free_bytes(int ordinal) {
#ifdef GLM5_HAVE_CUDA
    std::string why;
    const auto all = backend::cuda::list_devices(&why);
    if (ordinal < int(all.size())) return backend::cuda::device_free_bytes(ordinal);
#endif
    require_gpu(ordinal);  // throws the reason
    return 0;
}

bool gpu_forward_enabled() {
    const char* v = std::getenv("GLM5_CUDA_FORWARD");
    return v && std::string(v) == "1";
}

std::unique_ptr<backend::Backend> open_gpu(int ordinal) {
#ifdef GLM5_HAVE_CUDA
    if (!gpu_forward_enabled())
        throw Error("--device cuda:" + std::to_string(ordinal) +
                    ": the CUDA forward is written but has not yet been checked on a GPU "
                    "(scripts/device-check.sh); set GLM5_CUDA_FORWARD=1 to run it all the same, "
                    "or --device none to run on the CPU");
    return backend::cuda::make_cuda_backend(ordinal);
#else
    require_gpu(ordinal);  // throws: no backend in this build
    return nullptr;
#endif
}

void check_gpu_architecture(const std::string& arch) {
    if (arch != "glm-dsa" && arch != "glm5next")
        throw Error(arch + " has no CUDA forward: --device none runs it on the CPU");
}

bool apply_gpu_layers(const std::string& value, int64_t n_layer) {
    int64_t n = 0;
    if (value == "all" || value == "auto") {
        n = -1;
    } else {
        try {
            size_t used = 0;
            n = std::stoll(value, &used);
            if (used != value.size()) throw std::invalid_argument(value);
        } catch (const std::exception&) {
            throw UsageError("-ngl " + value + ": a layer count, -1 or all");
        }
    }
    if (n == 0) return false;
    if (n < -1) throw UsageError("-ngl " + value + ": a layer count, -1 or all");
    if (n != -1 && n < n_layer)
        throw UsageError("-ngl " + value + " of the model's " + std::to_string(n_layer) +
                         " layers: a partial offload here keeps routed experts in system RAM, "
                         "not whole layers: give the whole model to the GPU (-ngl -1) with "
                         "--n-cpu-moe N to keep the experts of the first N blocks in RAM");
    std::string found;
    const std::string why = gpu_unusable(0, &found);
    if (!why.empty()) {
        std::fprintf(stderr, "glm5: -ngl %s: %s: the CPU runs the model\n", value.c_str(),
                     why.c_str());
        return false;
    }
    if (!gpu_forward_enabled()) {
        std::fprintf(stderr,
                     "glm5: -ngl %s: %s found, but the CUDA forward has not yet been "
                     "checked on a GPU (GLM5_CUDA_FORWARD=1 runs it): the CPU runs the model\n",
                     value.c_str(), found.c_str());
        return false;
    }
    std::fprintf(stderr, "glm5: -ngl %s: the whole model on %s\n", value.c_str(), found.c_str());
    return true;
}

}  // namespace glm5::app
