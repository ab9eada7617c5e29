// What a transport's public header (<name>/transport.h) names: the interface each face
// takes it through. A transport defines slip::<name>::TheTransport() (the shim's,
// core/transport.h) and slip::<name>::MessageProvider() (the NCCL face's,
// core/msg_provider.h); the build lists them in each face's registry.
#pragma once

namespace slip {

class Transport;
namespace msg {
class Provider;
}

}  // namespace slip
