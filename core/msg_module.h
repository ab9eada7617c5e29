// The entry point of a transport module's message face (verbs/msg.h, fabric/msg.h), the
// same for each: the first call checks that the face was built with this module, keeps the
// face's setup, starts the module's logging and finds the devices, once; every call then
// returns the same transports (they live as long as the process), or -1 with the reason.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/msg_comm.h"

namespace slip::msg {

// What a module found: its transports, or why there are none. (Never destroyed: a module
// may derive from it to keep what its transports use.)
struct Found {
  std::vector<std::unique_ptr<Transport>> transports;
  std::string why;
};

// What every module's setup holds (a module's own, in verbs/msg.h or fabric/msg.h, derives
// from it and adds its fields): filled by the face (core/msg_provider.h ModuleProvider).
// `Abi` changes with the layout: a module refuses a face of another build.
template <typename Options, int Abi>
struct ModuleSetup {
  static constexpr int kAbi = Abi;
  int abi = kAbi;  // the caller's
  const Options* options = nullptr;
  LogLevel log_level = LogLevel::kWarn;
  LogSink log_sink = nullptr;       // the face's (NCCL's logger); null: stderr
  uint32_t connect_timeout_ms = 0;  // a connect or accept that has not completed by then fails
};

// The module's copy of the face's setup, kept by the first ServeTransports (before any
// transport exists).
template <typename Setup>
Setup& KeptSetup() noexcept {
  static constinit Setup kept;
  return kept;
}

// `Setup` is a ModuleSetup; `find` returns a new Found (or one derived from it, holding
// what the transports use).
template <typename Setup, typename Find>
int ServeTransports(const Setup* setup, const char* library, Find find, Transport** out, int max,
                    char* error, size_t error_len) noexcept {
  static std::mutex mu;
  static Found* found = nullptr;  // never freed: comms may be used while the process exits
  std::lock_guard<std::mutex> lock(mu);
  if (!found) {
    if (!setup || setup->abi != Setup::kAbi || !setup->options) {
      snprintf(error, error_len, "%s is of another build", library);
      return -1;
    }
    KeptSetup<Setup>() = *setup;
    LogInit(setup->log_level, nullptr);
    if (setup->log_sink) LogSetSink(setup->log_sink);
    try {
      found = find();
    } catch (...) {
      found = nullptr;
    }
    if (!found) {
      snprintf(error, error_len, "out of memory");
      return -1;
    }
  }
  if (found->transports.empty()) {
    snprintf(error, error_len, "%s", found->why.c_str());
    return -1;
  }
  int n = 0;
  for (auto& t : found->transports)
    if (n < max) out[n++] = t.get();
  return n;
}

// A module transport over one of its devices: the name, the device (`Held`: the device
// itself, or a reference to one that outlives the transport), and Listen by its listener's
// Start; Connect is the transport's own.
template <typename Held>
class DeviceTransport : public Transport {
 public:
  DeviceTransport(const char* name, Held device) noexcept : name_(name), device_(device) {}
  const char* name() const noexcept final { return name_; }
  const DeviceInfo& device() const noexcept final { return device_.info; }

 protected:
  // A new `L` made of `args`, started by `start(listener)`, into *out.
  template <typename L, typename Start, typename... Args>
  static Status StartListener(std::unique_ptr<Listener>* out, Start start,
                              Args&&... args) noexcept {
    auto listener = std::unique_ptr<L>(new (std::nothrow) L(std::forward<Args>(args)...));
    if (!listener) return Status::kSystem;
    if (Status st = start(listener.get()); st != Status::kOk) return st;
    *out = std::move(listener);
    return Status::kOk;
  }

  const char* const name_;
  Held device_;
};

}  // namespace slip::msg

// The module's exported entry of the message face (`symbol`: its ModuleNames'
// message_entry), serving what `find` finds (ServeTransports).
#define SLIP_MESSAGE_ENTRY(symbol, Setup, library, find)                                        \
  extern "C" __attribute__((visibility("default"))) int symbol(                                 \
      const Setup* setup, slip::msg::Transport** out, int max, char* error, size_t error_len) { \
    return slip::msg::ServeTransports(setup, library, find, out, max, error, error_len);        \
  }
