// What a registration carries, validated once (shm.h, AcceptRegistration), and the table
// entry a listener keeps for it (Registration).
//
// The descriptors come from a process we do not trust: each is checked for what it must
// be, and the region's header is read once, right after mapping, and never again.
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/region_file.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

void CloseAll(int* fds, int n) noexcept {
  for (int i = 0; i < n; ++i) {
    sys::CloseHandedOver(fds[i]);  // (the client's: maybe not what it claims to be)
    fds[i] = -1;
  }
}

bool IsUnixStream(int fd, uint64_t* inode) noexcept {
  struct stat st;
  int domain = 0, type = 0;
  socklen_t len = sizeof(int);
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  if (sys::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX)
    return false;
  len = sizeof(int);
  if (sys::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
    return false;
  *inode = st.st_ino;
  return true;
}

// A and B must be the two ends of one socketpair: the proxy's readiness (tokens written on
// B, EOF when B shuts down) reaches the application only through A. Two ends of different
// pairs would leave a reader asleep after the peer died.
bool IsProxyPair(int a, int b) noexcept {
  // unix_diag answers for AF_UNIX sockets only, with their type: A is a stream socket
  // whose peer is B (a socket's inode is its own: B is then one too).
  struct stat a_st, b_st;
  uint64_t peer = 0;
  int type = 0;
  return fstat(a, &a_st) == 0 && S_ISSOCK(a_st.st_mode) && fstat(b, &b_st) == 0 &&
         S_ISSOCK(b_st.st_mode) && UnixPeer(a_st.st_ino, &peer, &type) == 0 &&
         type == SOCK_STREAM && peer == b_st.st_ino;
}

// The same, where unix_diag cannot see the pair (it was made in another network
// namespace, shm/dir_rendezvous.h): a random probe written on A must be what B reads.
// (Bytes stuffed in before by anybody else make it fail: declined, never wrongly passed.)
bool IsProxyPairByProbe(int a, int b) noexcept {
  uint64_t a_inode = 0, b_inode = 0;
  if (!IsUnixStream(a, &a_inode) || !IsUnixStream(b, &b_inode)) return false;
  const uint64_t probe = sys::RandomNonce();
  uint64_t got = ~probe;
  return sys::send(a, &probe, sizeof(probe), MSG_DONTWAIT | MSG_NOSIGNAL) ==
             ssize_t(sizeof(probe)) &&
         sys::recv(b, &got, sizeof(got), MSG_DONTWAIT) == ssize_t(sizeof(got)) && got == probe;
}

}  // namespace

std::unique_ptr<Channel> AcceptRegistration(const wire::Register& msg, int fds[4], int anchor,
                                            int* proxy_a, int* proxy_b,
                                            std::atomic<uint32_t>** claim,
                                            wire::DeclineReason* reason, bool across_namespaces,
                                            uint32_t listener_flags) noexcept {
  *reason = wire::DeclineReason::kBadRegion;
  uint64_t client_b_inode = 0;
  // (A fifth descriptor, the client's TCP socket, comes through the directory and with a
  // registration without a port, which the caller checked: the caller's.)
  const bool fd_count_ok =
      across_namespaces ? msg.fd_count == 5 : msg.fd_count == 4 || msg.fd_count == 5;
  if (!fd_count_ok || !ValidRingSize(msg.ring_size) ||
      msg.region_size != RegionSize(msg.ring_size) ||
      !(across_namespaces ? IsProxyPairByProbe(fds[1], fds[2]) : IsProxyPair(fds[1], fds[2])) ||
      !IsUnixStream(fds[3], &client_b_inode)) {
    CloseAll(fds, 4);
    return nullptr;
  }
  int map_error = 0;
  void* region = MapPeerRegion(fds[0], msg.ring_size, msg.nonce, &map_error);
  if (region == nullptr) {
    if (map_error == -ENOMEM) *reason = wire::DeclineReason::kResources;
    CloseAll(fds, 4);
    return nullptr;
  }
  ChannelSetup setup;
  setup.region = region;
  setup.region_size = msg.region_size;
  setup.ring_size = msg.ring_size;
  setup.nonce = msg.nonce;
  setup.is_client = false;
  setup.peer_b = fds[3];
  setup.own_b = fds[2];
  setup.anchor = anchor;
  auto channel = MakeChannel(setup);
  if (!channel) {
    *reason = wire::DeclineReason::kResources;
    munmap(region, msg.region_size);
    CloseAll(fds, 4);
    return nullptr;
  }
  sys::close(fds[0]);  // the mapping keeps the region
  *proxy_a = fds[1];
  *proxy_b = fds[2];
  auto& control = static_cast<RegionControl*>(region)->header;
  control.listener_flags.store(listener_flags, std::memory_order_relaxed);  // (before any claim)
  if (claim) *claim = &control.claim;
  std::fill(fds, fds + 4, -1);
  return channel;
}

