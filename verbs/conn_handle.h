// ConnHandle: the Channel a stream holds for one verbs connection.
//
// A stream deletes its Channel when the application lets go, but the queue pair behind it
// may serve the next connection between the same two processes (conn.h, "Reuse"). So the
// stream holds this handle: it forwards every call to the Conn and, when deleted, gives
// the Conn back to its owner (the module), which parks it or deletes it.
#pragma once

#include "core/channel.h"
#include "verbs/conn.h"

namespace slip::verbs {

class ConnOwner {
 public:
  // The stream is gone: close it in order, then keep the queue pair or delete the Conn.
  virtual void Release(Conn* conn) noexcept = 0;

 protected:
  ~ConnOwner() = default;
};

class ConnHandle final : public Channel {
 public:
  ConnHandle(Conn* conn, ConnOwner* owner) noexcept
      : Channel(conn->ring_size()), conn_(conn), owner_(owner) {}
  ~ConnHandle() override { owner_->Release(conn_); }

  TransportKind kind() const noexcept override { return conn_->kind(); }
  uint64_t RxProduced() const noexcept override { return conn_->RxProduced(); }
  const uint8_t* RxData() const noexcept override { return conn_->RxData(); }
  void RxConsumed(uint64_t consumed) noexcept override { conn_->RxConsumed(consumed); }
  bool RxEof() const noexcept override { return conn_->RxEof(); }
  WakeState* RxWake() noexcept override { return conn_->RxWake(); }
  int Error() const noexcept override { return conn_->Error(); }
  uint64_t TxConsumed() const noexcept override { return conn_->TxConsumed(); }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override {
    conn_->TxCopy(offset, src, len);
  }
  void TxPublish(uint64_t produced) noexcept override { conn_->TxPublish(produced); }
  bool TxPeerClosed() const noexcept override { return conn_->TxPeerClosed(); }
  WakeState* TxWake() noexcept override { return conn_->TxWake(); }
  void CloseTx() noexcept override { conn_->CloseTx(); }
  void CloseRx() noexcept override { conn_->CloseRx(); }
  void Abort() noexcept override { conn_->Abort(); }
  void SetAnchor(int fd) noexcept override { conn_->SetAnchor(fd); }
  bool OnPeerFailover(const wire::Failover& peer) noexcept override {
    return conn_->OnPeerFailover(peer);
  }
  bool AnchorCarriesStream() const noexcept override { return conn_->AnchorCarriesStream(); }
  void OnAnchorReady(uint32_t events) noexcept override { conn_->OnAnchorReady(events); }
  bool HandBack(uint64_t consumed, int timeout_ms) noexcept override {
    return conn_->HandBack(consumed, timeout_ms);
  }
  bool SharedWithOtherProcess() const noexcept override { return conn_->SharedWithOtherProcess(); }
  void AfterForkChild() noexcept override { conn_->AfterForkChild(); }
  int BeginRxSleep() noexcept override { return conn_->BeginRxSleep(); }
  void EndRxSleep(bool woken) noexcept override { conn_->EndRxSleep(woken); }

 private:
  Conn* conn_;
  ConnOwner* owner_;
};

}  // namespace slip::verbs
