#include "tools/slip-perf/spawn.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string_view>
#include <system_error>
#include <thread>

#include "tools/slip-perf/clock.h"

namespace slipperf {
namespace {

constexpr auto kWaitPoll = std::chrono::milliseconds(10);

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void ExecChild(const std::vector<char*>& argv, int out, int err, int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  dup2(out, STDOUT_FILENO);
  dup2(err, STDERR_FILENO);
  const int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  execv(argv[0], argv.data());
  _exit(127);
}

int OpenOutput(const std::string& path) {
  const int fd = path.empty() ? open("/dev/null", O_WRONLY | O_CLOEXEC)
                              : open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + path);
  return fd;
}

}  // namespace

Child::Child(const ChildSpec& spec) {
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out = OpenOutput(spec.stdout_path);
  const int err = OpenOutput(spec.stderr_path);
  pid_ = fork();
  if (pid_ == 0) ExecChild(argv, out, err, spec.cpu);
  const int fork_errno = errno;
  close(out);
  close(err);
  if (pid_ < 0) throw std::system_error(fork_errno, std::generic_category(), "fork");
}

Child::~Child() {
  if (Running()) {
    Signal(SIGKILL);
    Wait(UINT64_MAX);
  }
}

int Child::Wait(uint64_t timeout_ms) {
  const uint64_t deadline =
      NowNs() + std::min<uint64_t>(timeout_ms, UINT64_MAX / 2'000'000) * 1'000'000;
  while (Running()) {
    if (NowNs() > deadline) return -1;
    std::this_thread::sleep_for(kWaitPoll);
  }
  return status_;
}

bool Child::Running() {
  if (status_ >= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r < 0 && errno == EINTR) return true;
  status_ = r < 0                 ? 255
            : WIFEXITED(status)   ? WEXITSTATUS(status)
            : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                  : 255;
  return false;
}

void Child::Signal(int sig) {
  if (status_ < 0) kill(pid_, sig);
}

std::string SelfPath() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw std::system_error(errno, std::generic_category(), "readlink /proc/self/exe");
  std::string self(path, static_cast<size_t>(n));
  // Rebuilt while running: the kernel names the old file so; the new one is at the path.
  constexpr std::string_view kDeleted = " (deleted)";
  if (self.ends_with(kDeleted)) self.resize(self.size() - kDeleted.size());
  return self;
}

std::string SiblingPath(const std::string& name) {
  const std::string self = SelfPath();
  return self.substr(0, self.rfind('/') + 1) + name;
}

}  // namespace slipperf
