// The hooks that g++/clang++ -fsanitize=thread put before every load and store,
// defined here instead of by libtsan (which is never linked): each one passes
// the address, size, kind and the instrumented code's return address to the
// checks of the emulation (checks.h). Compiled without -fsanitize; linked into
// every checked kernel library (with -z defs: a hook missing here is a link error).
#include <stddef.h>

#define HOOK extern "C" __attribute__((visibility("hidden")))

HOOK void kda_emu_access(void* p, unsigned n, unsigned fl, void* pc);
HOOK void kda_emu_func_entry(void* caller);
HOOK void kda_emu_func_exit();
extern "C" __attribute__((visibility("hidden"))) int kda_emu_prof_live;  // profiled launches running

enum : unsigned { WRITE = 1, NATURAL = 2 };  // as AC_WRITE, AC_NATURAL in checks.h

HOOK void __tsan_init() {}
HOOK void __tsan_func_entry(void* caller) {  // the issue anchors' calling context (profile.h)
  if (__atomic_load_n(&kda_emu_prof_live, __ATOMIC_RELAXED)) kda_emu_func_entry(caller);
}
HOOK void __tsan_func_exit() {
  if (__atomic_load_n(&kda_emu_prof_live, __ATOMIC_RELAXED)) kda_emu_func_exit();
}
HOOK void __tsan_vptr_update(void**, void*) {}
HOOK void __tsan_vptr_read(void**) {}

#define SIZED(N)                                                                                       \
  HOOK void __tsan_read##N(void* p) { kda_emu_access(p, N, NATURAL, __builtin_return_address(0)); }    \
  HOOK void __tsan_write##N(void* p) { kda_emu_access(p, N, WRITE | NATURAL, __builtin_return_address(0)); } \
  HOOK void __tsan_volatile_read##N(void* p) { kda_emu_access(p, N, NATURAL, __builtin_return_address(0)); } \
  HOOK void __tsan_volatile_write##N(void* p) {                                                        \
    kda_emu_access(p, N, WRITE | NATURAL, __builtin_return_address(0));                                \
  }                                                                                                    \
  HOOK void __tsan_unaligned_read##N(void* p) { kda_emu_access(p, N, 0, __builtin_return_address(0)); } \
  HOOK void __tsan_unaligned_write##N(void* p) { kda_emu_access(p, N, WRITE, __builtin_return_address(0)); }
SIZED(1)
SIZED(2)
SIZED(4)
SIZED(8)
SIZED(16)

HOOK void __tsan_read_range(void* p, size_t n) { kda_emu_access(p, (unsigned)n, 0, __builtin_return_address(0)); }
HOOK void __tsan_write_range(void* p, size_t n) {
  kda_emu_access(p, (unsigned)n, WRITE, __builtin_return_address(0));
}
