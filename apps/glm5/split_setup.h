// A layer split across MPI ranks (--layer-split N under mpirun): opening the
// part of the model this rank holds, and the memory the plan must meet.
#pragma once

#include <string>

#include "args.h"
#include "backend/backend.h"
#include "backend/cpu.h"
#include "core/memory.h"
#include "model/model.h"

namespace glm5::app {

struct LoadedModel;

// Whether mpirun started this process, and with how many ranks.
bool dist_launch();
int launched_ranks();
int launched_rank();  // 0 when not under mpirun: only rank 0 talks to the user
// The context (tokens) a layer split is balanced for: --ctx-size, or 4096
// when the context is automatic.
int64_t split_context(const Args& a);

// Every rank: checks the launch (ranks = parts, the same file everywhere),
// cuts the layers, loads this rank's and agrees with the others on each step
// (a refusal on any rank is reported on every rank: exit code 2). Ranks other
// than 0 then serve rank 0 and exit; rank 0 gets a model that drives them.
// tp > 1: tensor parallelism instead (every rank holds every layer and a
// share of its heads).
LoadedModel open_split_model(const Args& a, const std::string& path, model::LoadOptions lo,
                             const backend::CpuOptions& bo, int parts, int tp);

// With a split model: the smallest available memory and the largest process
// size of any rank (the plan is made for the tightest rank).
void split_memory(const model::Model& m, MemoryAvailable& avail, uint64_t& process);

// With a split model: zeroes every rank's counters, and after a measured run
// of `tokens` tokens at `tps` tokens/s, the table of what each rank read and
// exchanged per token, and the throughput modelled over real links (bench).
// Nothing for a model in one process.
void split_reset_counters(model::Model& m);
bool is_split(const model::Model& m);
std::string split_rank_table(model::Model& m, double tokens, double tps);

}  // namespace glm5::app
