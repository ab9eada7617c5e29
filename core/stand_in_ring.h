// StandInRing: a connection for a request that its listener dropped before the request's
// TCP connection came (core/pending_requests.h keeps a record of it). Its client had the
// listener's answer and may still send its CONFIRM, which must never reach the
// application as data; nothing of the client's reaches this end on the transport (the
// request's path is gone). So it is a RemoteRing without a path of the transport's, held
// until the client's first bytes settle it:
//
//   CONFIRM of the request   -> settled, then at once on TCP from byte 0 (a failover: the
//                               client's end stops its path and resends from there)
//   other bytes, EOF         -> plain TCP from byte 0 (Reason::kRendezvousBusy)
//   nothing by the deadline  -> plain TCP from byte 0, gated (RemoteRing's settling)
//
// Its rings are plain memory (no registration): the stream uses them only on TCP.
#pragma once

#include <cstdint>
#include <memory>

#include "core/remote_ring.h"

namespace slip {

class StandInRing final : public RemoteRing {
 public:
  // Held for the request's `nonce` until `deadline_ms` (RemoteRing::Hold), its rings of
  // `ring_size` bytes; named as the transport whose request it stands in for. nullptr when
  // there is no memory.
  static std::unique_ptr<StandInRing> Create(const Names& names, uint32_t ring_size, uint64_t nonce,
                                             uint64_t deadline_ms) noexcept;
  ~StandInRing() override;

  const uint8_t* RxData() const noexcept override { return rx_.get(); }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override;
  void CloseRx() noexcept override { rx_close_wanted_.store(true, std::memory_order_seq_cst); }

 private:
  StandInRing(const Names& names, uint32_t ring_size) noexcept : RemoteRing(names, ring_size) {}

  // The CONFIRM came: nothing of the client's can arrive on a path, so the stream moves to
  // TCP as soon as it settles (the path counts as broken).
  PeerCheck ConfirmedPeer(uint64_t now_ms, const char** what) noexcept override;
  void HaltLocked() noexcept override { failover_.Begin(); }
  void TakeArrivals() const noexcept override {}
  bool PostCredit(uint64_t) noexcept override { return false; }
  bool PostData(uint64_t, uint64_t) noexcept override { return false; }
  void PostEnd() noexcept override {}

  std::unique_ptr<uint8_t[]> rx_;
  std::unique_ptr<uint8_t[]> tx_;
};

}  // namespace slip
