#include "shm/msg_wire.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cstring>

#include "core/byte_codec.h"
#include "core/sys.h"

namespace slip::shm::msgwire {

namespace {

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
  ByteWriter w(out, msg::kHandleBytes);
  w.U32(kHandleMagic);
  w.U16(kVersion);
  w.U16(h.flags);
  w.Bytes(h.host.bytes, kHostIdBytes);
  w.U32(h.uid);
  w.U32(h.pid);
  w.U64(h.name_token);
  w.U64(h.secret);
}

bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept {
  if (len < kHandleWireBytes) return false;
  ByteReader r(in, kHandleWireBytes);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  Handle h;
  h.flags = r.U16();
  if (magic != kHandleMagic || version != kVersion || (h.flags & ~kHandleInDir) != 0) return false;
  r.Bytes(h.host.bytes, kHostIdBytes);
  h.uid = r.U32();
  h.pid = r.U32();
  h.name_token = r.U64();
  h.secret = r.U64();
  if (!r.ok() || h.secret == 0 || h.pid == 0) return false;
  *out = h;
  return true;
}

void EncodeHello(const Hello& h, uint8_t out[kHelloBytes]) noexcept {
  ByteWriter w(out, kHelloBytes);
  w.U32(kHelloMagic);
  w.U16(kVersion);
  w.U16(0);  // flags
  w.U64(h.secret);
  w.U64(h.region_nonce);
  w.U32(h.ring_size);
  w.U32(0);  // reserved
}

bool ParseHello(const uint8_t* in, size_t len, Hello* out) noexcept {
  if (len != kHelloBytes) return false;
  ByteReader r(in, len);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  const uint16_t flags = r.U16();
  Hello h;
  h.secret = r.U64();
  h.region_nonce = r.U64();
  h.ring_size = r.U32();
  const uint32_t reserved = r.U32();
  if (!r.ok() || magic != kHelloMagic || version != kVersion || flags != 0 || reserved != 0 ||
      h.secret == 0 || h.region_nonce == 0)
    return false;
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
