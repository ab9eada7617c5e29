// The verbs transport's options: SLIP_DEVICE, SLIP_GID_INDEX, SLIP_VERBS_NOTIFY,
// SLIP_NEGATIVE_TTL_MS, SLIP_VERBS_REUSE, SLIP_VERBS_PIN_MAX.
//
// Read with core's grammar (core/options.h) by whoever starts the transport: the shim at
// start-up, with core's (a bad value is one line, and the process runs plain), which hands
// them to the module (verbs.h); slip-run, which shows and sets them. Built into a small
// library of its own (slipverbsopts), so that neither needs libibverbs to read them.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/module_loader.h"
#include "core/options.h"

namespace slip::verbs {

// How a sender tells the receiver that bytes arrived: RDMA WRITE WITH IMMEDIATE
// (InfiniBand, RoCE), or a SEND after the WRITE (iWARP has no immediate). kAuto picks by
// the device's transport.
enum class NotifyMode : uint8_t { kAuto = 0, kImm, kSend };

struct Options {
  std::string device;                     // SLIP_DEVICE: RDMA device name (empty: any)
  int gid_index = -1;                     // SLIP_GID_INDEX: 0..255, -1 = RoCEv2 GID of the IP
  NotifyMode notify = NotifyMode::kAuto;  // SLIP_VERBS_NOTIFY=auto|imm|send
  uint32_t negative_ttl_ms = 10000;       // SLIP_NEGATIVE_TTL_MS, 0..3600000
  // SLIP_VERBS_REUSE, 0..1024: queue pairs a process keeps after their connections closed,
  // for the next connections to the same listener (0: every connection makes its own).
  uint32_t reuse = 16;
  // SLIP_VERBS_PIN_MAX, 1M..1024G (K/M/G suffixes): the most bytes of rings the process
  // keeps registered with RDMA devices (pinned), all connections and idle rings together;
  // 0 (the default): a quarter of the machine's physical memory. Beyond it a new verbs
  // connection stays on TCP (reason resources) and a listener rejects requests.
  uint64_t pin_max = 0;
};

// The variables above, as both faces read them (the unset ones keep their defaults).
extern const options::Table<Options> kOptionTable;

// The module both faces load (core/module_loader.h).
inline constexpr ModuleNames kModule = {TransportKind::kVerbs, "verbs", "libslipstream-verbs.so",
                                        "slip_verbs_module", "slip_verbs_message_transports"};

}  // namespace slip::verbs
