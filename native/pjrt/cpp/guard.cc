// Calls into a PJRT plugin with C++ exceptions contained.
//
// PJRT plugins are C++ behind a C interface, and some of their functions let
// an exception escape (std::bad_variant_access on a mistyped option, an
// XLA flag parser that throws, std::bad_alloc). An exception that unwinds
// into Rust frames aborts the process, so every call into a plugin goes
// through one of these functions: they catch whatever is thrown on the
// calling thread and hand its message back instead.

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <typeinfo>

// A plugin may carry its own C++ runtime and unwinder, linked in statically
// (zml's builds do, with libc++). Its unwinder cannot run this file's catch
// clauses: the standard library's personality routine reads the unwinder's
// state with the process's unwinder functions, which do not know it (the
// process segfaults). Calls into such a plugin go through a trampoline whose
// frame has a personality routine of its own that uses no unwinder function:
// it claims every exception and jumps back here (see "Plugins with their
// own unwinder" below). Only Linux on x86_64 has the trampoline; elsewhere
// such a plugin is called as the others are.
#if defined(__linux__) && defined(__x86_64__)
#define PJRT_GUARD_ISOLATES 1
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <setjmp.h>
#include <unwind.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#else
#define PJRT_GUARD_ISOLATES 0
#endif

namespace {

// Copies `text` into `out` (at most `capacity` bytes, always terminated).
void copy_message(const char* text, char* out, std::size_t capacity) noexcept {
  if (out == nullptr || capacity == 0) return;
  if (text == nullptr) text = "";
  std::size_t length = std::strlen(text);
  if (length >= capacity) length = capacity - 1;
  std::memcpy(out, text, length);
  out[length] = '\0';
}

// Runs `body`; returns 0, or 1 with the message of what it threw in `what`.
template <typename Body>
int run_guarded(Body body, char* what, std::size_t capacity) noexcept {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), what, capacity);
  } catch (...) {
    copy_message("an exception that is not a std::exception", what, capacity);
  }
  return 1;
}

}  // namespace

// The shape of every PJRT C API function (and of the FFI extension's): one
// pointer to an argument struct in, one pointer (an error, or null) out.
typedef void* (*pjrt_function)(void* args);
// PJRT_Error_Destroy, PJRT_Error_Message, a serialized executable's deleter.
typedef void (*pjrt_procedure)(void* args);
// GetPjrtApi.
typedef const void* (*pjrt_getter)(void);

#if PJRT_GUARD_ISOLATES

// ## Plugins with their own unwinder
//
// Their code's address ranges are registered when they are loaded
// (`pjrt_guard_isolate`); a call to a function in one of them goes through
// `pjrt_guard_trampoline`, whose frame's personality routine is
// `pjrt_guard_personality`. In the unwinder's search phase it claims the
// exception; in its cleanup phase, once the plugin's own frames are cleaned
// up, it jumps (`_longjmp`) to the landing that `run_isolated` set, which
// frees the exception through the plugin's own cleanup function, as a
// catch of a foreign exception does.

extern "C" {
void* pjrt_guard_trampoline(pjrt_function f, void* args);
_Unwind_Reason_Code pjrt_guard_personality(int version, _Unwind_Action actions,
                                           _Unwind_Exception_Class exception_class,
                                           _Unwind_Exception* exception,
                                           _Unwind_Context* context)
    __attribute__((visibility("hidden")));
}

// void* pjrt_guard_trampoline(pjrt_function f, void* args): returns
// f(args), in a frame of its own whose personality is
// pjrt_guard_personality (through a pointer, as position-independent code
// names it).
asm(R"(
  .text
  .p2align 4
  .globl pjrt_guard_trampoline
  .hidden pjrt_guard_trampoline
  .type pjrt_guard_trampoline, @function
pjrt_guard_trampoline:
  .cfi_startproc
  .cfi_personality 0x9b, pjrt_guard_personality_ref
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  .cfi_def_cfa_register %rbp
  movq %rdi, %rax
  movq %rsi, %rdi
  callq *%rax
  popq %rbp
  .cfi_def_cfa %rsp, 8
  retq
  .cfi_endproc
  .size pjrt_guard_trampoline, .-pjrt_guard_trampoline

  .pushsection .data.rel.ro, "aw", @progbits
  .p2align 3
pjrt_guard_personality_ref:
  .quad pjrt_guard_personality
  .popsection
)");

