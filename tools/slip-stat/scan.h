// Finding the processes under Slipstream: every stats file in /dev/shm, read with
// stats_file.h, with the files that no longer belong to a running Slipstream process
// (stale), or that are not the process's own (another user's: /dev/shm is writable by
// all), set aside.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "core/stats.h"
#include "tools/slip-stat/model.h"

namespace slipstat {

using slip::kStatsDir;     // core/stats.h
using slip::kStatsPrefix;  // + pid, or + pid "." 16 hex digits (core/stats.cc)

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
