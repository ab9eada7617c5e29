// fabric as the NCCL face's provider (core/msg_provider.h). Linked into the face: no
// libfabric here; the comms are the module's (fabric/msg.h).
#include "core/msg_provider.h"

#include "core/no_destructor.h"
#include "fabric/msg.h"
#include "fabric/options.h"
#include "fabric/transport.h"

namespace slip::fabric {

msg::Provider* MessageProvider() noexcept {
  // (Never destroyed: its comms may be used while the process exits.)
  static NoDestructor<msg::ModuleProvider<Options, MessageSetup>> provider(kModule, kOptionTable);
  return provider.get();
}

}  // namespace slip::fabric
