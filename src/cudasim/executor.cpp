// Kernels on the CPU: a block's CUDA threads are fibers that run in turn on this thread, each
// until it finishes or waits in a collective (device.h). The context switch is a few
// instructions of assembly (x86-64), so a product's warps can shuffle dozens of times per
// row; ThreadSanitizer and AddressSanitizer are told of every switch, so each CUDA thread is
// a thread of its own to the one and its stack is known to the other.
//
// This file is compiled without ThreadSanitizer's instrumentation (its bookkeeping is the
// fibers' shared state, touched one fiber at a time); it tells ThreadSanitizer which orders
// hold instead: a launch before its threads, a barrier between the threads that meet at it,
// __syncwarp between its lanes, every thread before the block's end. Shuffles and votes
// order no memory, as on a GPU.
#include "cudasim/executor.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(CUDASIM_TSAN)
#include <sanitizer/tsan_interface.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
// cudasim_switch(save, next): saves the callee-saved registers on this stack, stores the
// stack pointer at *save and resumes the context whose stack pointer is `next`. (The SSE and
// x87 control words are the thread's, which no kernel changes.) cudasim_entry starts a
// fiber: fn (r13) called with arg (r12).
extern "C" void cudasim_switch(void** save, void* next);
extern "C" void cudasim_entry();
asm(R"(
    .text
    .globl cudasim_switch
    .type cudasim_switch,@function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch,.-cudasim_switch
    .globl cudasim_entry
    .type cudasim_entry,@function
cudasim_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cudasim_entry,.-cudasim_entry
)");
#endif

namespace cudasim::detail {

thread_local const ThreadIds* tl_ids = nullptr;

namespace {

enum class State : uint8_t { Ready, Barrier, Warp, Done, Faulted };
enum Kind : int { kIdx, kUp, kDown, kXor, kBallot, kAny, kAll, kSyncwarp };

const char* kind_name(int k) {
    static const char* names[] = {"__shfl_sync",     "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync", "__ballot_sync",  "__any_sync",
                                  "__all_sync",      "__syncwarp"};
    return names[k];
}

std::string where(const Where& at) {
    const char* f = at.file_name();
    const char* slash = std::strrchr(f, '/');
    return std::string(slash ? slash + 1 : f) + ":" + std::to_string(at.line());
}

bool same_place(const Where& a, const Where& b) {
    return a.line() == b.line() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

// "3, 5-9, 12" for a sorted list.
std::string ranges(const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size();) {
        size_t j = i;
        while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
        if (!s.empty()) s += ", ";
        s += std::to_string(v[i]);
        if (j > i) s += "-" + std::to_string(v[j]);
        i = j + 1;
    }
    return s;
}

std::string hex(unsigned v) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", v);
    return b;
}

size_t stack_bytes() {
#if defined(CUDASIM_ASAN) || defined(CUDASIM_TSAN)
    return size_t(512) << 10;
#else
    return size_t(256) << 10;
#endif
}

void tsan_acquire(void* a) {
#if defined(CUDASIM_TSAN)
    __tsan_acquire(a);
#else
    (void)a;
#endif
}
void tsan_release(void* a) {
#if defined(CUDASIM_TSAN)
    __tsan_release(a);
#else
    (void)a;
#endif
}

struct Lane {
    ThreadIds ids{};
    State state = State::Ready;
    bool started = false;
    // The collective it waits in.
    int kind = 0;
    unsigned mask = 0;
    uint64_t bits = 0, result = 0;
    int arg = 0, width = 32;
    Where at;
    uint64_t gen = 0;
};

}  // namespace

struct Fiber {
    void* sp = nullptr;
    char* map = nullptr;
    size_t map_bytes = 0;
    char* lo = nullptr;
    size_t size = 0;
    void* tsan = nullptr;
    void* fake = nullptr;
    int slot = 0;
    Executor::Impl* ex = nullptr;
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
};

// ---- the watchdog ------------------------------------------------------------------------

double watchdog_seconds() {
    static const double s = [] {
        const char* v = std::getenv("GLM5_SIM_WATCHDOG");
        const double d = v ? std::atof(v) : 0.0;
        return d > 0 ? d : 300.0;
    }();
    return s;
}

