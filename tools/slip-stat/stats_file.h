// One live stats file, /dev/shm/slipstream-stats.<pid> (layout: core/stats.h), read as
// untrusted input: it may be half-created, left by a crash, written by another version,
// or garbage. Everything is checked against the file's real size before it is touched,
// strings are bounded, and a file shrunk while mapped is survived (bus_guard.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "tools/slip-stat/model.h"

namespace slip {
struct StatsHeader;
}

namespace slipstat {

enum class FileStatus {
  kOk,
  kNotReady,  // being created: empty, or the header not yet published (skip quietly)
  kGone,      // removed since it was listed (its process exited)
  kNoAccess,  // another user's process
  kInvalid,   // not a stats file this slip-stat can read; the message says why
};

struct FileResult {
  FileStatus status = FileStatus::kOk;
  std::string message;  // for kInvalid (and errors): what is wrong with the file
};

// A read-only mapping of one stats file whose header has been validated.
class StatsFile {
 public:
  StatsFile() = default;
  StatsFile(const StatsFile&) = delete;
  StatsFile& operator=(const StatsFile&) = delete;
  ~StatsFile();

  // Opens, maps and validates `path`, which must belong to process `pid` (the number in
  // its name). On anything but kOk the object stays closed.
  FileResult Open(const std::string& path, pid_t pid);

  // Copies out the header and every open or closed slot. A slot being reused while it is
  // read is left out. Fails (kInvalid) if the file was shrunk since Open.
  FileResult Read(Process* out) const;

 private:
  const slip::StatsHeader* header_ = nullptr;
  size_t map_len_ = 0;
  unsigned slot_count_ = 0;
  pid_t pid_ = 0;
};

// Open and Read in one go.
FileResult ReadStatsFile(const std::string& path, pid_t pid, Process* out);

}  // namespace slipstat
