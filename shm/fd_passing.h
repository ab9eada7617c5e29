// Descriptors handed between processes over AF_UNIX sockets (SCM_RIGHTS): what shm's
// registrations, its siblings' queue and its message comms' HELLO share.
#pragma once

#include <sys/socket.h>

#include <cstddef>

namespace slip::shm {

// Sends `len` bytes and `nfds` descriptors (at most 8) in one message, without blocking or
// SIGPIPE. 0, or -errno (-EMSGSIZE: sent short).
int SendWithFds(int sock, const void* msg, size_t len, const int* fds, int nfds) noexcept;

// The descriptors a received (or peeked) message carried, in order, into fds[0, max);
// returns how many came. Any beyond `max` are closed as descriptors another process handed
// over are (sys::CloseHandedOver). With a control buffer of room for `max`, none are.
int TakeFds(msghdr* mh, int* fds, int max) noexcept;

}  // namespace slip::shm