void AnswerRegistration(int conn, uint64_t nonce, wire::DeclineReason reason) noexcept {
  wire::Message msg;
  if (reason == wire::DeclineReason::kUnspecified) {
    msg.type = wire::Type::kAccept;
    msg.accept = wire::Accept{nonce};
  } else {
    msg.type = wire::Type::kDecline;
    msg.decline = wire::Decline{nonce, reason};
  }
  uint8_t buf[wire::kMaxMessageSize];
  const size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  // A client that went away meanwhile finds nothing; one that stays gets one message.
  sys::send(conn, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// ---------------------------------------------------------------------------- Registration

Registration::~Registration() {
  Release();
}

void Registration::Release() noexcept {
  // (Closing an unanswered rendezvous connection tells its client: it withdraws.)
  if (answer >= 0) sys::close(answer);
  answer = -1;
  stream.reset();
  if (anchor_slot >= 0) sys::close(anchor_slot);
  anchor_slot = -1;
  sys::CloseHandedOver(client_socket);
  client_socket = -1;
  proxy_a = -1;
  claim = nullptr;
  taken_ = false;
}

Registration::Registration(Registration&& o) noexcept
    : msg(o.msg),
      uid(o.uid),
      received_ms(o.received_ms),
      stream(std::move(o.stream)),
      proxy_a(o.proxy_a),
      anchor_slot(o.anchor_slot),
      answer(o.answer),
      claim(o.claim),
      client_socket(o.client_socket),
      client_inode(o.client_inode),
      accepted_seen_ms(o.accepted_seen_ms),
      taken_(o.taken_) {
  o.proxy_a = o.anchor_slot = o.answer = o.client_socket = -1;
  o.claim = nullptr;
  o.taken_ = false;
}

Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    Release();
    msg = o.msg;
    uid = o.uid;
    received_ms = o.received_ms;
    stream = std::move(o.stream);
    proxy_a = o.proxy_a;
    anchor_slot = o.anchor_slot;
    answer = o.answer;
    claim = o.claim;
    client_socket = o.client_socket;
    client_inode = o.client_inode;
    accepted_seen_ms = o.accepted_seen_ms;
    taken_ = o.taken_;
    o.proxy_a = o.anchor_slot = o.answer = o.client_socket = -1;
    o.claim = nullptr;
    o.taken_ = false;
  }
  return *this;
}

Claim Registration::ReadClaim() const noexcept {
  if (!claim) return Claim::kAbandoned;
  const uint32_t value = claim->load(std::memory_order_acquire);
  return value <= uint32_t(Claim::kAbandoned) ? Claim(value) : Claim::kOpen;
}

bool Registration::Commit() noexcept {
  if (!claim) return false;
  uint32_t expected = uint32_t(Claim::kOpen);
  // A value the client had no business writing counts as open: the rings are ours to
  // claim, and the client learns it from the claim word, not from what it wrote there.
  // (A client that wrote "taken" itself gets a plain connection: the word is not ours.)
  taken_ = claim->compare_exchange_strong(expected, uint32_t(Claim::kTaken),
                                          std::memory_order_acq_rel) ||
           (expected > uint32_t(Claim::kAbandoned) &&
            claim->compare_exchange_strong(expected, uint32_t(Claim::kTaken),
                                           std::memory_order_acq_rel));
  if (answer >= 0) {
    // The answer only wakes the client: the claim word is what it goes by.
    AnswerRegistration(
        answer, msg.nonce,
        taken_ ? wire::DeclineReason::kUnspecified : wire::DeclineReason::kNoRegistration);
    sys::close(answer);
    answer = -1;
  }
  return taken_;
}

Claim Registration::Abandon() noexcept {
  if (taken_) return Claim::kTaken;  // the rings carry it: never plain
  if (!claim) return Claim::kAbandoned;
  uint32_t expected = uint32_t(Claim::kOpen);
  Claim result = Claim::kAbandoned;
  // Only this end's own claim makes a connection the rings': "taken" written by the client
  // (or any value it had no business writing) leaves it plain for us.
  if (!claim->compare_exchange_strong(expected, uint32_t(Claim::kAbandoned),
                                      std::memory_order_acq_rel) &&
      expected == uint32_t(Claim::kWithdrawn))
    result = Claim::kWithdrawn;
  if (answer >= 0) {
    AnswerRegistration(answer, msg.nonce, wire::DeclineReason::kNoRegistration);
    sys::close(answer);
    answer = -1;
  }
  return result;
}

}  // namespace slip::shm
