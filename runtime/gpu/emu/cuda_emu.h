// cuda_emu.h: CUDA C on the host compiler, for the emulated GPU (runtime/gpu/emu/build.py).
//
// The SAME generated source that nvcc compiles for a real GPU is compiled by g++ with
// -DHYBRID_EMULATE -include cuda_emu.h. This header supplies what CUDA C adds to C++:
//
// - qualifiers (__global__, __device__, __shared__, __forceinline__, __launch_bounds__, ...);
// - dim3/uint3 and threadIdx, blockIdx, blockDim, gridDim, warpSize;
// - execution: the blocks of a launch run one after another; the threads of a block run as
//   fibers (cooperative, on the launching OS thread), so __syncthreads() is a real barrier:
//   a thread that reaches it yields until every live thread of its block has arrived
//   (threads that exited count as arrived, as on Volta and later);
// - warp operations (__shfl_*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp): the
//   lanes of a warp exchange values through a per-warp slot array between two warp
//   barriers; the mask argument is not checked (all live lanes of the warp take part);
// - __shared__ variables are `static thread_local`: one copy per launching OS thread, which
//   every fiber (thread) of the running block shares; blocks run one at a time, so that is
//   exactly per-block storage. Dynamic shared memory: HYB_DYNAMIC_SHARED(type, name);
// - atomics as plain read-modify-write (fibers never preempt each other);
// - the math and bit-cast intrinsics CUDA C uses, vector types (float4, int4, ...).
//
// A launch reports errors (bad dimensions, deadlock at barriers, fiber stack overflow,
// __trap) through its return value and hyb_emu_last_error(); it never aborts the process.
//
// Kernels are reached through stubs the generator writes under #ifdef HYBRID_EMULATE:
//     HYB_EMU_STUB(kernel_name)
// defines extern "C" int hyb_emu_launch_<kernel_name>(grid3, block3, shared_bytes, args,
// nargs, arg_sizes), where args[i] points to the value of parameter i (as cuLaunchKernel's
// kernelParams) and arg_sizes[i] is its size in bytes (checked against the parameter).
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <type_traits>
#include <utility>

#if !defined(__x86_64__) || defined(HYB_EMU_UCONTEXT)
#define HYB_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

// ------------------------------------------------------------------------- qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __constant__ static
#define HYB_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(hyb_emu::dynamic_shared())

