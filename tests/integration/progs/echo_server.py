"""Echo server: echoes every byte back until the client shuts down its write side, then
closes. Exits normally after `--connections` connections have been served, and reports
{"connections", "echoed"} as one JSON line.

--impl asyncio  asyncio streams on the default event loop (epoll)
--impl poll     a nonblocking loop on selectors.PollSelector
--impl select   a nonblocking loop on selectors.SelectSelector
"""

import asyncio
import selectors

from common import LOOPBACK, MiB, SELECTORS, argument_parser, listen, report

READ_SIZE = 64 * 1024
MAX_PENDING = MiB  # stop reading a connection while this much echo is waiting to be written


class Totals:
    def __init__(self):
        self.connections = 0
        self.echoed = 0


async def serve_asyncio(port, connections, totals):
    all_done = asyncio.Event()

    async def handle(reader, writer):
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()
            totals.echoed += len(data)
        writer.close()
        await writer.wait_closed()
        totals.connections += 1
        if totals.connections == connections:
            all_done.set()

    server = await asyncio.start_server(handle, LOOPBACK, port)
    async with server:
        await all_done.wait()


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.pending = bytearray()
        self.eof = False

    def interest(self):
        events = 0
        if not self.eof and len(self.pending) < MAX_PENDING:
            events |= selectors.EVENT_READ
        if self.pending:
            events |= selectors.EVENT_WRITE
        return events

    def on_ready(self, mask, totals):
        if mask & selectors.EVENT_READ:
            try:
                data = self.sock.recv(READ_SIZE)
            except BlockingIOError:
                data = None
            if data == b"":
                self.eof = True
            elif data:
                self.pending += data
        if mask & selectors.EVENT_WRITE and self.pending:
            try:
                sent = self.sock.send(self.pending)
            except BlockingIOError:
                sent = 0
            del self.pending[:sent]
            totals.echoed += sent


def serve_selector(port, connections, selector, totals):
    listener = listen(port)
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ)
    while totals.connections < connections:
        for key, mask in selector.select():
            if key.fileobj is listener:
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ, Conn(sock))
                continue
            conn = key.data
            conn.on_ready(mask, totals)
            if events := conn.interest():
                selector.modify(conn.sock, events, conn)
            else:  # EOF seen and everything echoed
                selector.unregister(conn.sock)
                conn.sock.close()
                totals.connections += 1
    selector.close()
    listener.close()


def main():
    parser = argument_parser(__doc__, impl=True)
    parser.add_argument("--connections", type=int, required=True)
    args = parser.parse_args()

    totals = Totals()
    if args.impl == "asyncio":
        asyncio.run(serve_asyncio(args.port, args.connections, totals))
    else:
        serve_selector(args.port, args.connections, SELECTORS[args.impl](), totals)
    report(connections=totals.connections, echoed=totals.echoed)


if __name__ == "__main__":
    main()
