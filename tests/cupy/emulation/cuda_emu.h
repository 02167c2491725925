// CUDA built-ins for compiling generated vyre_cupy kernels on the host CPU.
//
// Build with: g++ -std=c++20 -O1 -ffp-contract=off -pthread
//
// Execution model (docs/cuda.md, "Testing without a GPU"):
// - one OS thread per lane of a workgroup, so __syncthreads() is a real
//   barrier (std::barrier); a lane that leaves the kernel (Return or the end of
//   the body) calls arrive_and_drop(), so returned lanes do not count;
// - workgroups run one after another (z, y, x order); __shared__ arrays are
//   function statics, zeroed by the kernel itself at entry;
// - a cooperative launch (launch_cooperative, for kernels with grid-wide barriers,
//   cooperative_groups::this_grid().sync()) starts one thread per lane of the whole
//   grid; workgroups take turns, one at a time and phase by phase (a phase ends at a
//   grid barrier), so the function-static __shared__ arrays still serve one workgroup
//   at a time (the kernel zeroes them again after every grid barrier);
// - blockIdx/threadIdx/blockDim/gridDim are thread-locals (set per lane thread);
// - atomics are __atomic builtins (relaxed); plain loads and stores are relaxed
//   atomic accesses too, so a racy program is still well-defined C++;
// - the intrinsics follow their documented CUDA semantics.
//
// With tracing on, every global/shared access is recorded and a launch is
// flagged "racy" when two different lanes touch one word, at least one of them
// writing, without a barrier ordering them (lanes of different workgroups are
// never ordered, except by a grid barrier). Only race-free launches must match the
// lockstep reference.
#pragma once

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

struct dim3 {
  unsigned x, y, z;
};
typedef dim3 uint3;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

namespace vy_emu {

inline thread_local dim3 grid_dim{1, 1, 1};
inline thread_local dim3 block_dim{1, 1, 1};
inline thread_local dim3 thread_idx{0, 0, 0};
inline thread_local dim3 block_idx{0, 0, 0};
inline thread_local unsigned lane = 0;    // linear lane within its workgroup
inline thread_local unsigned wg = 0;      // linear workgroup index
inline thread_local unsigned phase = 0;   // barriers passed in this workgroup
inline thread_local unsigned grid_phase = 0;  // grid barriers passed (cooperative launches)
inline thread_local std::barrier<>* wg_barrier = nullptr;

// ---------------------------------------------------------------- tracing
struct Access {
  uintptr_t addr;
  unsigned wg, lane, phase, kind;  // kind: 0 load, 1 store, 2 atomic
  unsigned grid_phase;             // grid barriers passed: accesses across one are ordered
};
struct Range {
  uintptr_t lo, hi;
};
inline bool tracing = false;
inline std::mutex trace_mu;
inline std::vector<Access> trace_log;
inline std::vector<Range> global_ranges;

inline void record(const void* p, unsigned kind) {
  if (!tracing) return;
  std::lock_guard<std::mutex> guard(trace_mu);
  trace_log.push_back(Access{reinterpret_cast<uintptr_t>(p), wg, lane, phase, kind, grid_phase});
}

inline bool is_global(uintptr_t addr) {
  for (const Range& r : global_ranges)
    if (addr >= r.lo && addr < r.hi) return true;
  return false;
}

// True when two lanes touched one word, one of them writing, unordered by a barrier
// (within one grid phase: a grid barrier orders every lane of the grid).
inline bool racy() {
  struct Key {
    uintptr_t addr;
    unsigned space;  // ~0u for global memory, else the workgroup (shared memory)
    const Access* a;
  };
  std::vector<Key> keys;
  keys.reserve(trace_log.size());
  for (const Access& a : trace_log)
    keys.push_back(Key{a.addr, is_global(a.addr) ? ~0u : a.wg, &a});
  std::sort(keys.begin(), keys.end(), [](const Key& x, const Key& y) {
    if (x.addr != y.addr) return x.addr < y.addr;
    if (x.space != y.space) return x.space < y.space;
    if (x.a->grid_phase != y.a->grid_phase) return x.a->grid_phase < y.a->grid_phase;
    if (x.a->wg != y.a->wg) return x.a->wg < y.a->wg;
    return x.a->phase < y.a->phase;
  });
  auto same = [](const Key& x, const Key& y) {
    return x.addr == y.addr && x.space == y.space && x.a->grid_phase == y.a->grid_phase;
  };
  size_t i = 0;
  while (i < keys.size()) {
    size_t j = i;
    bool writes = false, many_wgs = false;
    while (j < keys.size() && same(keys[j], keys[i])) {
      writes |= keys[j].a->kind != 0;
      many_wgs |= keys[j].a->wg != keys[i].a->wg;
      ++j;
    }
    if (writes) {
      if (many_wgs) return true;  // workgroups are never ordered with each other
      // One workgroup: within each barrier phase, a write and any access of another lane.
      size_t p = i;
      while (p < j) {
        size_t q = p;
        bool phase_writes = false, many_lanes = false;
        while (q < j && keys[q].a->phase == keys[p].a->phase) {
          phase_writes |= keys[q].a->kind != 0;
          many_lanes |= keys[q].a->lane != keys[p].a->lane;
          ++q;
        }
        if (phase_writes && many_lanes) return true;
        p = q;
      }
    }
    i = j;
  }
  return false;
}

// ---------------------------------------------------------------- memory access
template <class T>
inline T load(const T* p) {
  record(p, 0);
  T value;
  __atomic_load(const_cast<T*>(p), &value, __ATOMIC_RELAXED);
  return value;
}
template <class T, class V>
inline void store(T* p, V v) {
  record(p, 1);
  T value = static_cast<T>(v);
  __atomic_store(p, &value, __ATOMIC_RELAXED);
}
template <class T>
inline T* atomic_target(T* p) {
  record(p, 2);
  return p;
}

}  // namespace vy_emu