// ------------------------------------------------------------------------- vector types
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(16) double2 { double x, y; };
struct __align__(16) longlong2 { long long x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline double2 make_double2(double x, double y) { return double2{x, y}; }
inline longlong2 make_longlong2(long long x, long long y) { return longlong2{x, y}; }

constexpr int warpSize = 32;

// ------------------------------------------------------------------------- the scheduler
namespace hyb_emu {

constexpr unsigned MAX_THREADS = 1024;
constexpr unsigned MAX_WARPS = MAX_THREADS / 32;
constexpr size_t STACK_BYTES = 256 * 1024;      // per fiber; reserved, touched pages only
constexpr unsigned long long CANARY = 0x6879625f73746b21ULL;  // at the bottom of each stack
constexpr unsigned MAX_SHARED = 227 * 1024;     // dynamic shared bytes (an H100's opt-in max)

struct Fiber {
#ifdef HYB_EMU_USE_UCONTEXT
    ucontext_t ctx;
#else
    void* sp;
#endif
    int done;
};

struct Launch {
    void (*thunk)(void*);
    void* ctx;
    unsigned nthreads, live;
    unsigned bar_count, bar_gen;
    unsigned warp_live[MAX_WARPS], warp_count[MAX_WARPS], warp_gen[MAX_WARPS];
    unsigned long long warp_slot[MAX_WARPS][32];
    Fiber* fibers;
    unsigned current;
    int advanced;  // set whenever a thread makes progress in the current round
#ifdef HYB_EMU_USE_UCONTEXT
    ucontext_t sched;
#else
    void* sched_sp;
#endif
    char* stacks;
    char* dyn_shared;
    const char* error;
};

inline thread_local Launch* cur = nullptr;
inline thread_local uint3 thread_idx, block_idx;
inline thread_local dim3 block_dim, grid_dim;
inline thread_local char error_text[512];

inline char* dynamic_shared() { return cur->dyn_shared; }

}  // namespace hyb_emu

#define threadIdx (hyb_emu::thread_idx)
#define blockIdx (hyb_emu::block_idx)
#define blockDim (hyb_emu::block_dim)
#define gridDim (hyb_emu::grid_dim)

#ifndef HYB_EMU_USE_UCONTEXT
// hyb_emu_swap(save, load): push the callee-saved registers and the SSE/x87 control words,
// store the stack pointer in *save, switch to the stack `load` and pop the same from it.
extern "C" void hyb_emu_swap(void** save, void* load) __attribute__((visibility("hidden")));
asm(R"(
    .text
    .p2align 4
    .globl hyb_emu_swap
    .hidden hyb_emu_swap
    .type hyb_emu_swap, @function
hyb_emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hyb_emu_swap, .-hyb_emu_swap
)");
#endif

namespace hyb_emu {

inline void to_scheduler(Launch* L) {
#ifdef HYB_EMU_USE_UCONTEXT
    swapcontext(&L->fibers[L->current].ctx, &L->sched);
#else
    hyb_emu_swap(&L->fibers[L->current].sp, L->sched_sp);
#endif
}

// A waiting thread hands the OS thread back to the scheduler, which resumes it next round.
inline void yield(Launch* L) { to_scheduler(L); }

inline void release_if_complete(Launch* L, unsigned warp) {
    if (L->bar_count > 0 && L->bar_count >= L->live) {
        L->bar_count = 0;
        ++L->bar_gen;
    }
    if (L->warp_count[warp] > 0 && L->warp_count[warp] >= L->warp_live[warp]) {
        L->warp_count[warp] = 0;
        ++L->warp_gen[warp];
    }
}

__attribute__((noinline)) inline void block_barrier() {
    Launch* L = cur;
    unsigned gen = L->bar_gen;
    L->advanced = 1;
    if (++L->bar_count >= L->live) {
        L->bar_count = 0;
        ++L->bar_gen;
        return;
    }
    while (L->bar_gen == gen) yield(L);
    L->advanced = 1;
}

__attribute__((noinline)) inline void warp_barrier() {
    Launch* L = cur;
    unsigned w = L->current >> 5;
    unsigned gen = L->warp_gen[w];
    L->advanced = 1;
    if (++L->warp_count[w] >= L->warp_live[w]) {
        L->warp_count[w] = 0;
        ++L->warp_gen[w];
        return;
    }
    while (L->warp_gen[w] == gen) yield(L);
    L->advanced = 1;
}

[[noreturn]] inline void thread_exit(Launch* L) {
    L->fibers[L->current].done = 1;
    L->advanced = 1;
    --L->live;
    unsigned w = L->current >> 5;
    --L->warp_live[w];
    release_if_complete(L, w);
    to_scheduler(L);
    __builtin_unreachable();
}

inline void fiber_entry() {
    Launch* L = cur;
    L->thunk(L->ctx);
    thread_exit(L);
}

inline void fail(Launch* L, const char* what) {
    if (L->error == nullptr) {
        snprintf(error_text, sizeof error_text, "%s", what);
        L->error = error_text;
    }
}

__attribute__((noinline)) inline void start_fiber(Launch* L, unsigned t) {
    char* base = L->stacks + (size_t)t * STACK_BYTES;
    *reinterpret_cast<unsigned long long*>(base) = CANARY;
    Fiber& f = L->fibers[t];
    f.done = 0;
#ifdef HYB_EMU_USE_UCONTEXT
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = base;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
#else
    // The first switch pops 8 bytes of control words, six registers, then "returns" into
    // fiber_entry with the stack 8 bytes off 16-byte alignment, as after a call.
    uintptr_t top = ((uintptr_t)(base + STACK_BYTES)) & ~(uintptr_t)15;
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                                       // fiber_entry never returns
    *--sp = reinterpret_cast<void*>(&fiber_entry);
    for (int i = 0; i < 6; ++i) *--sp = nullptr;            // rbp rbx r12 r13 r14 r15
    --sp;
    uint32_t mxcsr = 0x1F80;
    uint16_t fpucw = 0x037F;
    memcpy(sp, &mxcsr, 4);
    memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
    f.sp = sp;
#endif
}

__attribute__((noinline)) inline void run_block(Launch* L) {
    unsigned n = L->nthreads;
    for (unsigned t = 0; t < n; ++t) start_fiber(L, t);
    L->live = n;
    L->bar_count = 0;
    for (unsigned w = 0; w < MAX_WARPS; ++w) {
        unsigned lo = w * 32;
        L->warp_live[w] = lo < n ? (n - lo < 32 ? n - lo : 32) : 0;
        L->warp_count[w] = 0;
    }
    const unsigned bx = block_dim.x, by = block_dim.y;
    while (L->live > 0) {
        L->advanced = 0;
        for (unsigned t = 0; t < n; ++t) {
            if (L->fibers[t].done) continue;
            L->current = t;
            thread_idx = uint3{t % bx, (t / bx) % by, t / (bx * by)};
#ifdef HYB_EMU_USE_UCONTEXT
            swapcontext(&L->sched, &L->fibers[t].ctx);
#else
            hyb_emu_swap(&L->sched_sp, L->fibers[t].sp);
#endif
        }
        if (!L->advanced && L->live > 0) {
            fail(L, "deadlock: the threads of a block wait at different barriers (a "
                    "__syncthreads or warp operation that not every live thread reaches)");
            return;  // the waiting fibers are abandoned: they own nothing but their stacks
        }
    }
    for (unsigned t = 0; t < n; ++t) {
        if (*reinterpret_cast<unsigned long long*>(L->stacks + (size_t)t * STACK_BYTES) != CANARY) {
            fail(L, "a thread overflowed its emulated stack (256 KiB): large local arrays?");
            return;
        }
    }
}

inline int check_dims(const unsigned* g, const unsigned* b, unsigned shared_bytes) {
    const char* why = nullptr;
    unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2])
        why = "a grid or block dimension is 0";
    else if (threads > MAX_THREADS)
        why = "more than 1024 threads per block";
    else if (b[0] > 1024 || b[1] > 1024 || b[2] > 64)
        why = "block dimensions exceed (1024, 1024, 64)";
    else if (g[0] > 2147483647u || g[1] > 65535 || g[2] > 65535)
        why = "grid dimensions exceed (2^31 - 1, 65535, 65535)";
    else if (shared_bytes > MAX_SHARED)
        why = "more dynamic shared memory than a block can have (227 KiB)";
    if (why == nullptr) return 0;
    snprintf(error_text, sizeof error_text, "launch of grid (%u, %u, %u), block (%u, %u, %u), "
             "%u shared bytes: %s", g[0], g[1], g[2], b[0], b[1], b[2], shared_bytes, why);
    return -1;
}

