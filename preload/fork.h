// fork() support: what a child needs to keep using the connections it inherits.
//
// The rings are MAP_SHARED and the proxies and anchors are inherited descriptors, so an
// inherited accelerated socket works in the child as it is (the pre-forking server: accept
// in the parent, serve in the child, the parent closes its copy; closing a copy never ends
// the connection for the other holders, see Stream::~Stream). What the child lacks is a
// control thread watching those anchors, and stats slots of its own. Parent and child may
// use one connection at the same time, in the same direction: the stream's cursors and
// per-side locks move to memory the two share before fork (core/shared_sides.h).
#pragma once

namespace slip::preload {

void InstallForkHandlers() noexcept;

}  // namespace slip::preload
