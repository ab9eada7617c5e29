#include "tools/slip-stat/scan.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "tools/slip-stat/format.h"
#include "tools/slip-stat/stats_file.h"

namespace slipstat {
namespace {

// The pid in a stats file's name, 0 if the name is not one: the prefix, the pid in decimal
// (no leading zero), and maybe "." and 16 hex digits (the name the core takes when another
// user holds the plain one). Nothing else counts, so that no other name can pose as one.
pid_t PidOfName(std::string_view name) {
  std::string_view prefix = kStatsPrefix;
  if (!name.starts_with(prefix)) return 0;
  std::string_view digits = name.substr(prefix.size());
  int pid = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (ec != std::errc() || pid <= 0 || digits[0] == '0') return 0;
  std::string_view rest(end, static_cast<size_t>(digits.data() + digits.size() - end));
  if (rest.empty()) return pid;
  constexpr size_t kSuffix = 1 + 16;
  if (rest.size() != kSuffix || rest[0] != '.') return 0;
  for (char c : rest.substr(1)) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) ||
        std::isupper(static_cast<unsigned char>(c)))
      return 0;
  }
  return pid;
}

// The uids of process `pid` (real, effective, saved, filesystem), from /proc/<pid>/status;
// empty when that cannot be read.
std::vector<uid_t> ProcessUids(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("Uid:")) continue;
    std::vector<uid_t> uids;
    std::istringstream fields(line.substr(4));
    unsigned long uid;
    while (fields >> uid) uids.push_back(static_cast<uid_t>(uid));
    return uids;
  }
  return {};
}

bool Wanted(const ScanOptions& options, pid_t pid) {
  return options.pids.empty() ||
         std::find(options.pids.begin(), options.pids.end(), pid) != options.pids.end();
}

// A zombie no longer runs, but kill() still finds it until its parent reaps it. A zombie
// leader whose other threads still run has them listed under task/.
bool IsZombie(pid_t pid) {
  std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream stat(proc + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || line.compare(paren, 3, ") Z") != 0) return false;
  std::error_code ec;
  auto tasks = std::filesystem::directory_iterator(proc + "/task", ec);
  return !ec && std::distance(tasks, std::filesystem::directory_iterator()) == 1;
}

// EPERM means the process exists but belongs to someone else: alive.
bool ProcessGone(pid_t pid) {
  return (kill(pid, 0) != 0 && errno == ESRCH) || IsZombie(pid);
}

// The program `pid` runs now; "" when that cannot be told (another user's process).
std::string RunningExe(pid_t pid) {
  char link[64], target[PATH_MAX];
  snprintf(link, sizeof(link), "/proc/%d/exe", static_cast<int>(pid));
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return {};
  std::string exe(target, static_cast<size_t>(n));
  // A program rebuilt while it runs is still the program that wrote the file.
  constexpr std::string_view kDeleted = " (deleted)";
  if (exe.ends_with(kDeleted)) exe.resize(exe.size() - kDeleted.size());
  return exe;
}

// Removes `path` only while it is still the file examined: a new process given the same pid
// may have replaced it meanwhile (the core recreates its file when it finds one).
bool RemoveIfSame(const std::string& path, const struct stat& seen) {
  struct stat now;
  return lstat(path.c_str(), &now) == 0 && now.st_ino == seen.st_ino && now.st_dev == seen.st_dev &&
         unlink(path.c_str()) == 0;
}

std::vector<std::pair<pid_t, std::string>> ListFiles(const ScanOptions& options,
                                                     std::vector<std::string>* notes) {
  std::vector<std::pair<pid_t, std::string>> files;
  DIR* dir = opendir(options.dir.c_str());
  if (dir == nullptr) {
    if (errno != ENOENT) notes->push_back("cannot list " + options.dir + ": " + strerror(errno));
    return files;
  }
  while (const dirent* entry = readdir(dir)) {
    pid_t pid = PidOfName(entry->d_name);
    if (pid != 0 && Wanted(options, pid)) files.emplace_back(pid, entry->d_name);
  }
  closedir(dir);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ScanResult Scan(const ScanOptions& options) {
  ScanResult result;
  size_t not_readable = 0;
  struct Found {
    Process process;
    timespec changed;  // the file's ctime: of two for one pid, the newer is the process's
  };
  std::vector<Found> found;
  for (const auto& [pid, name] : ListFiles(options, &result.notes)) {
    std::string path = options.dir + "/" + name;
    struct stat seen;
    if (lstat(path.c_str(), &seen) != 0) continue;  // its process has just exited
    if (ProcessGone(pid)) {
      if (RemoveIfSame(path, seen) && options.clean) {
        result.notes.push_back("removed " + path + ": process " + std::to_string(pid) +
                               " has exited");
      }
      continue;
    }
    // Anybody may create files in /dev/shm: a file is the process's only if one of the
    // process's uids made it (a forged one would show another user's connections as its).
    const std::vector<uid_t> uids = ProcessUids(pid);
    if (uids.empty()) continue;  // (gone meanwhile)
    if (std::find(uids.begin(), uids.end(), seen.st_uid) == uids.end()) {
      result.notes.push_back("skipped " + path + ": made by uid " + std::to_string(seen.st_uid) +
                             ", not by process " + std::to_string(pid) + "'s uid " +
                             std::to_string(uids.size() > 1 ? uids[1] : uids[0]));
      continue;
    }
    Process process;
    FileResult read = ReadStatsFile(path, pid, &process);
    if (read.status == FileStatus::kNoAccess) ++not_readable;
    if (read.status == FileStatus::kInvalid) {
      result.notes.push_back("skipped " + path + ": " + read.message);
    }
    if (read.status != FileStatus::kOk) continue;
    // The pid was reused: the file is from an earlier program (one that exec'd, or crashed)
    // and no longer counts anything.
    std::string running = RunningExe(pid);
    if (!running.empty() && !process.exe.empty() && running != process.exe) {
      bool removed = options.clean && RemoveIfSame(path, seen);
      result.notes.push_back((removed ? "removed " : "skipped ") + path + ": stale, written by " +
                             process.exe + " but pid " + std::to_string(pid) + " now runs " +
                             running + (options.clean ? "" : " (--clean removes it)"));
      continue;
    }
    // (Two files of one pid and uid: one left by a crash of an earlier process of that pid.)
    auto same = std::find_if(found.begin(), found.end(),
                             [&](const Found& f) { return f.process.pid == pid; });
    Found here{std::move(process), seen.st_ctim};
    if (same == found.end()) {
      found.push_back(std::move(here));
    } else if (std::tie(here.changed.tv_sec, here.changed.tv_nsec) >
               std::tie(same->changed.tv_sec, same->changed.tv_nsec)) {
      *same = std::move(here);
    }
  }
  for (Found& f : found) result.processes.push_back(std::move(f.process));
  if (not_readable > 0) {
    result.notes.push_back(Plural(not_readable, "stats file", "stats files") +
                           " of other users not readable: run as root to see every process");
  }
  return result;
}

}  // namespace slipstat
