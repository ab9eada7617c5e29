#include "core/stats.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <string>

#include "core/log.h"
#include "core/sanitizer.h"
#include "core/sys.h"
#include "core/trusted_path.h"

namespace slip {
namespace {

// Other processes (slip-stat) read these through their own mapping.
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(StatsHeader) % alignof(ConnSlot) == 0, "slots follow the header");

constexpr size_t kFileSize = sizeof(StatsHeader) + kStatsSlots * sizeof(ConnSlot);

// All constant-initialised (no static constructors). g_mu guards claiming and the
// mapping's lifecycle; data-path counter updates never take it.
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
std::atomic<StatsHeader*> g_header{nullptr};
std::atomic<pid_t> g_owner{0};     // pid whose file is mapped
std::atomic<bool> g_armed{false};  // StatsInit called: create the file on first StatsOpen
char g_path[96];                   // that file
size_t g_populated = 0;            // bytes of the mapping known to be backed by tmpfs pages
uint32_t g_reuse_next = 0;         // where the next search for a closed slot starts

class Lock {
 public:
  Lock() { pthread_mutex_lock(&g_mu); }
  ~Lock() { pthread_mutex_unlock(&g_mu); }
};

// Stats calls sit on connect()/accept()/exit paths whose errno the application reads.
class KeepErrno {
 public:
  ~KeepErrno() { errno = saved_; }

