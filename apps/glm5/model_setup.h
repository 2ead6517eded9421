// Opening a model for a subcommand: the shared flags (--model, --threads,
// --cache-type, --spec), the load banner on stderr, and the objects a run needs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"
#include "runtime/placement.h"

namespace glm5::app {

struct LoadedModel {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> backend;
    // With --device: the CPU backend that computes the routed experts kept in system
    // RAM (`backend` is then the device's).
    std::unique_ptr<backend::Backend> experts_backend;
    std::unique_ptr<model::Model> model;
    int threads = 0;  // the CPU backend's threads (--threads)
    // Speculative decoding as the flags ask (type Off without --spec; auto
    // resolved to what the model supports).
    runtime::SpecParams spec;
};

// "speculative: mtp drafts, accepted A/D (x%), V verifies, T tokens per verify"
std::string spec_summary(const runtime::RequestResult& r, runtime::DraftType type);

// Declares --model, --threads, --cache-type, --spec and its settings on `a`.
void add_model_flags(Args& a, bool model_required);

// --cache-type as a cache type (a UsageError for anything but f16 / f32).
backend::CacheType cache_type_from(const Args& a);

// Opens the model named by the flags (or `path` when given), printing the
// load banner to stderr.
LoadedModel open_model(const Args& a, const std::string& path = "");

// Touches the pages of the tensors `held` names (all with a default
// HeldLayers) once, with a progress bar on a terminal.
void load_weight_pages(const gguf::File& f, const model::HeldLayers& held);

// "512", "64K", "512M", "2G" (powers of 1024) -> bytes; UsageError naming --flag.
size_t parse_size(const std::string& s, const std::string& flag);

// Declares --ctx-size (per `what`, e.g. "per slot"), --ubatch and --mem-reserve.
void add_context_flags(Args& a, const std::string& what);

using runtime::ContextChoice;
using runtime::ContextRequest;

// The context per slot: --ctx-size / $MAX_CONTEXT when named (refused with
// the numbers and working remedies when it does not fit: ResourceError, exit
// code 2), else the largest that fits up to the GGUF's context_length. Says
// what it picked and why on stderr, in a line beginning "glm5: context N tokens".
ContextChoice plan_context(const Args& a, const model::Model& m, ContextRequest r);

// Refuses a malformed --ctx-size / $MAX_CONTEXT before anything is loaded.
void requested_context_check(const Args& a);
// The one-slot request of run and chat.
ContextRequest cli_context_request(int64_t ubatch, const runtime::SpecParams& spec);

// "1,2,3" -> ids; refuses anything else with a UsageError.
std::vector<int32_t> parse_token_list(const std::string& s, const std::string& flag);

// What identifies a model's weights and the cache type its states are in (the files
// of glm5 serve --slot-save-path carry it): the architecture, every tensor's name,
// type, shape and place, and a sample of each tensor's bytes, hashed.
std::string model_fingerprint(const gguf::File& f, const std::string& cache_type);

}  // namespace glm5::app
