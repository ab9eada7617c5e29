#include "tools/slip-stat/stats_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/stats.h"
#include "tools/slip-stat/bus_guard.h"

namespace slipstat {
namespace {

using slip::ConnSlot;
using slip::StatsHeader;

constexpr size_t kMaxFileSize = sizeof(StatsHeader) + slip::kStatsSlots * sizeof(ConnSlot);
constexpr uint32_t kOpen = static_cast<uint32_t>(slip::SlotState::kOpen);
constexpr uint32_t kClosed = static_cast<uint32_t>(slip::SlotState::kClosed);

// The owner updates these fields with atomic_ref stores. atomic_ref wants a mutable object,
// but a load never writes, so it is safe on the read-only mapping.
template <typename T>
T Load(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_relaxed);
}

const ConnSlot* Slots(const StatsHeader* h) {
  return reinterpret_cast<const ConnSlot*>(h + 1);
}

FileResult Invalid(std::string message) {
  return {FileStatus::kInvalid, std::move(message)};
}

FileResult FromErrno(int err, const char* what) {
  if (err == ENOENT) return {FileStatus::kGone, {}};
  if (err == EACCES || err == EPERM) return {FileStatus::kNoAccess, strerror(err)};
  if (err == ELOOP) return Invalid("is a symbolic link");
  return Invalid(std::string(what) + ": " + strerror(err));
}

// Plain copies of what the guarded functions read: filling them needs no allocation.
struct HeaderFields {
  uint32_t magic, version, pid, slot_count;
};

struct HeaderCopy {
  const StatsHeader* header;
  HeaderFields fields;
};

struct TableCopy {
  const StatsHeader* header;
  uint32_t slot_count;
  uint32_t high_water;
  uint64_t dropped;
  uint64_t reason_counts[static_cast<int>(slip::Reason::kCount)];
  char exe[sizeof(StatsHeader::exe)];
};

struct SlotCopy {
  bool valid;  // open or closed, and not reused while it was copied
  uint32_t state;
  uint8_t transport, reason, role;
  char local[sizeof(ConnSlot::local)];
  char remote[sizeof(ConnSlot::remote)];
  char provider[sizeof(ConnSlot::provider)];
  uint64_t bytes_sent, bytes_received, msgs_sent, msgs_received, opened_ns, closed_ns;
};

struct SlotsCopy {
  const ConnSlot* slots;
  std::vector<SlotCopy>* out;  // sized before the guarded call
};

void CopyHeaderFields(void* ctx) {
  auto* c = static_cast<HeaderCopy*>(ctx);
  const StatsHeader* h = c->header;
  // The owner publishes magic last (release): what precedes it is complete once it shows.
  c->fields.magic =
      std::atomic_ref<uint32_t>(const_cast<uint32_t&>(h->magic)).load(std::memory_order_acquire);
  c->fields.version = Load(h->version);
  c->fields.pid = Load(h->pid);
  c->fields.slot_count = Load(h->slot_count);
}

void CopyTable(void* ctx) {
  auto* c = static_cast<TableCopy*>(ctx);
  const StatsHeader* h = c->header;
  c->high_water = std::min(h->high_water.load(std::memory_order_acquire), c->slot_count);
  c->dropped = h->dropped.load(std::memory_order_relaxed);
  for (size_t i = 0; i < std::size(c->reason_counts); ++i) {
    c->reason_counts[i] = h->reason_counts[i].load(std::memory_order_relaxed);
  }
  memcpy(c->exe, h->exe, sizeof(c->exe));
}

// A slot is rewritten only while its state is kFree (see ClaimLocked in core/stats.cc), so
// a copy framed by two reads of state and opened_ns that show no reuse is one connection.
void CopySlot(const ConnSlot& s, SlotCopy* out) {
  uint32_t before = s.state.load(std::memory_order_acquire);
  uint64_t opened = Load(s.opened_ns);
  out->valid = false;
  if (before != kOpen && before != kClosed) return;
  out->transport = Load(s.transport);
  out->reason = Load(s.reason);
  out->role = Load(s.role);
  memcpy(out->local, s.local, sizeof(out->local));
  memcpy(out->remote, s.remote, sizeof(out->remote));
  memcpy(out->provider, s.provider, sizeof(out->provider));
  out->bytes_sent = s.bytes_sent.load(std::memory_order_relaxed);
  out->bytes_received = s.bytes_received.load(std::memory_order_relaxed);
  out->msgs_sent = s.msgs_sent.load(std::memory_order_relaxed);
  out->msgs_received = s.msgs_received.load(std::memory_order_relaxed);
  out->closed_ns = s.closed_ns.load(std::memory_order_relaxed);
  out->opened_ns = opened;
  std::atomic_thread_fence(std::memory_order_acquire);
  uint32_t after = s.state.load(std::memory_order_relaxed);
  out->state = after;
  out->valid =
      (after == before || (before == kOpen && after == kClosed)) && Load(s.opened_ns) == opened;
}

void CopySlots(void* ctx) {
  auto* c = static_cast<SlotsCopy*>(ctx);
  for (size_t i = 0; i < c->out->size(); ++i) CopySlot(c->slots[i], &(*c->out)[i]);
}

std::string Bounded(const char* s, size_t size) {
  return std::string(s, strnlen(s, size));
}

Connection ToConnection(const SlotCopy& s) {
  Connection c;
  c.open = s.state == kOpen;
  c.transport = slip::TransportName(static_cast<slip::TransportKind>(s.transport));
  auto reason = static_cast<slip::Reason>(s.reason);
  c.reason = reason == slip::Reason::kNone ? "" : slip::ReasonName(reason);
  c.local = Bounded(s.local, sizeof(s.local));
  c.remote = Bounded(s.remote, sizeof(s.remote));
  c.provider = Bounded(s.provider, sizeof(s.provider));
  c.role = s.role <= 1 ? s.role : -1;
  c.bytes_sent = s.bytes_sent;
  c.bytes_received = s.bytes_received;
  c.msgs_sent = s.msgs_sent;
  c.msgs_received = s.msgs_received;
  c.opened_ns = s.opened_ns;
  c.closed_ns = s.closed_ns;
  return c;
}

std::string Hex(uint32_t v) {
  char text[16];
  snprintf(text, sizeof(text), "0x%08x", v);
  return text;
}

// What is wrong with a header, judged on a copy of its fields; kOk when nothing is.
FileResult CheckHeader(const HeaderFields& f, pid_t pid, size_t file_size) {
  if (f.magic == 0) return {FileStatus::kNotReady, {}};
  if (f.magic != slip::kStatsMagic) {
    return Invalid("bad magic " + Hex(f.magic) + ", expected " + Hex(slip::kStatsMagic));
  }
  if (f.version != slip::kStatsVersion) {
    return Invalid("format version " + std::to_string(f.version) + ", this slip-stat reads " +
                   std::to_string(slip::kStatsVersion));
  }
  if (f.pid != static_cast<uint32_t>(pid)) {
    return Invalid("header names pid " + std::to_string(f.pid));
  }
  if (f.slot_count == 0 || f.slot_count > slip::kStatsSlots) {
    return Invalid("slot count " + std::to_string(f.slot_count) + " outside 1.." +
                   std::to_string(slip::kStatsSlots));
  }
  if (sizeof(StatsHeader) + size_t{f.slot_count} * sizeof(ConnSlot) > file_size) {
    return Invalid("truncated: " + std::to_string(file_size) + " bytes for " +
                   std::to_string(f.slot_count) + " slots");
  }
  return {};
}

// Open has many ways out; each must close the descriptor.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

StatsFile::~StatsFile() {
  if (header_ != nullptr) munmap(const_cast<StatsHeader*>(header_), map_len_);
}

FileResult StatsFile::Open(const std::string& path, pid_t pid) {
  // O_NOFOLLOW and O_NONBLOCK: a planted symlink or FIFO must neither redirect nor block us.
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) return FromErrno(errno, "open");
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return FromErrno(errno, "fstat");
  if (!S_ISREG(st.st_mode)) return Invalid("not a regular file");
  auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return {FileStatus::kNotReady, {}};
  if (size < sizeof(StatsHeader)) {
    return Invalid("truncated: " + std::to_string(size) + " bytes, the header alone is " +
                   std::to_string(sizeof(StatsHeader)));
  }
  size_t map_len = std::min(size, kMaxFileSize);
  void* p = mmap(nullptr, map_len, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return FromErrno(errno, "mmap");
  HeaderCopy copy{static_cast<const StatsHeader*>(p), {}};
  FileResult result = RunGuarded(CopyHeaderFields, &copy) ? CheckHeader(copy.fields, pid, size)
                                                          : Invalid("truncated while being read");
  if (result.status != FileStatus::kOk) {
    munmap(p, map_len);
    return result;
  }
  if (header_ != nullptr) munmap(const_cast<StatsHeader*>(header_), map_len_);
  header_ = copy.header;
  map_len_ = map_len;
  slot_count_ = copy.fields.slot_count;
  pid_ = pid;
  return result;
}

FileResult StatsFile::Read(Process* out) const {
  if (header_ == nullptr) return Invalid("not open");
  TableCopy table{};
  table.header = header_;
  table.slot_count = slot_count_;
  if (!RunGuarded(CopyTable, &table)) return Invalid("truncated while being read");
  std::vector<SlotCopy> slots(table.high_water);  // allocated outside the guarded call
  SlotsCopy copy{Slots(header_), &slots};
  if (!RunGuarded(CopySlots, &copy)) return Invalid("truncated while being read");
  Process p;
  p.pid = pid_;
  p.exe = Bounded(table.exe, sizeof(table.exe));
  p.dropped = table.dropped;
  p.reason_counts.assign(std::begin(table.reason_counts), std::end(table.reason_counts));
  for (const SlotCopy& s : slots) {
    if (s.valid) p.connections.push_back(ToConnection(s));
  }
  *out = std::move(p);
  return {};
}

FileResult ReadStatsFile(const std::string& path, pid_t pid, Process* out) {
  StatsFile file;
  FileResult result = file.Open(path, pid);
  return result.status == FileStatus::kOk ? file.Read(out) : result;
}

}  // namespace slipstat