 private:
  int saved_ = errno;
};

ConnSlot* Slots(StatsHeader* h) {
  return reinterpret_cast<ConnSlot*>(h + 1);
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

void ReadExe(char* out, size_t len) {
  ssize_t n = readlink("/proc/self/exe", out, len - 1);
  out[n > 0 ? n : 0] = '\0';
}

// Backs [0, end) of the mapping with real pages before it is written. On a full tmpfs a
// lazily faulted page would SIGBUS the host program; MADV_POPULATE_WRITE fails cleanly
// instead. Kernels before 5.14 lack it (EINVAL): then we fall back to lazy faulting.
bool Populate(StatsHeader* h, size_t end) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  end = (end + page - 1) / page * page;
  if (end <= g_populated) return true;
  char* base = reinterpret_cast<char*>(h);
  if (madvise(base + g_populated, end - g_populated, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    return false;
  }
  g_populated = end;
  return true;
}

// Takes the mapping away without munmap: slot pointers still held by other threads, or
// inherited across fork, then point at private zero pages instead of a hole, so a late
// StatsAddSent() can never fault. The stale range stays reserved (address space only).
void RetireLocked() {
  StatsHeader* h = g_header.exchange(nullptr, std::memory_order_acq_rel);
  if (h != nullptr) {
    // (At exit, a control thread may still be closing its slots: unordered by design.)
    san::UnorderedWrites replaced;
    mmap(h, kFileSize, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }
  g_populated = 0;
  g_reuse_next = 0;
}

// The file is named after the pid, which is how slip-stat finds it. /dev/shm is writable by
// every user, so another may have taken that name first (a file, a directory, a link): to
// deny us our stats, or to have its own shown as ours. A file of ours there was left by a
// dead process that had our pid (crashes skip StatsShutdown) and is replaced; anything
// else is left alone, and ours takes a name nobody can predict, "<name>.<random hex>",
// which slip-stat reads too (believing only files of the process's own uid).
int CreateFile(pid_t pid) {
  TrustedDir dir;
  PathVerdict verdict;
  if (!dir.Open(kStatsDir, 0, &verdict)) {
    SLIP_LOG(kWarn, "stats disabled: %s is not trusted: %s", kStatsDir, verdict.why);
    errno = EPERM;
    return -1;
  }
  constexpr int kCreate = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  char name[48];
  snprintf(name, sizeof(name), "%s%d", kStatsPrefix, static_cast<int>(pid));
  int fd = openat(dir.fd(), name, kCreate, 0600);
  struct stat st;
  if (fd < 0 && errno == EEXIST && fstatat(dir.fd(), name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISREG(st.st_mode) && st.st_uid == geteuid() && unlinkat(dir.fd(), name, 0) == 0) {
      fd = openat(dir.fd(), name, kCreate, 0600);
    } else {
      SLIP_LOG(kInfo, "stats: %s/%s belongs to uid %u; using another name", kStatsDir, name,
               unsigned(st.st_uid));
      errno = EEXIST;
    }
  }
  for (int attempt = 0; fd < 0 && errno == EEXIST && attempt < 8; ++attempt) {
    snprintf(name, sizeof(name), "%s%d.%016llx", kStatsPrefix, static_cast<int>(pid),
             static_cast<unsigned long long>(sys::RandomNonce()));
    fd = openat(dir.fd(), name, kCreate, 0600);
  }
  snprintf(g_path, sizeof(g_path), "%s/%s", kStatsDir, name);
  return fd;
}

void InitLocked() {
  RetireLocked();
  pid_t pid = getpid();
  // Growing the file past RLIMIT_FSIZE would raise SIGXFSZ and kill the host: no table.
  if (!sys::FileSizeAllows(kFileSize)) {
    g_armed.store(false, std::memory_order_relaxed);
    SLIP_LOG(kWarn, "stats disabled: the table needs %zu bytes, more than RLIMIT_FSIZE allows",
             kFileSize);
    return;
  }
  int fd = CreateFile(pid);
  if (fd < 0) {
    g_armed.store(false, std::memory_order_relaxed);  // do not retry on every connection
    SLIP_LOG(kWarn, "stats disabled: cannot create %s: %s", g_path, strerror(errno));
    return;
  }
  void* p = MAP_FAILED;
  if (sys::TruncateFitting(fd, kFileSize) == 0) {  // the limit may have dropped meanwhile
    p = mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  auto* h = static_cast<StatsHeader*>(p);
  bool ok = p != MAP_FAILED && Populate(h, sizeof(StatsHeader));
  int err = errno;
  sys::close(fd);
  if (!ok) {
    if (p != MAP_FAILED) munmap(p, kFileSize);  // never published: nobody holds pointers
    unlink(g_path);
    g_armed.store(false, std::memory_order_relaxed);
    SLIP_LOG(kWarn, "stats disabled: cannot map %s: %s", g_path, strerror(err));
    return;
  }
  h->version = kStatsVersion;
  h->pid = static_cast<uint32_t>(pid);
  h->slot_count = kStatsSlots;
  ReadExe(h->exe, sizeof(h->exe));
  std::atomic_ref<uint32_t>(h->magic).store(kStatsMagic, std::memory_order_release);
  g_owner.store(pid, std::memory_order_relaxed);
  g_header.store(h, std::memory_order_release);
}

// This process's table, created on first use: most processes under the shim (shells,
// fork-then-exec children) never open a connection, and a file they created would outlive
// them whenever they leave by _exit() or exec() without running StatsShutdown.
StatsHeader* TableLocked() {
  StatsHeader* h = g_header.load(std::memory_order_relaxed);
  if (h != nullptr && g_owner.load(std::memory_order_relaxed) == getpid()) return h;
  if (!g_armed.load(std::memory_order_relaxed)) return nullptr;
  InitLocked();  // retires a table inherited across fork first
  return g_header.load(std::memory_order_relaxed);
}

// The table to report from, without locking; none when it belongs to the parent of a
// forked child that never re-initialised.
StatsHeader* OwnTable() {
  StatsHeader* h = g_header.load(std::memory_order_acquire);
  return h != nullptr && g_owner.load(std::memory_order_relaxed) == getpid() ? h : nullptr;
}

// Never-used slots first (cheap, keeps history), then closed slots in round-robin order;
// a reused slot's record is lost (counted in `dropped`). Returns nullptr when all are open.
ConnSlot* ClaimLocked(StatsHeader* h) {
  ConnSlot* slots = Slots(h);
  uint32_t hw = h->high_water.load(std::memory_order_relaxed);
  if (hw < kStatsSlots && Populate(h, sizeof(StatsHeader) + (hw + 1) * sizeof(ConnSlot))) {
    h->high_water.store(hw + 1, std::memory_order_release);
    return &slots[hw];
  }
  for (uint32_t n = 0; n < hw; ++n) {
    uint32_t i = (g_reuse_next + n) % hw;
    if (slots[i].state.load(std::memory_order_relaxed) !=
        static_cast<uint32_t>(SlotState::kClosed)) {
      continue;
    }
    g_reuse_next = i + 1;
    h->dropped.fetch_add(1, std::memory_order_relaxed);
    // Readers must not take the half-rewritten slot for the old closed connection.
    slots[i].state.store(static_cast<uint32_t>(SlotState::kFree), std::memory_order_release);
    return &slots[i];
  }
  return nullptr;
}

bool OwnsSlot(StatsHeader* h, const ConnSlot* slot) {
  return h != nullptr && slot >= Slots(h) && slot < Slots(h) + kStatsSlots;
}

void CountReason(StatsHeader* h, Reason reason) {
  if (reason < Reason::kCount) {
    h->reason_counts[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
}

uint8_t LoadByte(uint8_t& b) {
  return std::atomic_ref<uint8_t>(b).load(std::memory_order_relaxed);
}
void StoreByte(uint8_t& b, uint8_t v) {
  std::atomic_ref<uint8_t>(b).store(v, std::memory_order_relaxed);
}

// Length of the valid UTF-8 sequence at s (n bytes available), 0 if invalid.
size_t Utf8Len(const unsigned char* s, size_t n) {
  unsigned char c = s[0], lo = 0x80, hi = 0xbf;
  size_t len;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    lo = c == 0xe0 ? 0xa0 : lo;  // overlong
    hi = c == 0xed ? 0x9f : hi;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    lo = c == 0xf0 ? 0x90 : lo;  // overlong
    hi = c == 0xf4 ? 0x8f : hi;  // above U+10FFFF
  } else {
    return 0;
  }
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if ((s[i] & 0xc0) != 0x80) return 0;
  }
  return len;
}

}  // namespace

// Paths are bytes, JSON is UTF-8: invalid sequences become U+FFFD so the line always parses.
void AppendJsonString(std::string* out, const char* s, size_t n) {
  *out += '"';
  for (size_t i = 0; i < n;) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = Utf8Len(reinterpret_cast<const unsigned char*>(s + i), n - i);
    if (c == '"' || c == '\\') {
      *out += '\\';
      *out += static_cast<char>(c);
    } else if (c == '\n' || c == '\t' || c == '\r') {
      *out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      snprintf(esc, sizeof(esc), "\\u%04x", c);
      *out += esc;
    } else if (len == 0) {
      *out += "\\ufffd";
    } else {
      out->append(s + i, len);
      i += len;
      continue;
    }
    ++i;
  }
  *out += '"';
}

namespace {

void AppendField(std::string* out, const char* key, const char* s, size_t n) {
  *out += ",\"";
  *out += key;
  *out += "\":";
  AppendJsonString(out, s, n);
}

void AppendField(std::string* out, const char* key, uint64_t v) {
  char num[24];
  auto end = std::to_chars(num, num + sizeof(num), v).ptr;
  *out += ",\"";
  *out += key;
  *out += "\":";
  out->append(num, end);
}

void AppendConnection(std::string* out, ConnSlot& slot) {
  auto reason = static_cast<Reason>(LoadByte(slot.reason));
  const char* reason_name = reason == Reason::kNone ? "" : ReasonName(reason);
  const char* transport = TransportName(static_cast<TransportKind>(LoadByte(slot.transport)));
  *out += "{\"local\":";  // first field without the leading comma
  AppendJsonString(out, slot.local, strnlen(slot.local, sizeof(slot.local)));
  AppendField(out, "remote", slot.remote, strnlen(slot.remote, sizeof(slot.remote)));
  AppendField(out, "transport", transport, strlen(transport));
  AppendField(out, "reason", reason_name, strlen(reason_name));
  // (Only where a transport has one: records of other connections stay as they were.)
  const size_t provider_len = strnlen(slot.provider, sizeof(slot.provider));
  if (provider_len != 0) AppendField(out, "provider", slot.provider, provider_len);
  AppendField(out, "bytes_sent", slot.bytes_sent.load(std::memory_order_relaxed));
  AppendField(out, "bytes_received", slot.bytes_received.load(std::memory_order_relaxed));
  *out += '}';
}

std::string BuildExitRecord(StatsHeader* h) {
  char exe_buf[sizeof(h->exe)];
  const char* exe = exe_buf;
  if (h != nullptr) {
    exe = h->exe;
  } else {
    ReadExe(exe_buf, sizeof(exe_buf));
  }
  uint32_t hw = h ? h->high_water.load(std::memory_order_acquire) : 0;
  std::string out;
  out.reserve(256 + size_t{hw} * 192);
  out += "{\"pid\":";
  out += std::to_string(getpid());
  AppendField(&out, "exe", exe, strnlen(exe, sizeof(exe_buf)));
  AppendField(&out, "dropped", h ? h->dropped.load(std::memory_order_relaxed) : 0);
  out += ",\"connections\":[";
  bool first = true;
  for (uint32_t i = 0; i < hw; ++i) {
    ConnSlot& slot = Slots(h)[i];
    uint32_t state = slot.state.load(std::memory_order_acquire);
    if (state != static_cast<uint32_t>(SlotState::kOpen) &&
        state != static_cast<uint32_t>(SlotState::kClosed)) {
      continue;
    }
    if (!first) out += ',';
    first = false;
    AppendConnection(&out, slot);
  }
  out += "]}\n";
  return out;
}

// Whole or not at all: a record cut by the file size limit would leave a line that does not
// parse, and one written past it would raise SIGXFSZ (EFBIG instead, sys::WriteFitting).
// The file is ours or none (core/trusted_path.h): never a link, a FIFO (which would hold the
// exit for its reader) or another user's file; *verdict says why not.
bool AppendToFile(const char* path, const std::string& data, PathVerdict* verdict) {
  int fd = OpenOwnFileForAppend(path, verdict);
  if (fd < 0) return false;
  bool ok = sys::WriteFitting(fd, data.data(), data.size());
  int err = errno;
  sys::close(fd);
  errno = err;
  return ok;
}

}  // namespace

const char* ReasonName(Reason r) noexcept {
  static constexpr const char* kNames[] = {"none",
                                           "peer_not_slipstream",
                                           "not_same_host",
                                           "policy",
                                           "disabled",
                                           "declined",
                                           "handshake_timeout",
                                           "resources",
                                           "connect_slow",
                                           "rendezvous_busy",
                                           "nonce_mismatch",
                                           "failover",
                                           "unsupported",
                                           "reuseport",
                                           "no_rdma_device",
                                           "no_rdma_path",
                                           "memlock",
                                           "exec",
                                           "untrusted_rendezvous",
                                           "fd_limit",
                                           "accepted_elsewhere",
                                           "short_lived",
                                           "kernel_feature"};
  static_assert(std::size(kNames) == static_cast<size_t>(Reason::kCount));
  auto i = static_cast<size_t>(r);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

void StatsInit() noexcept {
  g_armed.store(true, std::memory_order_relaxed);
}

void StatsReinitAfterFork() noexcept {
  KeepErrno keep;
  // The child has one thread; if another parent thread held the mutex at fork time it
  // would stay locked forever, so start from a fresh one.
  pthread_mutex_init(&g_mu, nullptr);
  Lock lock;
  RetireLocked();  // the child's own file comes with its first connection
}

ConnSlot* StatsOpen(TransportKind transport, Reason reason, int role, const sockaddr* local,
                    const sockaddr* remote, const char* provider) noexcept {
  KeepErrno keep;
  if (!g_armed.load(std::memory_order_relaxed)) return nullptr;
  char local_text[sizeof(ConnSlot::local)], remote_text[sizeof(ConnSlot::remote)];
  FormatSockaddr(local, local_text, sizeof(local_text));
  FormatSockaddr(remote, remote_text, sizeof(remote_text));
  return StatsOpenText(transport, reason, role, local_text, remote_text, provider);
}

ConnSlot* StatsOpenText(TransportKind transport, Reason reason, int role, const char* local,
                        const char* remote, const char* provider) noexcept {
  KeepErrno keep;
  if (!g_armed.load(std::memory_order_relaxed)) return nullptr;
  Lock lock;
  StatsHeader* h = TableLocked();
  if (h == nullptr) return nullptr;
  ConnSlot* slot = ClaimLocked(h);
  if (slot == nullptr) {
    h->dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  StoreByte(slot->transport, static_cast<uint8_t>(transport));
  StoreByte(slot->reason, static_cast<uint8_t>(reason));
  slot->role = role == 0 ? 0 : 1;
  snprintf(slot->local, sizeof(slot->local), "%s", local);
  snprintf(slot->remote, sizeof(slot->remote), "%s", remote);
  snprintf(slot->provider, sizeof(slot->provider), "%s", provider ? provider : "");
  for (auto* counter : {&slot->bytes_sent, &slot->bytes_received, &slot->msgs_sent,
                        &slot->msgs_received, &slot->closed_ns}) {
    counter->store(0, std::memory_order_relaxed);
  }
  slot->opened_ns = NowNs();
  CountReason(h, reason);
  slot->state.store(static_cast<uint32_t>(SlotState::kOpen), std::memory_order_release);
  return slot;
}

void StatsSetTransport(ConnSlot* slot, TransportKind transport, Reason reason) noexcept {
  if (slot == nullptr) return;
  StoreByte(slot->transport, static_cast<uint8_t>(transport));
  if (transport == TransportKind::kTcp) slot->provider[0] = '\0';  // (nothing carries TCP)
  if (LoadByte(slot->reason) == static_cast<uint8_t>(reason)) return;
  StoreByte(slot->reason, static_cast<uint8_t>(reason));
  // Slots inherited across fork belong to the parent's table: not ours to count.
  StatsHeader* h = OwnTable();
  if (OwnsSlot(h, slot)) CountReason(h, reason);
}

void StatsClose(ConnSlot* slot) noexcept {
  if (slot == nullptr) return;
  slot->closed_ns.store(NowNs(), std::memory_order_relaxed);
  slot->state.store(static_cast<uint32_t>(SlotState::kClosed), std::memory_order_release);
}

void StatsWriteExitRecord(const char* path) noexcept {
  if (path == nullptr || path[0] == '\0') return;
  // A process that never had a TCP connection (a shell, a helper) writes nothing.
  if (OwnTable() == nullptr) return;
  KeepErrno keep;
  // No lock: this may run at exit while another thread is stopped inside StatsOpen; the
  // slot states tell us what is complete.
  try {
    const std::string record = BuildExitRecord(OwnTable());
    PathVerdict verdict;
    if (AppendToFile(path, record, &verdict)) return;
    if (errno == EFBIG) {
      SLIP_LOG(kWarn, "stats not written: %zu more bytes would take %s past RLIMIT_FSIZE",
               record.size(), path);
    } else if (verdict.why[0]) {
      SLIP_LOG(kWarn, "SLIP_STATS_FILE %s not used: %s; stats not written", path, verdict.why);
    } else {
      SLIP_LOG(kWarn, "cannot append stats to SLIP_STATS_FILE %s: %s", path, strerror(errno));
    }
  } catch (const std::bad_alloc&) {
    SLIP_LOG(kWarn, "cannot write stats to %s: out of memory", path);
  }
}

void StatsShutdown() noexcept {
  KeepErrno keep;
  Lock lock;
  g_armed.store(false, std::memory_order_relaxed);
  // A forked child that never re-initialised must not remove its parent's file.
  if (OwnTable() != nullptr) unlink(g_path);
  RetireLocked();
}

void FormatSockaddr(const sockaddr* sa, char* out, size_t out_len) noexcept {
  if (out == nullptr || out_len == 0) return;
  IpEndpoint ep;
  char host[INET6_ADDRSTRLEN];
  if (!DecodeSockaddr(sa, &ep) || inet_ntop(ep.family, ep.addr, host, sizeof(host)) == nullptr) {
    snprintf(out, out_len, "?");
    return;
  }
  const char* fmt = ep.family == AF_INET6 ? "[%s]:%u" : "%s:%u";
  snprintf(out, out_len, fmt, host, static_cast<unsigned>(ep.port));
}

}  // namespace slip
