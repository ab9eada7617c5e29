#include "shm/msg_wire.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cstring>

#include "core/sys.h"

namespace slip::shm::msgwire {

namespace {

template <typename T>
uint8_t* Put(uint8_t* p, T v) noexcept {
  std::memcpy(p, &v, sizeof(v));
  return p + sizeof(v);
}
template <typename T>
const uint8_t* Get(const uint8_t* p, T* v) noexcept {
  std::memcpy(v, p, sizeof(*v));
  return p + sizeof(*v);
}

// Parses 32 hex digits with or without dashes (/proc/sys/kernel/random/boot_id).
bool ParseUuid(const char* text, size_t len, uint8_t out[16]) noexcept {
  size_t n = 0;
  for (size_t i = 0; i < len && n < 32; ++i) {
    const char c = text[i];
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v = c - 'A' + 10;
    else
      continue;
    out[n / 2] = uint8_t((n % 2 == 0) ? v << 4 : (out[n / 2] | v));
    ++n;
  }
  return n == 32;
}

}  // namespace

void EncodeHandle(const Handle& h, uint8_t out[msg::kHandleBytes]) noexcept {
  std::memset(out, 0, msg::kHandleBytes);
  uint8_t* p = out;
  p = Put(p, kHandleMagic);
  p = Put(p, kVersion);
  p = Put(p, h.flags);
  std::memcpy(p, h.host.bytes, kHostIdBytes);
  p += kHostIdBytes;
  p = Put(p, h.uid);
  p = Put(p, h.pid);
  p = Put(p, h.name_token);
  Put(p, h.secret);
}

bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept {
  if (len < kHandleWireBytes) return false;
  uint32_t magic;
  uint16_t version, flags;
  const uint8_t* p = Get(in, &magic);
  p = Get(p, &version);
  p = Get(p, &flags);
  if (magic != kHandleMagic || version != kVersion || (flags & ~kHandleInDir) != 0) return false;
  Handle h;
  h.flags = flags;
  std::memcpy(h.host.bytes, p, kHostIdBytes);
  p += kHostIdBytes;
  p = Get(p, &h.uid);
  p = Get(p, &h.pid);
  p = Get(p, &h.name_token);
  Get(p, &h.secret);
  if (h.secret == 0 || h.pid == 0) return false;
  *out = h;
  return true;
}

void EncodeHello(const Hello& h, uint8_t out[kHelloBytes]) noexcept {
  uint8_t* p = out;
  p = Put(p, kHelloMagic);
  p = Put(p, kVersion);
  p = Put(p, uint16_t(0));
  p = Put(p, h.secret);
  p = Put(p, h.region_nonce);
  p = Put(p, h.ring_size);
  Put(p, uint32_t(0));
}

bool ParseHello(const uint8_t* in, size_t len, Hello* out) noexcept {
  if (len != kHelloBytes) return false;
  uint32_t magic, pad;
  uint16_t version, flags;
  const uint8_t* p = Get(in, &magic);
  p = Get(p, &version);
  p = Get(p, &flags);
  if (magic != kHelloMagic || version != kVersion || flags != 0) return false;
  Hello h;
  p = Get(p, &h.secret);
  p = Get(p, &h.region_nonce);
  p = Get(p, &h.ring_size);
  Get(p, &pad);
  if (pad != 0 || h.secret == 0 || h.region_nonce == 0) return false;
  *out = h;
  return true;
}

bool ValidCts(const CtsRecord& r, uint32_t expected_seq, uint64_t max_capacity) noexcept {
  if (r.seq != expected_seq || r.count < 1 || r.count > msg::kMaxGroup) return false;
  for (int i = 0; i < r.count; ++i)
    if (r.entries[i].capacity > max_capacity) return false;
  return true;
}

bool HostId::SameBoot(const HostId& o) const noexcept {
  return std::memcmp(bytes, o.bytes, 16) == 0;
}

HostId ThisHost() noexcept {
  HostId id;
  char text[64] = {};
  const int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t n = read(fd, text, sizeof(text) - 1);
    if (n > 0) ParseUuid(text, size_t(n), id.bytes);
    sys::close(fd);
  }
  // Abstract AF_UNIX names are per network namespace: a handle from another one cannot
  // be reached even on this host.
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) {
    const uint64_t ino = st.st_ino;
    std::memcpy(id.bytes + 16, &ino, sizeof(ino));
  }
  return id;
}

}  // namespace slip::shm::msgwire
