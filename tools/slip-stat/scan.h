// Finding the processes under Slipstream: every stats file in /dev/shm, read with
// stats_file.h, with the files that no longer belong to a running Slipstream process
// (stale) set aside.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tools/slip-stat/model.h"

namespace slipstat {

constexpr const char* kStatsDir = "/dev/shm";
constexpr const char* kStatsPrefix = "slipstream-stats.";  // + pid (core/stats.cc)

struct ScanOptions {
  std::string dir = kStatsDir;
  std::vector<pid_t> pids;  // only these processes; empty: all
  // A file whose process is gone is always removed (it would otherwise stay until reboot:
  // crashes skip the core's cleanup). With `clean`, so is a file whose pid now runs
  // another program, and each removal is noted.
  bool clean = false;
};

struct ScanResult {
  std::vector<Process> processes;  // by pid
  std::vector<std::string> notes;  // one line each: files skipped or removed, and why
};

ScanResult Scan(const ScanOptions& options);

}  // namespace slipstat
