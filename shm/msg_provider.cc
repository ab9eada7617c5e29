// shm as the NCCL face's provider (core/msg_provider.h): one device, the host itself.
#include "core/msg_provider.h"

#include "core/no_destructor.h"
#include "shm/msg.h"
#include "shm/transport.h"

namespace slip::shm {

namespace {

class ShmProvider final : public msg::Provider {
 public:
  TransportKind kind() const noexcept override { return TransportKind::kShm; }
  bool BetweenHosts() const noexcept override { return false; }

  int Find(const msg::FaceSetup& face, msg::Transport** out, int max, char* why,
           size_t why_len) noexcept override {
    if (max < 1) {
      snprintf(why, why_len, "no room for a device");
      return 0;
    }
    SetMessageRingSize(face.config->ring_size);
    if (!face.config->rendezvous_dir.empty())
      SetMessageRendezvousDir(face.config->rendezvous_dir.c_str());
    out[0] = MessageTransport();
    SLIP_LOG(kInfo, "shm message comms, ring %u KiB per comm",
             unsigned(face.config->ring_size >> 10));
    return 1;
  }
};

}  // namespace

msg::Provider* MessageProvider() noexcept {
  static NoDestructor<ShmProvider> provider;  // its comms outlive exit
  return provider.get();
}

}  // namespace slip::shm