__attribute__((noinline)) inline int launch(const unsigned* g, const unsigned* b, unsigned shared_bytes,
                  void (*thunk)(void*), void* ctx) {
    if (cur != nullptr) {
        snprintf(error_text, sizeof error_text, "a kernel launched another kernel "
                 "(dynamic parallelism is not emulated)");
        return -1;
    }
    if (check_dims(g, b, shared_bytes)) return -1;
    Launch* L = static_cast<Launch*>(calloc(1, sizeof(Launch)));
    if (L == nullptr) {
        snprintf(error_text, sizeof error_text, "out of host memory for a launch");
        return -1;
    }
    L->thunk = thunk;
    L->ctx = ctx;
    L->nthreads = b[0] * b[1] * b[2];
    size_t stack_total = (size_t)L->nthreads * STACK_BYTES;
    void* stacks = mmap(nullptr, stack_total, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    L->fibers = static_cast<Fiber*>(calloc(L->nthreads, sizeof(Fiber)));
    L->dyn_shared = static_cast<char*>(aligned_alloc(256, ((size_t)shared_bytes + 255) / 256 * 256 + 256));
    if (stacks == MAP_FAILED || L->fibers == nullptr || L->dyn_shared == nullptr) {
        snprintf(error_text, sizeof error_text, "out of host memory for %u emulated threads",
                 L->nthreads);
        if (stacks != MAP_FAILED) munmap(stacks, stack_total);
        free(L->fibers);
        free(L->dyn_shared);
        free(L);
        return -1;
    }
    L->stacks = static_cast<char*>(stacks);
    grid_dim = dim3(g[0], g[1], g[2]);
    block_dim = dim3(b[0], b[1], b[2]);
    cur = L;
    for (unsigned z = 0; z < g[2] && !L->error; ++z)
        for (unsigned y = 0; y < g[1] && !L->error; ++y)
            for (unsigned x = 0; x < g[0] && !L->error; ++x) {
                block_idx = uint3{x, y, z};
                run_block(L);
            }
    cur = nullptr;
    int rc = L->error ? -1 : 0;
    munmap(stacks, stack_total);
    free(L->fibers);
    free(L->dyn_shared);
    free(L);
    return rc;
}

// The launch stub's glue: call kernel k with args[i] read as its i-th parameter type.
template <class... P>
struct Call {
    void (*k)(P...);
    void** args;
};

template <class... P, size_t... I>
inline void invoke(void (*k)(P...), void** args, std::index_sequence<I...>) {
    k(*static_cast<std::remove_reference_t<P>*>(args[I])...);
}

template <class... P>
inline void thunk(void* ctx) {
    Call<P...>* c = static_cast<Call<P...>*>(ctx);
    invoke(c->k, c->args, std::index_sequence_for<P...>{});
}

template <class... P>
inline int launch_kernel(const char* name, void (*k)(P...), const unsigned* g, const unsigned* b,
                         unsigned shared_bytes, void** args, unsigned nargs,
                         const unsigned* arg_sizes) {
    constexpr unsigned n = sizeof...(P);
    const unsigned sizes[n + 1] = {(unsigned)sizeof(std::remove_reference_t<P>)..., 0u};
    if (nargs != n) {
        snprintf(error_text, sizeof error_text, "kernel %s takes %u argument(s), got %u", name,
                 n, nargs);
        return -1;
    }
    for (unsigned i = 0; i < n; ++i) {
        if (arg_sizes[i] != sizes[i]) {
            snprintf(error_text, sizeof error_text, "kernel %s: argument %u is %u bytes wide, "
                     "the kernel's parameter %u", name, i, arg_sizes[i], sizes[i]);
            return -1;
        }
    }
    Call<P...> c{k, args};
    return launch(g, b, shared_bytes, &thunk<P...>, &c);
}

}  // namespace hyb_emu

