#!/usr/bin/python3
"""A plain asyncio echo pair (asyncio streams on the default event loop: nonblocking sockets
and epoll), for tests/vm/bench-rdma.sh: can a socket preload run it?

  asyncio_echo.py server HOST PORT      serves one connection, then exits
  asyncio_echo.py client HOST PORT [N]  N (default 1000) round trips of 64 bytes, each echo
                                        checked; prints the mean round trip / 2 in us
"""

import asyncio
import os
import sys
import time

SIZE = 64


async def serve(host, port):
    done = asyncio.Event()

    async def handle(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        done.set()

    server = await asyncio.start_server(handle, host, port)
    print(f"asyncio_echo: listening on {host}:{port}", file=sys.stderr, flush=True)
    async with server:
        await done.wait()


async def ping(host, port, count):
    reader, writer = await asyncio.open_connection(host, port)
    start = time.monotonic()
    for i in range(count):
        message = os.urandom(SIZE)
        writer.write(message)
        await writer.drain()
        echo = await reader.readexactly(SIZE)
        if echo != message:
            raise RuntimeError(f"round trip {i}: the echo differs")
    elapsed = time.monotonic() - start
    writer.write_eof()
    if await reader.read() != b"":
        raise RuntimeError("bytes after the last echo")
    writer.close()
    await writer.wait_closed()
    print(f"asyncio_echo: {count} round trips of {SIZE} B, "
          f"latency {elapsed / count / 2 * 1e6:.1f} us (round trip / 2)")


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("server", "client"):
        sys.exit(__doc__)
    host, port = sys.argv[2], int(sys.argv[3])
    if sys.argv[1] == "server":
        asyncio.run(serve(host, port))
    else:
        asyncio.run(ping(host, port, int(sys.argv[4]) if len(sys.argv) > 4 else 1000))


if __name__ == "__main__":
    main()