namespace {

// Where the innermost isolated call on this thread lands.
struct Landing {
  jmp_buf jump;
  _Unwind_Exception* exception;
};

thread_local Landing* current_landing = nullptr;

// The code ranges of the plugins with their own unwinder. Plugins are never
// unloaded: ranges are only added, under the mutex, and read without it.
constexpr std::size_t kMaxIsolated = 16;
std::atomic<std::uintptr_t> isolated_start[kMaxIsolated];
std::atomic<std::uintptr_t> isolated_end[kMaxIsolated];
std::atomic<std::size_t> isolated_count{0};
std::mutex isolating;

bool isolated(const void* f) noexcept {
  auto address = reinterpret_cast<std::uintptr_t>(f);
  std::size_t count = isolated_count.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < count; i++) {
    if (address >= isolated_start[i].load(std::memory_order_relaxed) &&
        address < isolated_end[i].load(std::memory_order_relaxed))
      return true;
  }
  return false;
}

// "CLNGC++\0" and "GNUCC++\0": a primary exception of libc++abi or
// libstdc++, whose Itanium C++ ABI header ends with the unwind header; the
// thrown type's std::type_info is 80 bytes before it on LP64 targets, in
// both runtimes' layouts.
constexpr std::uint64_t kClangException = 0x434C4E47432B2B00;
constexpr std::uint64_t kGnuException = 0x474E5543432B2B00;

// Describes an exception that came through the trampoline: only its type
// can be read (its what() is a virtual function of the other runtime's
// objects, which may not derive from std::exception).
void describe(const _Unwind_Exception* exception, char* what, std::size_t capacity) noexcept {
  const char* prefix =
      "an exception thrown by a plugin with its own C++ runtime (its message cannot be read)";
  std::uint64_t exception_class = exception->exception_class;
  if (exception_class != kClangException && exception_class != kGnuException) {
    copy_message(prefix, what, capacity);
    return;
  }
  auto type = *reinterpret_cast<const std::type_info* const*>(
      reinterpret_cast<const char*>(exception) - 80);
  const char* mangled = type == nullptr ? nullptr : type->name();
  int status = -1;
  char* demangled = mangled == nullptr ? nullptr
                                       : abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  const char* name = status == 0 ? demangled : mangled;
  char message[512];
  std::snprintf(message, sizeof message, "%s of type %s", prefix, name ? name : "unknown");
  std::free(demangled);
  copy_message(message, what, capacity);
}

// Calls f(args) through the trampoline; returns 0, or 1 with the message in
// `what` when the plugin threw.
int run_isolated(pjrt_function f, void* args, void** result, char* what,
                 std::size_t capacity) noexcept {
  Landing landing;
  landing.exception = nullptr;
  Landing* const outer = current_landing;
  current_landing = &landing;
  if (_setjmp(landing.jump) == 0) {
    void* value = pjrt_guard_trampoline(f, args);
    current_landing = outer;
    if (result != nullptr) *result = value;
    return 0;
  }
  current_landing = outer;
  _Unwind_Exception* exception = landing.exception;
  describe(exception, what, capacity);
  // The thrower's own runtime frees its exception, as after a foreign catch.
  if (exception->exception_cleanup != nullptr)
    exception->exception_cleanup(_URC_FOREIGN_EXCEPTION_CAUGHT, exception);
  return 1;
}

struct Range {
  std::uintptr_t address, start, end;
};

