#include "core/channel.h"

#include "core/channel_control.h"
#include "core/no_destructor.h"

namespace slip {

ChannelControl* Channel::control() noexcept {
  // Stateless: every channel without a control side of its own shares it.
  static NoDestructor<ChannelControl> none;
  return none.get();
}

}  // namespace slip