namespace {
struct Watched {
    std::atomic<int64_t> since_ns{0};  // 0: no block running
    std::atomic<const char*> kernel{""};
    std::atomic<unsigned> bx{0}, by{0}, bz{0};
};
struct Watchdog {
    std::mutex m;
    std::vector<Watched*> all;
};
Watchdog& watchdog() {
    static Watchdog* w = [] {
        auto* d = new Watchdog;  // never destroyed: its thread outlives main
        std::thread([d] {
            for (;;) {
                std::this_thread::sleep_for(std::chrono::seconds(1));
                const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count();
                std::lock_guard<std::mutex> lock(d->m);
                for (Watched* x : d->all) {
                    const int64_t t = x->since_ns.load();
                    if (t != 0 && double(now - t) * 1e-9 > watchdog_seconds()) {
                        std::fprintf(stderr,
                                     "cudasim: kernel %s, block (%u,%u,%u), has run for more "
                                     "than %.0f s (GLM5_SIM_WATCHDOG): a thread that never "
                                     "finishes or waits; stopping\n",
                                     x->kernel.load(), x->bx.load(), x->by.load(), x->bz.load(),
                                     watchdog_seconds());
                        std::fflush(stderr);
                        std::abort();
                    }
                }
            }
        }).detach();
        return d;
    }();
    return *w;
}
int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

// ---- the executor -------------------------------------------------------------------------

struct Executor::Impl {
    std::function<std::string(const void*)> check_pointer;
    std::vector<std::unique_ptr<Fiber>> fibers;
    std::vector<Lane> lanes;
    int n = 0, cur = 0, exited = 0;
    // The lanes that may go on, in the order they will (a ring of n + 1 places): a lane
    // that waits hands over to the next one directly.
    std::vector<int> ready;
    size_t ready_head = 0, ready_tail = 0;
    void make_ready(int i) {
        lanes[size_t(i)].state = State::Ready;
        ready[ready_tail] = i;
        ready_tail = (ready_tail + 1) % ready.size();
    }
    int next_ready() {
        if (ready_head == ready_tail) return -1;
        const int i = ready[ready_head];
        ready_head = (ready_head + 1) % ready.size();
        return i;
    }
    // The scheduler's own context.
    void* sched_sp = nullptr;
    void* sched_tsan = nullptr;
    void* sched_fake = nullptr;
    const void* sched_lo = nullptr;
    size_t sched_size = 0;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    const Kernel* k = nullptr;
    uint3 block{};
    std::string fault;
    // The block's barrier.
    uint64_t bar_gen = 0;
    int bar_count = 0;
    Where bar_at;
    // Addresses ThreadSanitizer orders through.
    char launch_token = 0, done_token = 0, bar_token[2] = {0, 0};
    // Every fiber at each switch: what it did comes before what the scheduler does once it
    // has control back (reading a fault's message, abandoning the threads a fault stopped).
    // The scheduler never orders a fiber after itself mid-block, so fibers stay unordered.
    char back_token = 0;
    // A __syncwarp group's ordering address, one per group in turn (a lane acquires its
    // group's before 65536 later groups could have reused it).
    std::vector<char> sync_tokens = std::vector<char>(65536);
    uint32_t next_token = 0;
    // Each warp's lanes that have exited or wait at the barrier, and the collectives its
    // lanes are meeting in (lanes of disjoint masks may meet apart).
    struct Group {
        int kind;
        unsigned mask, arrived;
        uint32_t token;  // its __syncwarp's ordering address: sync_tokens[token]
        Where at;
    };
    struct Warp {
        unsigned exited = 0, at_barrier = 0;
        // At most one group per lane; fixed, so that no fiber allocates the simulator's
        // state (ThreadSanitizer would see another fiber free it).
        Group groups[32];
        int n_groups = 0;
    };
    std::vector<Warp> warps;
    // Shared memory: the launch's dynamic part first, then the static arrays in the order the
    // threads declare them, 32 watched bytes between any two.
    unsigned char* arena = nullptr;
    size_t arena_bytes = 0, dyn = 0, static_bytes = 0, cursor = 0, dirty = 0, max_dynamic = 0;
    std::vector<std::pair<const void*, size_t>> keys;
    Watched watched;