#define threadIdx (vy_emu::thread_idx)
#define blockIdx (vy_emu::block_idx)
#define blockDim (vy_emu::block_dim)
#define gridDim (vy_emu::grid_dim)

#define VY_LOAD(p) (vy_emu::load(p))
#define VY_STORE(p, v) (vy_emu::store((p), (v)))
#define VY_ATOMIC(p) (vy_emu::atomic_target(p))

inline void __syncthreads() {
  ++vy_emu::phase;
  vy_emu::wg_barrier->arrive_and_wait();
}

// Every plain access is a relaxed atomic; the fence orders them like membar.gl.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---------------------------------------------------------------- atomics
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicAnd(unsigned* p, unsigned v) {
  return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicXor(unsigned* p, unsigned v) {
  return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicExch(unsigned* p, unsigned v) {
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v) {
  unsigned old = compare;  // on failure the builtin stores the current word here
  __atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return old;
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > old &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

// ---------------------------------------------------------------- intrinsics
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
// Round-to-nearest-even arithmetic: the host's default mode; -ffp-contract=off
// keeps a*b+c as two roundings, as --fmad=false does on the device.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
// cvt.rzi: truncate toward zero, clamp to the destination range, NaN -> 0.
inline unsigned __float2uint_rz(float x) {
  if (x != x || x <= 0.0f) return 0u;
  if (x >= 4294967296.0f) return 0xFFFFFFFFu;
  return static_cast<unsigned>(x);
}
inline int __float2int_rz(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647;
  if (x <= -2147483648.0f) return -2147483647 - 1;
  return static_cast<int>(x);
}

// ---------------------------------------------------------------- launching
namespace vy_emu {

using Kernel = void (*)(void** args);

struct LaneStart {
  Kernel kernel;
  void** args;
  unsigned index;  // linear lane index in the workgroup
  dim3 grid, block;
  std::barrier<>* start;
  std::barrier<>* done;
  const std::atomic<unsigned>* current;  // linear workgroup index, ~0u = quit
  std::barrier<>* const* wg;             // this workgroup's barrier
};

inline void set_block(unsigned w) {
  wg = w;
  phase = 0;
  grid_phase = 0;
  block_idx = dim3{w % grid_dim.x, (w / grid_dim.x) % grid_dim.y, w / (grid_dim.x * grid_dim.y)};
}

inline void set_lane(unsigned index) {
  const unsigned bx = block_dim.x, by = block_dim.y;
  thread_idx = dim3{index % bx, (index / bx) % by, index / (bx * by)};
  lane = index;
}

inline void* lane_main(void* raw) {
  LaneStart* s = static_cast<LaneStart*>(raw);
  grid_dim = s->grid;
  block_dim = s->block;
  set_lane(s->index);
  for (;;) {
    s->start->arrive_and_wait();
    const unsigned w = s->current->load();
    if (w == ~0u) break;
    set_block(w);
    wg_barrier = *s->wg;
    s->kernel(s->args);
    wg_barrier->arrive_and_drop();  // returned lanes no longer count at barriers
    s->done->arrive_and_wait();
  }
  return nullptr;
}

// Run a launch of a kernel WITHOUT barriers and shared memory on the calling thread:
// lanes one after another. Equivalent to the threaded launch for race-free programs,
// and re-entrant (every piece of state is thread-local), for the fake-device tests.
inline void launch_sequential(Kernel kernel, void** args, dim3 grid, dim3 block) {
  const unsigned lanes = block.x * block.y * block.z;
  const unsigned groups = grid.x * grid.y * grid.z;
  grid_dim = grid;
  block_dim = block;
  for (unsigned w = 0; w < groups; ++w) {
    set_block(w);
    for (unsigned t = 0; t < lanes; ++t) {
      set_lane(t);
      kernel(args);
    }
  }
}

// Run one launch: every workgroup of the grid, one after another, one thread per lane.
inline void launch(Kernel kernel, void** args, dim3 grid, dim3 block) {
  const unsigned lanes = block.x * block.y * block.z;
  const unsigned groups = grid.x * grid.y * grid.z;
  if (lanes == 0 || groups == 0) return;
  std::barrier<> start(lanes + 1), done(lanes + 1);
  std::atomic<unsigned> current{0};
  std::barrier<>* barrier_of_group = nullptr;
  std::vector<LaneStart> starts(lanes);
  std::vector<pthread_t> threads(lanes);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (unsigned t = 0; t < lanes; ++t) {
    starts[t] = LaneStart{kernel, args, t, grid, block, &start, &done, &current, &barrier_of_group};
    if (pthread_create(&threads[t], &attr, lane_main, &starts[t]) != 0) {
      fprintf(stderr, "cuda_emu: cannot start lane thread %u\n", t);
      exit(3);
    }
  }
  pthread_attr_destroy(&attr);
  for (unsigned w = 0; w < groups; ++w) {
    std::unique_ptr<std::barrier<>> barrier(new std::barrier<>(lanes));
    barrier_of_group = barrier.get();
    current.store(w);
    start.arrive_and_wait();
    done.arrive_and_wait();
  }
  current.store(~0u);
  start.arrive_and_wait();
  for (unsigned t = 0; t < lanes; ++t) pthread_join(threads[t], nullptr);
}

// ---------------------------------------------------------------- cooperative launches
// Grid-wide barriers (cooperative_groups::this_grid().sync(), see cooperative_groups.h
// here): one thread per lane of the WHOLE grid. Workgroups take turns, one at a time:
// workgroup w runs its lanes (threads, so __syncthreads() is real) until every one of
// them reached the next grid barrier or the end of the kernel, then w + 1 runs the same
// phase; after the last workgroup, workgroup 0 runs the next phase. Every lane of the
// grid has therefore finished a phase before any lane starts the next (the mutex orders
// their memory), and only one workgroup at a time uses the function-static __shared__
// arrays (the generated kernel zeroes them again after each grid barrier).
struct GridTurns {
  std::mutex mu;
  std::unique_ptr<std::condition_variable[]> wake;  // one per workgroup
  unsigned groups, lanes;
  unsigned turn = 0;     // the workgroup that runs
  unsigned phase = 0;    // the grid phase it runs
  unsigned arrived = 0;  // its lanes that finished that phase
  GridTurns(unsigned g, unsigned l) : wake(new std::condition_variable[g]), groups(g), lanes(l) {}
};
inline thread_local GridTurns* grid_turns = nullptr;

inline void wait_turn() {
  GridTurns& g = *grid_turns;
  std::unique_lock<std::mutex> lock(g.mu);
  g.wake[wg].wait(lock, [&] { return g.turn == wg && g.phase == grid_phase; });
}

inline void end_turn() {
  GridTurns& g = *grid_turns;
  std::lock_guard<std::mutex> lock(g.mu);
  if (++g.arrived < g.lanes) return;
  g.arrived = 0;
  if (++g.turn == g.groups) {
    g.turn = 0;
    ++g.phase;
  }
  g.wake[g.turn].notify_all();
}

inline void grid_sync() {
  if (grid_turns == nullptr) {
    fprintf(stderr, "cuda_emu: a grid barrier outside a cooperative launch\n");
    abort();  // on a GPU: undefined (a hang or cudaErrorLaunchFailure)
  }
  end_turn();
  ++grid_phase;
  ++phase;  // also a barrier of the workgroup (for the race detector)
  wait_turn();
}

struct GridLane {
  Kernel kernel;
  void** args;
  dim3 grid, block;
  unsigned w, t;
  std::barrier<>* barrier;
  GridTurns* turns;
};

inline void* grid_lane_main(void* raw) {
  GridLane* s = static_cast<GridLane*>(raw);
  grid_dim = s->grid;
  block_dim = s->block;
  set_block(s->w);
  set_lane(s->t);
  wg_barrier = s->barrier;
  grid_turns = s->turns;
  wait_turn();
  s->kernel(s->args);
  wg_barrier->arrive_and_drop();
  end_turn();
  grid_turns = nullptr;
  return nullptr;
}

// Run one cooperative launch: every lane of the grid a thread, workgroups in turns.
inline void launch_cooperative(Kernel kernel, void** args, dim3 grid, dim3 block) {
  const unsigned lanes = block.x * block.y * block.z;
  const unsigned groups = grid.x * grid.y * grid.z;
  if (lanes == 0 || groups == 0) return;
  GridTurns turns(groups, lanes);
  std::vector<std::unique_ptr<std::barrier<>>> barriers;
  for (unsigned w = 0; w < groups; ++w) barriers.emplace_back(new std::barrier<>(lanes));
  const size_t total = static_cast<size_t>(groups) * lanes;
  std::vector<GridLane> starts(total);
  std::vector<pthread_t> threads(total);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (size_t n = 0; n < total; ++n) {
    const unsigned w = static_cast<unsigned>(n / lanes), t = static_cast<unsigned>(n % lanes);
    starts[n] = GridLane{kernel, args, grid, block, w, t, barriers[w].get(), &turns};
    if (pthread_create(&threads[n], &attr, grid_lane_main, &starts[n]) != 0) {
      fprintf(stderr, "cuda_emu: cannot start lane thread %zu of a cooperative launch\n", n);
      exit(3);
    }
  }
  pthread_attr_destroy(&attr);
  for (size_t n = 0; n < total; ++n) pthread_join(threads[n], nullptr);
}

}  // namespace vy_emu
