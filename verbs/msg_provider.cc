// verbs as the NCCL face's provider (core/msg_provider.h). Linked into the face: no
// rdma-core here; the comms are the module's (verbs/msg.h).
#include "core/msg_provider.h"

#include "core/no_destructor.h"
#include "verbs/msg.h"
#include "verbs/options.h"
#include "verbs/transport.h"

namespace slip::verbs {

msg::Provider* MessageProvider() noexcept {
  // (Never destroyed: its comms may be used while the process exits.)
  static NoDestructor<msg::ModuleProvider<Options, MessageSetup>> provider(
      kModule, kOptionTable, [](const msg::FaceSetup& face, MessageSetup* setup) noexcept {
        setup->flush_host_memory = face.flush_host_memory;
        setup->queue_pairs = face.queue_pairs;
      });
  return provider.get();
}

}  // namespace slip::verbs
