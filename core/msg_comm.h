// Message comms: what a transport offers the NCCL face (ncclnet-plugin/), beside the byte
// streams it offers the shim (core/transport.h).
//
// NCCL's network model, in transport-neutral terms: a receiver listens and publishes a
// handle (at most kHandleBytes, carried to the sender by NCCL's bootstrap); the sender
// connects to it; each comm is one-directional. The receiver posts receives (up to
// kMaxGroup buffers at once, each with a tag and a capacity) and the sender's sends match
// them in the order they were posted, a send taking the posted buffer of its tag: this is
// NCCL's clear-to-send pattern, so a sender never writes more than a receiver has room
// for. At most kMaxRequests requests are in flight per comm; nothing blocks, and a call
// that cannot go on now says kAgain (NCCL calls it again). Requests complete through Test,
// which also moves the comm's bytes: NCCL's proxy thread is the progress engine.
//
// Memory: an RDMA transport moves bytes between registered buffers only, so a face
// registers each buffer with the comm that will carry it (NCCL's regMr) and names the
// registration in Send and Recv; a transport that copies with the CPU registers nothing.
//
// Thread safety: a comm and its requests are driven by one thread at a time (NCCL's proxy
// thread); different comms may be driven concurrently. A Transport may be called from any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace slip::msg {

constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kMaxRequests = 32;      // NCCL_NET_MAX_REQUESTS
constexpr int kMaxGroup = 8;          // buffers in one grouped receive

enum class Status : uint8_t {
  kOk,
  kAgain,        // not now (no posted receive to match, requests all in flight): call again
  kBadArgument,  // the caller's input (a handle that is not ours, a size too large)
  kRemote,       // the peer: gone, or broke the protocol
  kSystem,       // the system refused a resource (descriptors, memory, a refused connect)
  kInternal,
};

// One send or one (grouped) receive in flight, owned by its comm.
class Request;
// A buffer registered with a comm (Comm::Register), owned by the comm: each transport
// that registers derives from this.
class Memory {
 protected:
  Memory() = default;
  ~Memory() = default;
};

// A buffer to register: host memory, or device (GPU) memory, by address (a peer-memory
// client such as nvidia-peermem resolves it) or as a DMA-BUF (`dmabuf_fd`, the buffer at
// `dmabuf_offset` in it).
struct Region {
  void* data = nullptr;
  size_t size = 0;
  bool device = false;
  int dmabuf_fd = -1;
  uint64_t dmabuf_offset = 0;
};

// What both ends of a comm offer.
class Comm {
 public:
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  // Registers the region for this comm's transfers. A transport that needs no registration
  // says kOk with *out null. Closing the comm drops what is still registered.
  virtual Status Register(const Region& region, Memory** out) noexcept {
    (void)region;
    *out = nullptr;
    return Status::kOk;
  }
  // kBadArgument for a registration that is not this comm's.
  virtual Status Deregister(Memory* memory) noexcept {
    return memory == nullptr ? Status::kOk : Status::kBadArgument;
  }

 protected:
  Comm() = default;
};

// The sending end of a comm.
class SendComm : public Comm {
 public:
  // Sends `size` bytes of `data` (which must stay untouched until the request is done, and
  // lie in `memory` where the transport registers) to the receive posted with `tag`.
  // kAgain: no such receive is posted yet, or kMaxRequests are in flight.
  virtual Status Send(const void* data, size_t size, int tag, Memory* memory,
                      Request** out) noexcept = 0;
};

// The receiving end of a comm.
class RecvComm : public Comm {
 public:
  // Posts `n` (1..kMaxGroup) buffers, data[i] of capacity sizes[i] (in memory[i]) for the
  // send tagged tags[i]. kAgain: kMaxRequests are in flight.
  virtual Status Recv(int n, void* const* data, const size_t* sizes, const int* tags,
                      Memory* const* memory, Request** out) noexcept = 0;
  // Makes the bytes of a completed receive visible to the device that will read them (a
  // NIC's writes into GPU memory are not ordered before a GPU kernel's reads: a read from
  // the NIC flushes them). *out null: nothing to wait for.
  virtual Status Flush(int n, void* const* data, const size_t* sizes, Memory* const* memory,
                       Request** out) noexcept {
    (void)n;
    (void)data;
    (void)sizes;
    (void)memory;
    *out = nullptr;
    return Status::kOk;
  }
};

// Moves the request's comm on, and says whether the request is done; a done request is
// gone (its storage returns to the comm). When done, sizes[0, *count) are the bytes of each
// buffer (one for a send, n for a receive). An error fails the request and its comm.
Status Test(Request* request, bool* done, size_t sizes[kMaxGroup], int* count) noexcept;

// The listening end, before a comm is accepted.
class Listener {
 public:
  virtual ~Listener() = default;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  // The next comm a sender connected with this listener's handle; kAgain while none has
  // arrived complete. Senders that are not ours (wrong user, wrong handle) are refused
  // and logged; they never end the listener.
  virtual Status Accept(std::unique_ptr<RecvComm>* out) noexcept = 0;

 protected:
  Listener() = default;
};

// What a face tells its users about the device a transport's comms go through.
struct DeviceInfo {
  char name[64] = {};       // "shm", "rxe0", ...
  char pci_path[256] = {};  // the PCI device's sysfs path; empty: none (shared memory)
  uint64_t guid = 0;
  int speed_mbps = 0;
  float latency_us = 0;
  bool registers = false;    // Send and Recv need registered memory (Comm::Register)
  bool dmabuf = false;       // the device registers DMA-BUF memory (GPU memory by DMA-BUF)
  bool peer_memory = false;  // a peer-memory client lets it register GPU memory by address
};

// A transport's message face: one per device.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const noexcept = 0;
  virtual const DeviceInfo& device() const noexcept = 0;
  // Writes the handle a sender needs (kHandleBytes at most; the rest of `handle` is left
  // zero) and the listener.
  virtual Status Listen(uint8_t* handle, std::unique_ptr<Listener>* out) noexcept = 0;
  // Connects to a handle made by Listen (in another process). kAgain: call again later
  // with the same handle.
  virtual Status Connect(const uint8_t* handle, std::unique_ptr<SendComm>* out) noexcept = 0;
};

// The request's storage and the comm that moves it: each transport derives from this.
class Request {
 public:
  virtual Status Test(bool* done, size_t sizes[kMaxGroup], int* count) noexcept = 0;

 protected:
  Request() = default;
  ~Request() = default;
};

inline Status Test(Request* request, bool* done, size_t sizes[kMaxGroup], int* count) noexcept {
  return request->Test(done, sizes, count);
}

}  // namespace slip::msg
