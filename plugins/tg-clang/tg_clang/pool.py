"""CLANG's kernel threads: a pool of POSIX threads in C that runs the parts of a threaded kernel's outer loop.

The core splits a threaded kernel's outer loop into parts (engine/runner.py); a Program with `run_parts` (plugin.py,
API 2.3) runs them itself. Here one call into C hands the parts to the pool: its threads spin for a while after each
job, so the next kernel reaches them in well under a microsecond: 50 us on pauses, then up to 500 us yielding their
core to any other thread that wants it (an eager program's Python between two kernels: 128 x 128 matmuls and 1M sums
called one after another 25 us faster each than with threads asleep by then), and sleep on a condition variable when
no job comes. Python threads cost a GIL hand-off and two lock round trips per thread and kernel (30-60 us on a 2-core
VM), which made every kernel below ~100 us slower on two threads than on one.

The pool's library is built once per toolchain by CLANG's own compiler (disk-cached like a kernel). Where it cannot be
built or loaded, `pool()` is None and the core's Python threads run the parts as before."""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from typing import Any, Optional

from tgcore.plugin import CompileError, process_folder

__all__ = ["POOL_SRC", "MAX_PARTS", "MAX_VALS", "pool"]

# the parts of one job and the vals of its kernel: a job's ticket packs its generation, its part count and the next
# part into 64 bits (32 + 16 + 16), and each part's vals are built on the running thread's stack
MAX_PARTS = 0xFFFF
MAX_VALS = 64
# threads the pool may start besides the caller's
MAX_WORKERS = 255

