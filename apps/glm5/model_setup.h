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
#include "runtime/engine.h"

namespace glm5::app {

struct LoadedModel {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> backend;
    std::unique_ptr<model::Model> model;
    // Speculative decoding as the flags ask (type Off without --spec; auto
    // resolved to what the model supports).
    runtime::SpecParams spec;
};

// "speculative: mtp drafts, accepted A/D (x%), V verifies, T tokens per verify"
std::string spec_summary(const runtime::RequestResult& r, runtime::DraftType type);

// Declares --model, --threads, --cache-type, --spec and its settings on `a`.
void add_model_flags(Args& a, bool model_required);

// Opens the model named by the flags (or `path` when given), printing the
// load banner to stderr.
LoadedModel open_model(const Args& a, const std::string& path = "");

// "1,2,3" -> ids; refuses anything else with a UsageError.
std::vector<int32_t> parse_token_list(const std::string& s, const std::string& flag);

}  // namespace glm5::app