    // ---- fibers ----
    void make_fiber(int slot);
    void drop_fiber(int slot);
    void init_stack(Fiber& f);
    void resume(int i);
    void yield();
    // A fault: set_fault(why) in a statement of its own, then stop() (FAIL does both).
    void set_fault(const std::string& why);
    [[noreturn]] void stop();
    static void fiber_main(void* arg);
    void thread_main(Fiber& f);

    // ---- blocks ----
    std::string prefix() const;
    bool run_block();
    std::string deadlock() const;
    void reset_shared();

    // ---- from kernels ----
    void syncthreads(const Where& at);
    uint64_t collective(int kind, unsigned mask, uint64_t bits, int arg, int width,
                        const Where& at);
    struct Group;
    Group* arrive(int kind, unsigned mask, int width, const Where& at);
    [[noreturn]] void arrival_fault(int kind, unsigned mask, int width, const Where& at);
    [[noreturn]] void source_fault(int kind, unsigned mask, int p, int j, const Where& at);
    [[noreturn]] void barrier_fault(const Where& at);
    // Group k of warp wi has every lane it waits for: each gets its result, and all but
    // `running_lane` (the one completing it in its own call, or -1) may go on.
    void complete(int wi, int k, int running_lane);
    void* shared(const void* key, size_t bytes, size_t align);
};

#define FAIL(why)       \
    do {                \
        set_fault(why); \
        stop();         \
    } while (0)

namespace {
thread_local Executor::Impl* tl_exec = nullptr;

Executor::Impl& running(const char* what) {
    if (!tl_exec) {
        std::fprintf(stderr, "cudasim: %s called outside a kernel\n", what);
        std::abort();
    }
    return *tl_exec;
}
}  // namespace

void Executor::Impl::init_stack(Fiber& f) {
#if defined(__x86_64__)
    // What cudasim_switch pops: r15, r14, r13 = fiber_main, r12 = &f, rbx, rbp, then the
    // return address, cudasim_entry, which then runs with the stack 16-byte aligned (its
    // call pushes the return address a function expects).
    // Each fiber's stack starts at another offset within a page: stacks a page-multiple
    // apart would all use the same few cache sets, and a switch would miss on every frame.
    const uintptr_t color = uintptr_t(f.slot) * 448 % 4096;
    auto top = (reinterpret_cast<uintptr_t>(f.lo + f.size) - color) & ~uintptr_t(15);
    auto* s = reinterpret_cast<uint64_t*>(top - 72);
    std::memset(s, 0, 72);
    s[2] = reinterpret_cast<uint64_t>(&fiber_main);  // r13
    s[3] = reinterpret_cast<uint64_t>(&f);           // r12
    s[6] = reinterpret_cast<uint64_t>(&cudasim_entry);
    f.sp = s;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.lo;
    f.uc.uc_stack.ss_size = f.size;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, reinterpret_cast<void (*)()>(&fiber_main), 1, &f);
#endif
}

void Executor::Impl::make_fiber(int slot) {
    auto f = std::make_unique<Fiber>();
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    f->size = stack_bytes();
    f->map_bytes = f->size + page;
    void* m = mmap(nullptr, f->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        std::fprintf(stderr, "cudasim: no memory for a CUDA thread's stack\n");
        std::abort();
    }
    f->map = static_cast<char*>(m);
    mprotect(f->map, page, PROT_NONE);  // an overflow faults instead of corrupting
    f->lo = f->map + page;
    f->slot = slot;
    f->ex = this;
#if defined(CUDASIM_ASAN)
    __asan_unpoison_memory_region(f->lo, f->size);
#endif
#if defined(CUDASIM_TSAN)
    f->tsan = __tsan_create_fiber(0);
    const std::string name = "CUDA thread " + std::to_string(slot);
    __tsan_set_fiber_name(f->tsan, name.c_str());
#endif
    init_stack(*f);
    if (fibers.size() <= size_t(slot)) fibers.resize(size_t(slot) + 1);
    fibers[size_t(slot)] = std::move(f);
}

void Executor::Impl::drop_fiber(int slot) {
    std::unique_ptr<Fiber>& f = fibers[size_t(slot)];
    if (!f) return;
#if defined(CUDASIM_TSAN)
    __tsan_destroy_fiber(f->tsan);
#endif
#if defined(CUDASIM_ASAN)
    // The kernels' stack frames leave their redzones poisoned: memory mapped here later
    // (a model file) must not inherit them.
    __asan_unpoison_memory_region(f->lo, f->size);
#endif
    munmap(f->map, f->map_bytes);
    f.reset();
}