_SRC = r"""
#define _POSIX_C_SOURCE 200809L /* (-std=c11 hides POSIX: clock_gettime, pthreads) */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*tg_kernel)(uintptr_t *bufs, const long long *vals);

#if defined(__x86_64__) || defined(__i386__)
#define TG_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define TG_PAUSE() __asm__ __volatile__("yield")
#else
#define TG_PAUSE() ((void)0)
#endif

#define TG_MAX_VALS @MAX_VALS@
#define TG_MAX_PARTS @MAX_PARTS@
#define TG_MAX_WORKERS @MAX_WORKERS@
#define TG_PAUSE_NS 50000LL /* a worker spins on pauses this long after its last job, */
#define TG_SPIN_NS 500000LL /* then yields its core to any other thread that wants it until this long, then sleeps */
#define TG_STACK_BYTES (8 << 20) /* a kernel's scratch lives on its thread's stack: as much as glibc's default */

/* The job: a ticket (generation << 32 | parts << 16 | next part) is the only word the workers change. A worker that
   wins a part by compare-and-swap on the current generation reads the job's fields after it: the caller writes them
   before it publishes the ticket and changes them only after every part is done, which needs this one. */
static struct {
  pid_t pid; /* the process that started the workers: a forked child starts its own */
  pthread_mutex_t busy, sleep_lock;
  pthread_cond_t wake;
  int workers, sleepers;
  uint64_t ticket;
  int done;
  tg_kernel fn;
  uintptr_t *bufs;
  const long long *vals, *bounds;
  int nvals;
} tg_pool = {
  .busy = PTHREAD_MUTEX_INITIALIZER, .sleep_lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER
};

static long long tg_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Take and run parts of generation `gen` until none is left. */
static void tg_take_parts(uint64_t gen) {
  for (;;) {
    uint64_t t = __atomic_load_n(&tg_pool.ticket, __ATOMIC_ACQUIRE);
    uint64_t parts = (t >> 16) & 0xFFFF, i = t & 0xFFFF;
    if ((t >> 32) != gen || i >= parts) return;
    if (!__atomic_compare_exchange_n(&tg_pool.ticket, &t, t + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    long long v[TG_MAX_VALS + 2];
    int n = tg_pool.nvals;
    memcpy(v, tg_pool.vals, sizeof(long long) * (size_t)n);
    v[n] = tg_pool.bounds[i];
    v[n + 1] = tg_pool.bounds[i + 1];
    tg_pool.fn(tg_pool.bufs, v);
    __atomic_add_fetch(&tg_pool.done, 1, __ATOMIC_RELEASE);
  }
}

static void *tg_worker(void *arg) {
  (void)arg;
  uint64_t seen = __atomic_load_n(&tg_pool.ticket, __ATOMIC_ACQUIRE) >> 32;
  for (;;) {
    long long since = tg_now_ns();
    int spins = 0;
    uint64_t gen;
    while ((gen = __atomic_load_n(&tg_pool.ticket, __ATOMIC_ACQUIRE) >> 32) == seen) {
      long long idle = 0;
      if (spins < 0) { /* past the pauses: a yield a turn (no cost where no other thread waits for this core) */
        sched_yield();
        idle = tg_now_ns() - since;
      } else if (++spins % 256 == 0 && (idle = tg_now_ns() - since) > TG_PAUSE_NS) {
        spins = -1;
      } else {
        TG_PAUSE();
      }
      if (idle > TG_SPIN_NS) {
        pthread_mutex_lock(&tg_pool.sleep_lock);
        __atomic_add_fetch(&tg_pool.sleepers, 1, __ATOMIC_SEQ_CST);
        while ((__atomic_load_n(&tg_pool.ticket, __ATOMIC_SEQ_CST) >> 32) == seen)
          pthread_cond_wait(&tg_pool.wake, &tg_pool.sleep_lock);
        __atomic_sub_fetch(&tg_pool.sleepers, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&tg_pool.sleep_lock);
        since = tg_now_ns();
        spins = 0;
      }
    }
    seen = gen;
    tg_take_parts(gen);
  }
  return 0;
}

/* Start workers up to `n` (in this process); the number running. */
static int tg_start(int n) {
  if (tg_pool.pid != getpid()) { /* none yet, or a forked child: the parent's threads are not here */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    tg_pool.sleep_lock = m;
    tg_pool.wake = c;
    tg_pool.workers = tg_pool.sleepers = 0;
    tg_pool.pid = getpid();
  }
  if (n > TG_MAX_WORKERS) n = TG_MAX_WORKERS;
  while (tg_pool.workers < n) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, TG_STACK_BYTES);
    int failed = pthread_create(&t, &attr, tg_worker, 0);
    pthread_attr_destroy(&attr);
    if (failed) break;
    tg_pool.workers++;
  }
  return tg_pool.workers;
}

/* Run kernel `fn` once per part i < parts with `vals` (nvals of them) followed by bounds[i], bounds[i + 1], on this
   thread and up to threads - 1 workers; return when every part is done. Returns 0, or -1 when the arguments are out
   of range (nothing was run). A call while another is running (another Python thread) runs its parts alone. */
int tg_run_parts(tg_kernel fn, uintptr_t *bufs, const long long *vals, int nvals, const long long *bounds, int parts,
                 int threads) {
  if (nvals < 0 || nvals > TG_MAX_VALS || parts < 0 || parts > TG_MAX_PARTS) return -1;
  long long v[TG_MAX_VALS + 2];
  if (threads <= 1 || parts <= 1 || pthread_mutex_trylock(&tg_pool.busy) != 0) {
    memcpy(v, vals, sizeof(long long) * (size_t)nvals);
    for (int i = 0; i < parts; i++) {
      v[nvals] = bounds[i];
      v[nvals + 1] = bounds[i + 1];
      fn(bufs, v);
    }
    return 0;
  }
  if (tg_start(threads - 1) == 0) { /* no thread could be started: run here */
    pthread_mutex_unlock(&tg_pool.busy);
    return tg_run_parts(fn, bufs, vals, nvals, bounds, parts, 1);
  }
  tg_pool.fn = fn;
  tg_pool.bufs = bufs;
  tg_pool.vals = vals;
  tg_pool.nvals = nvals;
  tg_pool.bounds = bounds;
  __atomic_store_n(&tg_pool.done, 0, __ATOMIC_RELAXED);
  uint64_t gen = ((__atomic_load_n(&tg_pool.ticket, __ATOMIC_RELAXED) >> 32) + 1) & 0xFFFFFFFFu;
  __atomic_store_n(&tg_pool.ticket, (gen << 32) | ((uint64_t)parts << 16), __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&tg_pool.sleepers, __ATOMIC_SEQ_CST) > 0) {
    pthread_mutex_lock(&tg_pool.sleep_lock);
    pthread_cond_broadcast(&tg_pool.wake);
    pthread_mutex_unlock(&tg_pool.sleep_lock);
  }
  tg_take_parts(gen);
  /* the last parts' threads finish: a while of pauses, then yields (more threads than cores: one may wait its turn) */
  for (int spins = 0; __atomic_load_n(&tg_pool.done, __ATOMIC_ACQUIRE) < parts; spins++) {
    if (spins < 4096) TG_PAUSE();
    else sched_yield();
  }
  pthread_mutex_unlock(&tg_pool.busy);
  return 0;
}
"""
POOL_SRC = (
    _SRC.replace("@MAX_VALS@", str(MAX_VALS))
    .replace("@MAX_PARTS@", str(MAX_PARTS))
    .replace("@MAX_WORKERS@", str(MAX_WORKERS))
)

# (tg_kernel comes from the runtime's FFI)
_CDEF = """
int tg_run_parts(tg_kernel fn, uintptr_t *bufs, const long long *vals, int nvals, const long long *bounds, int parts,
                 int threads);
"""


_loaded: dict[int, Optional[Any]] = {}  # by id of the FFI (the runtime's one: it lives as long as the process)
_load_lock = threading.Lock()  # (Programs may be made on several threads at once: one build, one cdef)


def pool(ffi: Any) -> Optional[Any]:
    """The pool's library loaded through `ffi` (the runtime's FFI, whose tg_kernel type its calls take), or None
    (with a warning saying why) where CLANG's compiler cannot build it or this system cannot load it."""
    with _load_lock:
        if id(ffi) not in _loaded:
            _loaded[id(ffi)] = _load(ffi)
        return _loaded[id(ffi)]


def _load(ffi: Any) -> Optional[Any]:
    from tg_clang.compiler import ClangCompiler

    try:
        lib = ClangCompiler().compile_cached(POOL_SRC)
        ffi.cdef(_CDEF)
        fd, path = tempfile.mkstemp(prefix="pool-", suffix=".so", dir=process_folder())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lib)
            return ffi.dlopen(path)
        finally:
            os.unlink(path)  # the loaded library stays mapped
    except (CompileError, OSError) as e:
        warnings.warn(f"CLANG runs threaded kernels on Python threads: its thread pool did not build or load ({e})")
        return None
