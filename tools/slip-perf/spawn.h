// Child processes for compare: a slip-perf server, client or native run, plain or under
// slip-run (which execs the program, so the child's pid is the program's), its output in
// files. Children stay in compare's process group, so that a Ctrl-C reaches them too.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slipperf {

struct ChildSpec {
  std::vector<std::string> argv;
  std::string stdout_path;  // "" = /dev/null
  std::string stderr_path;
  int cpu = -1;  // >= 0: runs on that CPU only
};

class Child {
 public:
  explicit Child(const ChildSpec& spec);  // throws when it cannot start
  ~Child();                               // kills the child if it still runs
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // The exit status (a signal N gives 128 + N), or -1 if it still runs after `timeout_ms`.
  int Wait(uint64_t timeout_ms);
  bool Running();
  void Signal(int sig);

 private:
  pid_t pid_ = -1;
  int status_ = -1;  // once reaped
};

// This executable, and a program in the same directory (build/bin/slip-run).
std::string SelfPath();
std::string SiblingPath(const std::string& name);

}  // namespace slipperf
