#include "tools/slip-stat/bus_guard.h"

#include <setjmp.h>
#include <signal.h>

namespace slipstat {
namespace {

thread_local sigjmp_buf* t_jump = nullptr;  // set while a guarded call runs on this thread
struct sigaction g_previous;

void OnSigbus(int sig, siginfo_t* info, void*) {
  if (sigjmp_buf* jump = t_jump; jump != nullptr && info->si_code > 0) {
    t_jump = nullptr;
    siglongjmp(*jump, 1);
  }
  // Not ours: hand the signal to whoever had it. A fault re-raises itself when the
  // instruction runs again; a sent signal must be sent again.
  sigaction(SIGBUS, &g_previous, nullptr);
  if (info->si_code <= 0) raise(sig);
}

bool Install() {
  struct sigaction action = {};
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  return sigaction(SIGBUS, &action, &g_previous) == 0;
}

}  // namespace

bool RunGuarded(void (*fn)(void*), void* ctx) noexcept {
  static const bool installed = Install();
  if (!installed) {  // cannot happen for a valid signal number; run unguarded then
    fn(ctx);
    return true;
  }
  sigjmp_buf jump;
  // savemask: the jump leaves the handler, whose signal would otherwise stay blocked.
  if (sigsetjmp(jump, 1) != 0) return false;
  t_jump = &jump;
  fn(ctx);
  t_jump = nullptr;
  return true;
}

}  // namespace slipstat