// Sets the range of the loaded object whose segments hold `address`.
int find_range(dl_phdr_info* info, std::size_t, void* data) {
  auto* range = static_cast<Range*>(data);
  std::uintptr_t start = UINTPTR_MAX, end = 0;
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const auto& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD) continue;
    std::uintptr_t from = info->dlpi_addr + segment.p_vaddr;
    std::uintptr_t to = from + segment.p_memsz;
    if (range->address >= from && range->address < to) holds = true;
    if (from < start) start = from;
    if (to > end) end = to;
  }
  if (!holds) return 0;
  range->start = start;
  range->end = end;
  return 1;
}

}  // namespace

extern "C" _Unwind_Reason_Code pjrt_guard_personality(int, _Unwind_Action actions,
                                                      _Unwind_Exception_Class,
                                                      _Unwind_Exception* exception,
                                                      _Unwind_Context*) {
  if (actions & _UA_FORCE_UNWIND) return _URC_CONTINUE_UNWIND;
  if (actions & _UA_SEARCH_PHASE) return _URC_HANDLER_FOUND;
  Landing* landing = current_landing;
  landing->exception = exception;
  _longjmp(landing->jump, 1);
}

#endif  // PJRT_GUARD_ISOLATES

extern "C" {

// Calls `f(args)` and stores its result in `*result`.
int pjrt_guard_call(pjrt_function f, void* args, void** result, char* what,
                    std::size_t capacity) noexcept {
#if PJRT_GUARD_ISOLATES
  if (isolated(reinterpret_cast<const void*>(f)))
    return run_isolated(f, args, result, what, capacity);
#endif
  return run_guarded([&] { *result = f(args); }, what, capacity);
}

int pjrt_guard_call_void(pjrt_procedure f, void* args, char* what,
                         std::size_t capacity) noexcept {
#if PJRT_GUARD_ISOLATES
  // Returning a value the caller ignores is harmless on this target.
  if (isolated(reinterpret_cast<const void*>(f)))
    return run_isolated(reinterpret_cast<pjrt_function>(reinterpret_cast<void (*)(void)>(f)),
                        args, nullptr, what, capacity);
#endif
  return run_guarded([&] { f(args); }, what, capacity);
}

int pjrt_guard_get(pjrt_getter f, const void** result, char* what,
                   std::size_t capacity) noexcept {
  return run_guarded([&] { *result = f(); }, what, capacity);
}

// Decides whether the loaded plugin holding `symbol` unwinds with its own
// unwinder (it does not find the process's `_Unwind_RaiseException` among
// its libraries) and if so registers its code for isolated calls. Returns 1
// when it was registered, 0 when it uses the process's unwinder (or this
// target has no trampoline), -1 when it could not be registered.
int pjrt_guard_isolate(const void* symbol) noexcept {
#if PJRT_GUARD_ISOLATES
  Dl_info info;
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return -1;
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return -1;
  void* theirs = dlsym(handle, "_Unwind_RaiseException");
  dlclose(handle);
  if (theirs == reinterpret_cast<void*>(&_Unwind_RaiseException)) return 0;
  Range range{reinterpret_cast<std::uintptr_t>(symbol), 0, 0};
  if (dl_iterate_phdr(find_range, &range) == 0) return -1;
  std::lock_guard<std::mutex> lock(isolating);
  std::size_t count = isolated_count.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < count; i++)
    if (isolated_start[i].load(std::memory_order_relaxed) == range.start) return 1;
  if (count == kMaxIsolated) return -1;
  isolated_start[count].store(range.start, std::memory_order_relaxed);
  isolated_end[count].store(range.end, std::memory_order_relaxed);
  isolated_count.store(count + 1, std::memory_order_release);
  return 1;
#else
  (void)symbol;
  return 0;
#endif
}

#if PJRT_GUARD_ISOLATES
// For tests: calls `f(args)` as a call into an isolated plugin is made.
int pjrt_guard_call_isolated(pjrt_function f, void* args, void** result, char* what,
                             std::size_t capacity) noexcept {
  return run_isolated(f, args, result, what, capacity);
}
#endif

}  // extern "C"
