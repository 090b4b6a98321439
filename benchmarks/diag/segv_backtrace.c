// LD_PRELOAD helper for device-check diagnostics (benchmarks/device_check.sh, stage diag): on a fatal
// signal, print the native call stack (glibc backtrace) to stderr, then die of the same signal.
// Python's faulthandler (-X faulthandler) shows only Python frames; this shows the C/C++ frames
// (symbolize_backtrace.sh maps the ones in ops/_C.abi3.so to functions and lines).
//   gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so segv_backtrace.c
//   LD_PRELOAD=/tmp/segv_backtrace.so python3 -X faulthandler -c '...'
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal_signal(int sig) {
  static const char header[] = "\n=== native backtrace (segv_backtrace.so) ===\n";
  void* frames[128];
  const int count = backtrace(frames, 128);
  (void)!write(STDERR_FILENO, header, sizeof header - 1);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install_handlers(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_fatal_signal;
  sigemptyset(&action.sa_mask);
  const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; ++i) sigaction(signals[i], &action, NULL);
}
