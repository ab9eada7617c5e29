// The stream module's parts (fabric/stream.h is its boundary): the listener's UDP twin
// and its pending requests (stream_listen.cc), a client's REQ (stream_connect.cc), and the
// module that holds the process's StreamFabric (stream_module.cc).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/negative_cache.h"
#include "core/pending_requests.h"
#include "fabric/request_rates.h"
#include "fabric/stream.h"
#include "fabric/stream_conn.h"
#include "fabric/stream_fabric.h"
#include "fabric/stream_wire.h"

namespace slip::fabric {

class StreamModuleImpl;

// A TCP listener's UDP twin. Its requests are the module's (PendingRequests).
struct StreamListener {
  StreamModuleImpl* module = nullptr;
  int udp = -1;
  wire::Endpoint local;   // the TCP listener's address (any address: all zero)
  RequestOwner requests;  // its share of the module's table
  TokenBucket answers = RequestRates::ListenerBucket();  // (under RequestRates' mutex)
  std::atomic<bool> shared{false};                       // fork: REQs are refused
};

// Deletes a request's connection that the table (core/pending_requests.h) hands back:
// always one of ours.
void DeleteRequest(RemoteRing* conn) noexcept;

struct StreamClient {
  int udp = -1;
  wire::Endpoint dest;
  StreamConn* conn = nullptr;  // owned until Finish
  uint64_t nonce = 0;
  uint8_t req[streamwire::kBytes] = {};
  int sends = 0;
  uint64_t resend_ms = 0;
  uint64_t deadline_ms = 0;
  bool linking = false;  // connected endpoints: answered, our endpoint connecting
};

class StreamModuleImpl final : public StreamModule {
 public:
  StreamModuleImpl(const Config* config, const Options* options, int hidden_fd_floor,
                   std::unique_ptr<StreamFabric> fabric) noexcept
      : StreamModule(StreamConn::kNames, DeleteRequest, hidden_fd_floor,
                     config->handshake_timeout_ms),
        config_(config),
        options_(options),
        floor_(hidden_fd_floor),
        fabric_(std::move(fabric)) {
    fabric_->SetTurn(&StreamModuleImpl::Turn, this);
  }
  // (The kept requests' connections go while fabric_ is there.)
  ~StreamModuleImpl() override { requests_.ForgetOwner(nullptr); }

  const char* provider() const noexcept override { return fabric_->provider(); }

  StreamListener* Listen(const sockaddr* local, bool v6only, Reason* why) noexcept override;
  void Unlisten(StreamListener* listener) noexcept override;
  void Share(StreamListener* listener) noexcept override { listener->shared.store(true); }

  StreamClient* Start(const sockaddr* dest, sockaddr_storage* source,
                      Reason* why) noexcept override;
  bool Request(StreamClient* client, const wire::Endpoint& from, const wire::Endpoint& to,
               uint64_t nonce, uint32_t ring_size, Reason* why) noexcept override;
  Step Advance(StreamClient* client, sockaddr_storage* source, Reason* why) noexcept override;
  int EventFd(StreamClient* client) noexcept override;
  uint64_t Deadline(StreamClient* client) noexcept override;
  std::unique_ptr<Channel> Finish(StreamClient* client, int proxy_b) noexcept override;
  void Abort(StreamClient* client) noexcept override;

  void ForkPrepare() noexcept override;
  void ForkParent() noexcept override;
  void ForkChild() noexcept override;
  void BeforeExec() noexcept override;
  void FlushAll(int timeout_ms) noexcept override;
  void ProviderAccepted(int listening, int fd) noexcept override {
    if (!forked_.load()) fabric_->ProviderAccepted(listening, fd);
  }

 private:
  // A new connection's rings and tag, the progress thread running. nullptr with *why.
  StreamConn* NewConn(uint32_t ring_size, Reason* why) noexcept;
  // What REQ and REP say of the notes' form of a connection with rings of `ring_size`
  // (both ends must agree).
  uint8_t NoteBytes(uint32_t ring_size) const noexcept {
    return fabric_->sends()                 ? streamwire::kNoteSends
           : fabric_->link_notes(ring_size) ? streamwire::kNoteLinkCursor
           : fabric_->word_notes()          ? streamwire::kNoteWords
                                            : streamwire::kNoteCursor8;
  }
  streamwire::Endpoints Endpoints() const noexcept {
    return fabric_->connected() ? streamwire::Endpoints::kConnected
                                : streamwire::Endpoints::kReliableDatagram;
  }
  // A client's connected endpoint, to the listener the REP names.
  bool ConnectLink(StreamClient* c, const streamwire::Message& rep) noexcept;
  // Its peer's ring, and with RDM its endpoint, from a REQ or REP. False when the provider
  // rejects the address.
  bool Connect(StreamConn* conn, const streamwire::Message& m) noexcept;
  // The datagrams waiting at a listener's UDP socket, a few batches of them: true when
  // more are likely queued (StreamFabric::ServeFn).
  bool Service(StreamListener* l) noexcept;
  // One datagram for a listener: answered, refused or dropped.
  void Answer(StreamListener* l, const uint8_t* in, size_t len, const sockaddr* from,
              socklen_t from_len) noexcept;
  // A REFUSE for `req` (recorded, for accept()'s reason: `why`).
  void Refuse(StreamListener* l, const streamwire::Message& req, Reason why, const sockaddr* from,
              socklen_t from_len, uint64_t now_ms) noexcept;
  // Who sent a REQ from `source` to `server`, for sharing (PendingRequests' Principal).
  Principal WhoSent(const wire::Endpoint& source, const wire::Endpoint& server) noexcept;
  // What a request with rings of `ring_size` is charged against the budget.
  size_t Charge(uint32_t ring_size) const noexcept;
  // The tables, made at the first listener (clients never pay for them).
  bool HaveTables() noexcept;
  // The progress thread's calls: a listener's UDP socket is readable; a turn (the requests
  // whose grace is over: RequestKeeper::CheckDue).
  static bool ServeListener(void* ctx) noexcept;
  static void Turn(void* ctx, uint64_t now_ms) noexcept;
  // A descriptor of ours, above the application's (close-on-exec), or -1 (closed).
  int Hide(int fd) const noexcept;
  // accept() took a kept request (core/request_module.h).
  void Accepted(StreamListener* l, const wire::Endpoint& client, const KeptRequest& kept,
                bool* committed) noexcept override;
  Reason RefusedLately(StreamListener* l, const wire::Endpoint& client) noexcept override;

  const Config* config_;
  const Options* options_;
  const int floor_;
  std::unique_ptr<StreamFabric> fabric_;
  NegativeCache negative_;
  std::mutex tables_mu_;
  std::atomic<bool> tables_{false};  // the requests' table and rates_ are made
  RequestRates rates_;
  bool MakesNew() const noexcept { return !forked_.load() && !exec_retired_.load(); }
  std::atomic<bool> forked_{false};        // a fork child: nothing new
  std::atomic<bool> exec_retired_{false};  // an exec was tried: nothing new
};

}  // namespace slip::fabric
