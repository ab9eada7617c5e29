// The fabric transport's options: SLIP_FABRIC_PROVIDER, SLIP_FABRIC_ENDPOINT,
// SLIP_FABRIC_NOTES, SLIP_FABRIC_DATA, SLIP_NEGATIVE_TTL_MS.
//
// Read with core's grammar (core/options.h) by whoever starts the transport (a face, at
// start-up), and handed to the module (fabric/msg.h). Built into a small library of its
// own (slipfabricopts), so that a face reads them without libfabric.
#pragma once

#include <span>
#include <string>

#include "core/module_loader.h"
#include "core/options.h"

namespace slip::fabric {

// Which endpoints the shim's streams use.
enum class EndpointChoice : uint8_t {
  kAuto,  // connected ones where the provider has them (tcp, verbs), else reliable datagrams
  kConnected,
  kDatagram,
};

// How the streams' bytes reach the peer.
enum class DataChoice : uint8_t {
  kAuto,   // RMA writes where the provider has them, else sends
  kWrite,  // one-sided writes into the peer's registered ring (FI_RMA)
  kSend,   // sends into the peer's posted receives, copied into its ring (FI_MSG)
};

struct Options {
  // SLIP_FABRIC_PROVIDER: a libfabric provider name as fi_info prints it ("tcp;ofi_rxm",
  // "shm", "verbs;ofi_rxm", "efa"); a core provider alone ("tcp", "verbs") is taken with
  // the utility provider libfabric layers over it. Empty (the default): fi_getinfo's best
  // match among those that have what the transport needs.
  std::string provider;
  // SLIP_FABRIC_ENDPOINT (streams): "msg", one connected endpoint (FI_EP_MSG) per stream,
  // as verbs' queue pairs (the tcp and verbs providers have them); "rdm", one reliable
  // datagram endpoint (FI_EP_RDM) per process that every stream shares (ofi_rxm over tcp
  // or verbs, shm, efa); "auto" (the default): msg where the provider has connected
  // endpoints (unless SLIP_FABRIC_PROVIDER names ofi_rxm), rdm elsewhere (shm, efa).
  EndpointChoice endpoint = EndpointChoice::kAuto;
  // SLIP_FABRIC_NOTES (streams): "word" (the default) writes each cursor into a word of
  // the peer's ring memory, which only the connection's two ends can write, and rings a
  // 4-byte doorbell; "inline" carries the cursor in 8 bytes of remote CQ data where the
  // provider can (one write less per publish, but a host that reaches the endpoint and
  // guesses a note tag could move a cursor: for fabrics whose hosts are all trusted).
  bool word_notes = true;
  // SLIP_FABRIC_DATA (streams): "write" moves bytes by one-sided writes into the peer's
  // registered ring (FI_RMA, remote CQ data); "send" by sends into receives the peer posted,
  // which it copies into its ring (FI_MSG: for providers without RMA; connected endpoints
  // only); "auto" (the default): write where a provider can, else send.
  DataChoice data = DataChoice::kAuto;
  // SLIP_NEGATIVE_TTL_MS (shared with verbs): how long a destination that answered a REQ
  // with "no Slipstream here" (ICMP port unreachable, silence) goes plain at once.
  uint32_t negative_ttl_ms = 10000;
};

// The variables above, as both faces read them (the unset ones keep their defaults).
extern const options::Table<Options> kOptionTable;

// The module both faces load (core/module_loader.h).
inline constexpr ModuleNames kModule = {TransportKind::kFabric, "fabric", "libslipstream-fabric.so",
                                        "slip_fabric_stream_module",
                                        "slip_fabric_message_transports"};

}  // namespace slip::fabric