void Executor::Impl::resume(int i) {
    cur = i;
    tl_ids = &lanes[size_t(i)].ids;
    Fiber& f = *fibers[size_t(i)];
#if defined(CUDASIM_TSAN)
    __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(CUDASIM_ASAN)
    __sanitizer_start_switch_fiber(&sched_fake, f.lo, f.size);
#endif
#if defined(__x86_64__)
    cudasim_switch(&sched_sp, f.sp);
#else
    swapcontext(&sched_uc, &f.uc);
#endif
#if defined(CUDASIM_ASAN)
    __sanitizer_finish_switch_fiber(sched_fake, nullptr, nullptr);
#endif
    tsan_acquire(&back_token);
}

void Executor::Impl::yield() {
    Fiber& from = *fibers[size_t(cur)];
    // The next lane that may go on, directly; the scheduler when none may (or on a fault).
    const int next = fault.empty() ? next_ready() : -1;
    Fiber* to = next >= 0 ? fibers[size_t(next)].get() : nullptr;
    if (to) {
        cur = next;
        tl_ids = &lanes[size_t(next)].ids;
    }
    tsan_release(&back_token);
#if defined(CUDASIM_TSAN)
    __tsan_switch_to_fiber(to ? to->tsan : sched_tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(CUDASIM_ASAN)
    __sanitizer_start_switch_fiber(&from.fake, to ? to->lo : sched_lo, to ? to->size : sched_size);
#endif
#if defined(__x86_64__)
    cudasim_switch(&from.sp, to ? to->sp : sched_sp);
#else
    swapcontext(&from.uc, to ? &to->uc : &sched_uc);
#endif
#if defined(CUDASIM_ASAN)
    __sanitizer_finish_switch_fiber(from.fake, nullptr, nullptr);
#endif
}

void Executor::Impl::fiber_main(void* arg) {
    Fiber* f = static_cast<Fiber*>(arg);
    Impl* ex = f->ex;
#if defined(CUDASIM_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    for (;;) ex->thread_main(*f);
}

void Executor::Impl::thread_main(Fiber& f) {
    Lane& l = lanes[size_t(f.slot)];
    l.started = true;
    tsan_acquire(&launch_token);
    k->body();
    tsan_release(&done_token);
    l.state = State::Done;
    ++exited;
    const int me = f.slot, base = me / 32 * 32;
    Warp& w = warps[size_t(me / 32)];
    w.exited |= 1u << (me - base);
    if (bar_count > 0 && fault.empty())
        fault = prefix() + "thread " + std::to_string(me) + " exited while " +
                std::to_string(bar_count) + " threads wait at __syncthreads (" + where(bar_at) +
                "), which it never reaches";
    // A collective waits for the mask's lanes that have not exited (CUDA's rule): one that
    // waited only for this lane completes now.
    for (int k = 0; k < w.n_groups && fault.empty();)
        if (w.groups[k].arrived == (w.groups[k].mask & ~w.exited))
            complete(me / 32, k, -1);
        else
            ++k;
    yield();
}

void Executor::Impl::set_fault(const std::string& why) {
    if (fault.empty()) fault = prefix() + why;
}

[[noreturn]] void Executor::Impl::stop() {
    // (Nothing owned may live in the frames below: they are abandoned, not unwound. The
    // message was made by set_fault in a statement of its own.)
    lanes[size_t(cur)].state = State::Faulted;
    yield();
    std::abort();  // a faulted thread is never resumed
}

std::string Executor::Impl::prefix() const {
    const dim3& g = k->grid;
    const dim3& b = k->block;
    return "kernel " + std::string(k->name) + ", block (" + std::to_string(block.x) + "," +
           std::to_string(block.y) + "," + std::to_string(block.z) + ") of (" +
           std::to_string(g.x) + "," + std::to_string(g.y) + "," + std::to_string(g.z) + "), " +
           std::to_string(b.x * b.y * b.z) + " threads a block: ";
}

void Executor::Impl::reset_shared() {
    if (!arena) {
        arena_bytes = kSharedOptin + (size_t(64) << 10);
        arena = static_cast<unsigned char*>(std::aligned_alloc(64, arena_bytes));
        dirty = arena_bytes;
    }
    // Shared memory holds what the last block left: NaN here, so a read before a write shows.
#if defined(CUDASIM_ASAN)
    __asan_unpoison_memory_region(arena, dirty);
#endif
    std::memset(arena, 0xff, dirty);
#if defined(CUDASIM_ASAN)
    __asan_poison_memory_region(arena, arena_bytes);
    if (dyn) __asan_unpoison_memory_region(arena, dyn);
#endif
    static_bytes = 0;
    cursor = (dyn + 15) / 16 * 16 + 32;
    dirty = cursor;
    keys.clear();
}

void* Executor::Impl::shared(const void* key, size_t bytes, size_t align) {
    for (const auto& [kk, off] : keys)
        if (kk == key) return arena + off;
    align = std::max<size_t>(align, 16);
    const size_t off = (cursor + align - 1) / align * align;
    static_bytes += bytes;
    const size_t allowed =
        max_dynamic ? std::min(kSharedOptin, static_bytes + max_dynamic) : kSharedDefault;
    if (static_bytes > kSharedDefault)
        FAIL(std::to_string(static_bytes) +
             " bytes of static shared memory: over the 48 KiB a kernel may declare");
    if (static_bytes + dyn > allowed)
        FAIL(std::to_string(static_bytes) + " bytes of static and " + std::to_string(dyn) +
             " of dynamic shared memory: over the " + std::to_string(allowed) +
             " bytes a launch of this kernel gets" +
             (max_dynamic ? "" : " (cudaFuncSetAttribute opts in to up to 227 KiB)"));
    if (off + bytes + 32 > arena_bytes) FAIL("more shared memory arrays than the simulator holds");
#if defined(CUDASIM_ASAN)
    __asan_unpoison_memory_region(arena + off, bytes);
#endif
    cursor = off + bytes + 32;
    dirty = std::max(dirty, cursor);
    keys.emplace_back(key, off);
    return arena + off;
}

bool Executor::Impl::run_block() {
    const dim3& bd = k->block;
    for (int i = 0; i < n; ++i) {
        Lane& l = lanes[size_t(i)];
        l = Lane{};
        l.ids.thread = {unsigned(i) % bd.x, unsigned(i) / bd.x % bd.y, unsigned(i) / (bd.x * bd.y)};
        l.ids.block = block;
        l.ids.block_dim = bd;
        l.ids.grid_dim = k->grid;
    }
    bar_gen = 0;
    bar_count = 0;
    exited = 0;
    warps.assign(size_t((n + 31) / 32), Warp{});
    // The lanes a block's last warp does not have count as exited ones.
    if (n % 32) warps.back().exited = ~((1u << (n % 32)) - 1);
    reset_shared();
    watched.bx = block.x;
    watched.by = block.y;
    watched.bz = block.z;
    watched.since_ns = now_ns();
    tsan_release(&launch_token);
    ready.assign(size_t(n) + 1, 0);
    ready_head = ready_tail = 0;
    // Lanes start in thread order in one block and in the reverse order in the next, so that
    // a missing barrier between a writer and a reader shows in the results whichever of the
    // two comes first (ThreadSanitizer reports it either way).
    const bool reverse = (block.x + block.y + block.z) & 1;
    for (int i = 0; i < n; ++i) make_ready(reverse ? n - 1 - i : i);
    // Each resumed lane hands over to the next ready one itself: control is back here when
    // none is ready, or on a fault.
    for (int i = next_ready(); i >= 0; i = next_ready()) {
        resume(i);
        if (!fault.empty()) return false;
    }
    if (exited != n) {
        fault = prefix() + deadlock();
        return false;
    }
    tsan_acquire(&done_token);
    watched.since_ns = 0;
    return true;
}

std::string Executor::Impl::deadlock() const {
    std::vector<int> at_bar, gone;
    for (int i = 0; i < n; ++i) {
        if (lanes[size_t(i)].state == State::Barrier) at_bar.push_back(i);
        if (lanes[size_t(i)].state == State::Done) gone.push_back(i);
    }
    std::string s = "no thread can go on:";
    if (!at_bar.empty())
        s += " threads " + ranges(at_bar) + " wait at __syncthreads (" + where(bar_at) + ");";
    for (int w = 0; w * 32 < n; ++w) {
        std::vector<int> waiting;
        for (int i = w * 32; i < std::min(n, w * 32 + 32); ++i)
            if (lanes[size_t(i)].state == State::Warp) waiting.push_back(i - w * 32);
        if (waiting.empty()) continue;
        const Lane& o = lanes[size_t(w * 32 + waiting[0])];
        s += " lanes " + ranges(waiting) + " of warp " + std::to_string(w) + " wait in " +
             kind_name(o.kind) + "(mask " + hex(o.mask) + ") at " + where(o.at) + ";";
    }
    if (!gone.empty()) s += " threads " + ranges(gone) + " have exited";
    return s;
}

// (Apart from syncthreads, so that nothing owned is in its frame when a fault abandons it.)
[[gnu::noinline, gnu::cold]] void Executor::Impl::barrier_fault(const Where& at) {
    std::vector<int> gone;
    for (int i = 0; i < n; ++i)
        if (lanes[size_t(i)].state == State::Done) gone.push_back(i);
    set_fault("thread " + std::to_string(cur) + " reaches __syncthreads (" + where(at) +
              ") after threads " + ranges(gone) + " have exited: they never will");
    gone = {};
    stop();
}

void Executor::Impl::syncthreads(const Where& at) {
    Lane& l = lanes[size_t(cur)];
    if (exited > 0) barrier_fault(at);
    if (bar_count == 0) {
        bar_at = at;
    } else if (!same_place(at, bar_at)) {
        FAIL("threads wait at different __syncthreads: " + where(bar_at) + " and, thread " +
             std::to_string(cur) + ", " + where(at));
    }
    const uint64_t g = bar_gen;
    tsan_release(&bar_token[g & 1]);
    if (++bar_count == n) {
        bar_count = 0;
        ++bar_gen;
        for (int i = 0; i < n; ++i)
            if (lanes[size_t(i)].state == State::Barrier) make_ready(i);
        for (Warp& w : warps) w.at_barrier = 0;
    } else {
        l.state = State::Barrier;
        warps[size_t(cur / 32)].at_barrier |= 1u << (cur % 32);
        yield();
    }
    tsan_acquire(&bar_token[g & 1]);
}

// The checks of a collective's arrival, and the group it joins (null for a new one). Apart
// from collective() so that the messages' strings stay out of its frame: a lane's frames are
// what each switch brings back into the cache.
Executor::Impl::Group* Executor::Impl::arrive(int kind, unsigned mask, int width, const Where& at) {
    const int me = cur, wi = me / 32, lane = me % 32, base = wi * 32;
    const int lanes_here = std::min(32, n - base);
    Warp& w = warps[size_t(wi)];
    Group* grp = nullptr;
    // Lanes the mask names that have exited, or that this last warp of a block does not
    // have, need not arrive (CUDA: "all non-exited threads named in mask").
    (void)lanes_here;
    bool bad = !(mask >> lane & 1) ||
               (kind <= kXor && (width < 1 || width > 32 || (width & (width - 1)) != 0)) ||
               (mask & w.at_barrier) != 0;
    for (int k = 0; k < w.n_groups; ++k) {
        Group& g = w.groups[k];
        if (g.mask == mask) {
            grp = &g;
            bad = bad || g.kind != kind;
        } else if (g.mask & mask) {
            bad = true;
        }
    }
    if (bad) arrival_fault(kind, mask, width, at);
    return grp;
}

[[gnu::noinline, gnu::cold]] void Executor::Impl::arrival_fault(int kind, unsigned mask, int width,
                                                                const Where& at) {
    const int me = cur, wi = me / 32, lane = me % 32, base = wi * 32;
    const int lanes_here = std::min(32, n - base);
    const Warp& w = warps[size_t(wi)];
    auto what = [&] {
        return std::string(kind_name(kind)) + "(mask " + hex(mask) + ") at " + where(at) +
               ", lane " + std::to_string(lane) + " of warp " + std::to_string(wi);
    };
    (void)lanes_here;
    if (!(mask >> lane & 1)) FAIL(what() + ": the mask leaves out the lane that calls it");
    if (kind <= kXor && (width < 1 || width > 32 || (width & (width - 1)) != 0))
        FAIL(what() + ": width " + std::to_string(width) + " is not a power of two up to 32");
    if (const unsigned waiting = mask & w.at_barrier)
        FAIL(what() + ": lane " + std::to_string(__builtin_ctz(waiting)) +
             " of the mask waits at __syncthreads (" + where(bar_at) + ")");
    for (int k = 0; k < w.n_groups; ++k) {
        const Group& g = w.groups[k];
        if ((g.mask & mask) && (g.mask != mask || g.kind != kind)) {
            const Lane& o = lanes[size_t(base + __builtin_ctz(g.arrived))];
            FAIL(what() + ": lane " + std::to_string(__builtin_ctz(g.arrived)) + " waits in " +
                 kind_name(o.kind) + "(mask " + hex(o.mask) + ") at " + where(o.at));
        }
    }
    FAIL(what() + ": a collective the simulator cannot match");
}

[[gnu::noinline, gnu::cold]] void Executor::Impl::source_fault(int kind, unsigned mask, int p,
                                                               int j, const Where& at) {
    const unsigned gone = warps[size_t(cur / 32)].exited;
    FAIL(std::string(kind_name(kind)) + "(mask " + hex(mask) + ") at " + where(at) + ": lane " +
         std::to_string(p) + " of warp " + std::to_string(cur / 32) + " reads lane " +
         std::to_string(j) +
         (gone >> j & 1 ? ", which has exited" : ", which the mask leaves out"));
}

uint64_t Executor::Impl::collective(int kind, unsigned mask, uint64_t bits, int arg, int width,
                                    const Where& at) {
    const int me = cur, wi = me / 32, lane = me % 32;
    Warp& w = warps[size_t(wi)];
    Group* grp = arrive(kind, mask, width, at);
    if (!grp) {
        grp = &w.groups[w.n_groups++];
        *grp = Group{kind, mask, 0, next_token++ & 0xffff, at};
    }
    grp->arrived |= 1u << lane;
    Lane& l = lanes[size_t(me)];
    l.kind = kind;
    l.mask = mask;
    l.bits = bits;
    l.arg = arg;
    l.width = width;
    l.at = at;
    l.gen = grp->token;
    if (kind == kSyncwarp) tsan_release(&sync_tokens[grp->token]);
    if (grp->arrived == (mask & ~w.exited)) {
        complete(wi, int(grp - w.groups), lane);
    } else {
        l.state = State::Warp;
        yield();
    }
    if (kind == kSyncwarp) tsan_acquire(&sync_tokens[size_t(l.gen)]);
    return l.result;
}

void Executor::Impl::complete(int wi, int k, int running_lane) {
    Warp& w = warps[size_t(wi)];
    const Group grp = w.groups[k];
    w.groups[k] = w.groups[--w.n_groups];
    const int base = wi * 32, lanes_here = std::min(32, n - base);
    const unsigned live = grp.arrived;  // the mask's lanes that have not exited
    unsigned ballot = 0;
    if (grp.kind >= kBallot)
        for (int j = 0; j < lanes_here; ++j)
            if (live >> j & 1 && lanes[size_t(base + j)].bits) ballot |= 1u << j;
    for (int p = 0; p < lanes_here; ++p) {
        if (!(live >> p & 1)) continue;
        Lane& o = lanes[size_t(base + p)];
        if (grp.kind <= kXor) {
            // PTX's shfl.sync: the lane's segment of `width` lanes, the source by the mode
            // (the offset's low five bits), the lane's own value where the source falls
            // outside.
            const int seg = 32 - o.width;
            const int c = (seg << 8) | (grp.kind == kUp ? 0 : 0x1f);
            const int min_lane = p & seg, max_lane = min_lane | (c & 0x1f & ~seg);
            const int b = o.arg & 0x1f;
            int j = p;
            bool ok = false;
            switch (grp.kind) {
                case kIdx:
                    j = min_lane | (b & ~seg);
                    ok = j <= max_lane;
                    break;
                case kUp:
                    j = p - b;
                    ok = j >= max_lane;
                    break;
                case kDown:
                    j = p + b;
                    ok = j <= max_lane;
                    break;
                default:
                    j = p ^ b;
                    ok = j <= max_lane;
                    break;
            }
            if (!ok) j = p;
            // A lane that exited, or that the mask leaves out, has nothing to give.
            if (!(live >> j & 1)) source_fault(grp.kind, grp.mask, p, j, grp.at);
            o.result = lanes[size_t(base + j)].bits;
        } else if (grp.kind == kBallot) {
            o.result = ballot;
        } else if (grp.kind == kAny) {
            o.result = ballot != 0;
        } else if (grp.kind == kAll) {
            o.result = ballot == live;
        } else {
            o.result = 0;
        }
        if (p != running_lane) make_ready(base + p);
    }
}

Executor::Executor(std::function<std::string(const void*)> check_pointer)
    : impl_(std::make_unique<Impl>()) {
    impl_->check_pointer = std::move(check_pointer);
#if defined(CUDASIM_TSAN)
    impl_->sched_tsan = __tsan_get_current_fiber();
#endif
    Watchdog& w = watchdog();
    std::lock_guard<std::mutex> lock(w.m);
    w.all.push_back(&impl_->watched);
}

Executor::~Executor() {
    {
        Watchdog& w = watchdog();
        std::lock_guard<std::mutex> lock(w.m);
        w.all.erase(std::remove(w.all.begin(), w.all.end(), &impl_->watched), w.all.end());
    }
    for (size_t i = 0; i < impl_->fibers.size(); ++i) impl_->drop_fiber(int(i));
    std::free(impl_->arena);
}

std::string Executor::run(const Kernel& k, size_t max_dynamic) {
    Impl& e = *impl_;
    for (const auto& [i, p] : k.pointers) {
        if (!p) continue;
        const std::string why = e.check_pointer(p);
        if (!why.empty())
            return "kernel " + std::string(k.name) + ": argument " + std::to_string(i) + " " + why;
    }
    e.k = &k;
    e.fault.clear();
    e.n = int(k.block.x * k.block.y * k.block.z);
    e.dyn = k.shared;
    e.max_dynamic = max_dynamic;
    e.lanes.assign(size_t(e.n), Lane{});
    for (int i = int(e.fibers.size()); i < e.n; ++i) e.make_fiber(i);
    e.watched.kernel = k.name;
#if defined(CUDASIM_ASAN)
    if (!e.sched_lo) {
        // This thread's stack, which fibers hand back to (AddressSanitizer is told of it).
        pthread_attr_t a;
        void* lo = nullptr;
        pthread_getattr_np(pthread_self(), &a);
        pthread_attr_getstack(&a, &lo, &e.sched_size);
        pthread_attr_destroy(&a);
        e.sched_lo = lo;
    }
#endif
    tl_exec = &e;
    for (unsigned z = 0; z < k.grid.z; ++z)
        for (unsigned y = 0; y < k.grid.y; ++y)
            for (unsigned x = 0; x < k.grid.x; ++x) {
                e.block = {x, y, z};
                if (e.run_block()) continue;
                // Threads stopped inside the kernel are abandoned with their stacks: each
                // gets a new fiber (a new stack and a new thread to ThreadSanitizer).
                for (int i = 0; i < e.n; ++i) {
                    const Lane& l = e.lanes[size_t(i)];
                    if (l.started && l.state != State::Done) {
                        e.drop_fiber(i);
                        e.make_fiber(i);
                    }
                }
                e.watched.since_ns = 0;
                tl_exec = nullptr;
                return e.fault;
            }
    tl_exec = nullptr;
    return "";
}

}  // namespace cudasim::detail

// ---- the entry points kernels call ------------------------------------------------------------

namespace cudasim {

using detail::running;

void syncthreads(const Where& at) {
    running("__syncthreads").syncthreads(at);
}

void syncwarp(unsigned mask, const Where& at) {
    running("__syncwarp").collective(detail::kSyncwarp, mask, 0, 0, 32, at);
}

uint64_t shuffle(Shuffle kind, unsigned mask, uint64_t bits, int arg, int width, const Where& at) {
    return running("a shuffle").collective(int(kind), mask, bits, arg, width, at);
}

unsigned vote(Vote kind, unsigned mask, bool pred, const Where& at) {
    return unsigned(
        running("a vote").collective(detail::kBallot + int(kind), mask, pred ? 1 : 0, 0, 32, at));
}

void* block_shared(const void* key, size_t bytes, size_t align) {
    return running("shared memory").shared(key, bytes, align);
}

void* dynamic_shared() {
    return running("dynamic shared memory").arena;
}

}  // namespace cudasim