#define HYB_EMU_STUB(kernel)                                                                 \
    extern "C" int hyb_emu_launch_##kernel(const unsigned* grid3, const unsigned* block3,      \
                                           unsigned shared_bytes, void** args, unsigned nargs, \
                                           const unsigned* arg_sizes) {                       \
        return hyb_emu::launch_kernel(#kernel, &kernel, grid3, block3, shared_bytes, args,     \
                                      nargs, arg_sizes);                                      \
    }

extern "C" const char* hyb_emu_last_error() { return hyb_emu::error_text; }

// ------------------------------------------------------------------------- synchronization
inline void __syncthreads() { hyb_emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; hyb_emu::warp_barrier(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() {
    hyb_emu::fail(hyb_emu::cur, "__trap() was called");
    hyb_emu::thread_exit(hyb_emu::cur);
}

// ------------------------------------------------------------------------- warp operations
namespace hyb_emu {
template <class T>
__attribute__((noinline)) T exchange(T v, unsigned src, bool take) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    Launch* L = cur;
    unsigned lane = L->current & 31, w = L->current >> 5;
    memcpy(&L->warp_slot[w][lane], &v, sizeof(T));
    warp_barrier();
    T r = v;
    if (take && src < 32) memcpy(&r, &L->warp_slot[w][src], sizeof(T));
    warp_barrier();  // nobody overwrites a slot before every lane has read
    return r;
}
inline unsigned lane_id() { return cur->current & 31; }
}  // namespace hyb_emu

template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    (void)mask;
    unsigned lane = hyb_emu::lane_id(), base = lane & ~(unsigned)(width - 1);
    unsigned src = lane + delta;
    return hyb_emu::exchange(v, src, src < base + (unsigned)width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    (void)mask;
    unsigned lane = hyb_emu::lane_id(), base = lane & ~(unsigned)(width - 1);
    return hyb_emu::exchange(v, lane - delta, lane - base >= delta);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    (void)mask;
    unsigned lane = hyb_emu::lane_id(), base = lane & ~(unsigned)(width - 1);
    unsigned src = lane ^ (unsigned)lane_mask;
    return hyb_emu::exchange(v, src, src < base + (unsigned)width);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
    (void)mask;
    unsigned lane = hyb_emu::lane_id(), base = lane & ~(unsigned)(width - 1);
    return hyb_emu::exchange(v, base + ((unsigned)src_lane % (unsigned)width), true);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    (void)mask;
    hyb_emu::Launch* L = hyb_emu::cur;
    unsigned w = L->current >> 5;
    L->warp_slot[w][L->current & 31] = pred != 0;
    hyb_emu::warp_barrier();
    unsigned bits = 0;
    unsigned lanes = (L->nthreads - w * 32) < 32 ? L->nthreads - w * 32 : 32;
    for (unsigned i = 0; i < lanes; ++i)
        if (!L->fibers[w * 32 + i].done && L->warp_slot[w][i]) bits |= 1u << i;
    hyb_emu::warp_barrier();
    return bits;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
    hyb_emu::Launch* L = hyb_emu::cur;
    unsigned w = L->current >> 5;
    unsigned live = 0;
    unsigned lanes = (L->nthreads - w * 32) < 32 ? L->nthreads - w * 32 : 32;
    for (unsigned i = 0; i < lanes; ++i)
        if (!L->fibers[w * 32 + i].done) live |= 1u << i;
    return __ballot_sync(mask, pred) == live;
}
inline unsigned __activemask() {
    hyb_emu::Launch* L = hyb_emu::cur;
    unsigned w = L->current >> 5, bits = 0;
    unsigned lanes = (L->nthreads - w * 32) < 32 ? L->nthreads - w * 32 : 32;
    for (unsigned i = 0; i < lanes; ++i)
        if (!L->fibers[w * 32 + i].done) bits |= 1u << i;
    return bits;
}

// ------------------------------------------------------------------------- atomics
// Fibers switch only at barriers, so a read-modify-write is atomic. Only the overloads
// CUDA has are given, so code that would not compile for a GPU does not compile here.
#define HYB_EMU_ATOMIC(name, T, expr)                                                        \
    inline T name(T* p, T v) { T old = *p; *p = (expr); return old; }
HYB_EMU_ATOMIC(atomicAdd, int, old + v)
HYB_EMU_ATOMIC(atomicAdd, unsigned, old + v)
HYB_EMU_ATOMIC(atomicAdd, unsigned long long, old + v)
HYB_EMU_ATOMIC(atomicAdd, float, old + v)
HYB_EMU_ATOMIC(atomicAdd, double, old + v)
HYB_EMU_ATOMIC(atomicSub, int, old - v)
HYB_EMU_ATOMIC(atomicSub, unsigned, old - v)
HYB_EMU_ATOMIC(atomicExch, int, v)
HYB_EMU_ATOMIC(atomicExch, unsigned, v)
HYB_EMU_ATOMIC(atomicExch, unsigned long long, v)
HYB_EMU_ATOMIC(atomicExch, float, v)
HYB_EMU_ATOMIC(atomicMax, int, old > v ? old : v)
HYB_EMU_ATOMIC(atomicMax, unsigned, old > v ? old : v)
HYB_EMU_ATOMIC(atomicMax, long long, old > v ? old : v)
HYB_EMU_ATOMIC(atomicMax, unsigned long long, old > v ? old : v)
HYB_EMU_ATOMIC(atomicMin, int, old < v ? old : v)
HYB_EMU_ATOMIC(atomicMin, unsigned, old < v ? old : v)
HYB_EMU_ATOMIC(atomicMin, long long, old < v ? old : v)
HYB_EMU_ATOMIC(atomicMin, unsigned long long, old < v ? old : v)
HYB_EMU_ATOMIC(atomicAnd, int, old & v)
HYB_EMU_ATOMIC(atomicAnd, unsigned, old & v)
HYB_EMU_ATOMIC(atomicAnd, unsigned long long, old & v)
HYB_EMU_ATOMIC(atomicOr, int, old | v)
HYB_EMU_ATOMIC(atomicOr, unsigned, old | v)
HYB_EMU_ATOMIC(atomicOr, unsigned long long, old | v)
HYB_EMU_ATOMIC(atomicXor, int, old ^ v)
HYB_EMU_ATOMIC(atomicXor, unsigned, old ^ v)
HYB_EMU_ATOMIC(atomicXor, unsigned long long, old ^ v)
HYB_EMU_ATOMIC(atomicInc, unsigned, old >= v ? 0u : old + 1u)
HYB_EMU_ATOMIC(atomicDec, unsigned, (old == 0u || old > v) ? v : old - 1u)
#undef HYB_EMU_ATOMIC
#define HYB_EMU_CAS(T)                                                                       \
    inline T atomicCAS(T* p, T compare, T v) { T old = *p; if (old == compare) *p = v; return old; }
HYB_EMU_CAS(int)
HYB_EMU_CAS(unsigned)
HYB_EMU_CAS(unsigned long long)
HYB_EMU_CAS(unsigned short)
#undef HYB_EMU_CAS

// ------------------------------------------------------------------------- math and bits
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
template <class T>
inline T __ldg(const T* p) { return *p; }

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
inline double __dadd_rn(double x, double y) { return x + y; }
inline double __dmul_rn(double x, double y) { return x * y; }
inline double __fma_rn(double x, double y, double z) { return fma(x, y, z); }
inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
inline float exp10f(float x) { return powf(10.0f, x); }
inline float fdividef(float x, float y) { return x / y; }

inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
