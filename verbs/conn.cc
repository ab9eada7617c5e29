// Conn's lifetime: creation (QpChannel's queues and rings), closing the stream, and
// destruction. The rest by concern: conn_reuse.cc (parking and claiming queue pairs),
// settle.cc (a group's client held until the TAKEN).
#include "verbs/conn.h"

#include <cerrno>
#include <new>

namespace slip::verbs {

Conn* Conn::Create(rdma_cm_id* id, Device* device, uint32_t ring_size, bool send_notify,
                   int* error) noexcept {
  auto* conn = new (std::nothrow) Conn(id, device, ring_size);
  if (!conn) {
    *error = -ENOMEM;
    return nullptr;
  }
  if (int rc = conn->Init(send_notify); rc < 0) {
    delete conn;  // (Init left the id to the caller)
    *error = rc;
    return nullptr;
  }
  id->context = conn;
  return conn;
}

Conn::~Conn() {
  // Unlisted first: the progress thread's sweeps call into the connection.
  Unlist();
  if (!stream_closed_) CloseStream(false);
  Teardown();
}

bool Conn::CloseStream(bool may_linger) noexcept {
  if (stream_closed_ || orphaned()) return false;
  stream_closed_ = true;
  return EndStream(may_linger && !no_reuse_);
}

}  // namespace slip::verbs
