"""Echo client: `--connections` concurrent connections, each sending `--messages` messages of
random size (1 B .. 256 KiB, seeded) and checking that every byte comes back, in order.
Writing runs ahead of reading (messages are pipelined). After the last message a connection
shuts down its write side and expects EOF with nothing more. Exits 1 on any mismatch;
reports {"connections", "messages", "bytes"} as one JSON line.

--impl asyncio  asyncio streams (default event loop, epoll); each message checked whole
--impl poll     nonblocking sockets on selectors.PollSelector; the stream checked per read
--impl select   the same on selectors.SelectSelector
"""

import asyncio
import random
import selectors
import socket

from common import LOOPBACK, SELECTORS, argument_parser, connect, fail, random_size, report

MAX_MESSAGE = 256 * 1024
READ_SIZE = 64 * 1024


def messages_for(seed, index, count):
    rng = random.Random(seed * 1000 + index)
    return [rng.randbytes(random_size(rng, MAX_MESSAGE)) for _ in range(count)]


async def run_asyncio_connection(port, messages, index):
    reader, writer = await asyncio.open_connection(LOOPBACK, port)

    async def write_all():
        for message in messages:
            writer.write(message)
            await writer.drain()
        writer.write_eof()

    async def check_all():
        for n, message in enumerate(messages):
            echo = await reader.readexactly(len(message))
            if echo != message:
                fail(f"connection {index}: message {n} ({len(message)} B) came back different")
        if extra := await reader.read():
            fail(f"connection {index}: {len(extra)} unexpected bytes after the last echo")

    await asyncio.gather(write_all(), check_all())
    writer.close()
    await writer.wait_closed()


async def run_asyncio(port, all_messages):
    await asyncio.gather(*(run_asyncio_connection(port, messages, index)
                           for index, messages in enumerate(all_messages)))


class Stream:
    """One nonblocking connection: writes its messages, checks the echo byte by byte."""

    def __init__(self, port, messages, index):
        self.index = index
        self.sizes = [len(m) for m in messages]  # one send per message
        self.out = memoryview(b"".join(messages))
        self.expected = self.out
        self.sock = connect(port)
        self.sock.setblocking(False)
        self.sent = 0
        self.received = 0
        self.eof = False

    def interest(self):
        return selectors.EVENT_READ | (selectors.EVENT_WRITE if self.sizes else 0)

    def on_ready(self, mask):
        if mask & selectors.EVENT_WRITE and self.sizes:
            self.write()
        if mask & selectors.EVENT_READ:
            self.read()

    def write(self):
        try:
            n = self.sock.send(self.out[self.sent:self.sent + self.sizes[0]])
        except BlockingIOError:
            return
        self.sent += n
        self.sizes[0] -= n
        if self.sizes[0] == 0:
            self.sizes.pop(0)
        if not self.sizes:
            self.sock.shutdown(socket.SHUT_WR)

    def read(self):
        try:
            data = self.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            if self.received != len(self.expected):
                fail(f"connection {self.index}: EOF after {self.received} of "
                     f"{len(self.expected)} bytes")
            self.eof = True
            return
        end = self.received + len(data)
        if end > len(self.expected) or data != self.expected[self.received:end]:
            fail(f"connection {self.index}: echo differs within bytes {self.received}..{end}")
        self.received = end


def run_selector(port, all_messages, selector):
    streams = [Stream(port, messages, index) for index, messages in enumerate(all_messages)]
    for stream in streams:
        selector.register(stream.sock, stream.interest(), stream)
    live = len(streams)
    while live:
        events = selector.select(timeout=30)
        if not events:
            fail("no readiness for 30 s")
        for key, mask in events:
            stream = key.data
            stream.on_ready(mask)
            if stream.eof:
                selector.unregister(stream.sock)
                stream.sock.close()
                live -= 1
            else:
                selector.modify(stream.sock, stream.interest(), stream)
    selector.close()


def main():
    parser = argument_parser(__doc__, impl=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()

    all_messages = [messages_for(args.seed, i, args.messages) for i in range(args.connections)]
    if args.impl == "asyncio":
        asyncio.run(run_asyncio(args.port, all_messages))
    else:
        run_selector(args.port, all_messages, SELECTORS[args.impl]())
    report(connections=args.connections, messages=args.connections * args.messages,
           bytes=sum(len(m) for messages in all_messages for m in messages))


if __name__ == "__main__":
    main()
