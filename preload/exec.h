// exec support: inherited accelerated descriptors go back to TCP (see exec.cc).
#pragma once

#include <sys/types.h>

namespace slip::preload {

struct ExecPlan;

// Records this process's id (at start-up and in a fork child): exec from any other task
// sharing our memory (a vfork child) must not touch the parent's state.
void ExecNoteProcess() noexcept;
// True in a task that shares our memory but is another process: a vfork child (it runs
// no fork handlers). One system call.
bool InVforkChild() noexcept;
// This process's id as last noted (no system call; a vfork child sees its parent's).
pid_t NotedProcessId() noexcept;

// Around one exec call: the constructor hands inherited accelerated connections back to
// TCP (or gives their numbers a reset socket); the destructor, reached only when exec
// failed, puts back what can be put back.
class ExecGuard {
 public:
  ExecGuard() noexcept;
  ~ExecGuard();
  ExecGuard(const ExecGuard&) = delete;
  ExecGuard& operator=(const ExecGuard&) = delete;

 private:
  void HandBackAll() noexcept;

  ExecPlan* plan_ = nullptr;
};

}  // namespace slip::preload
