#!/usr/bin/env python3
"""A counting SMTP sink for scripts/cluster.sh's relay host.

Usage: relay_sink.py LISTEN_ADDR PORT LOG_FILE [DELAY_MS]

Accepts every message, answers its DATA after DELAY_MS (default 0: a
relay that takes its time keeps a campaign going long enough for a fault
to land in its middle) and, once its DATA is complete and answered 250,
appends each of its recipients to LOG_FILE, one line each (flushed per
message). A recipient on two lines was mailed twice: scripts/partition.sh
counts duplicates from this file, at the relay, as tests/chaos.rs does with
its scripted peer. No PIPELINING is offered, so the client waits for each
reply. Standard library only (asyncio).
"""

import asyncio
import sys


async def session(reader, writer, log, delay):
    rcpts = []

    async def reply(line):
        writer.write((line + "\r\n").encode())
        await writer.drain()

    await reply("220 relay-sink ESMTP")
    try:
        while True:
            raw = await reader.readline()
            if not raw:
                return
            verb = raw.decode("latin-1").strip()
            upper = verb.upper()
            if upper.startswith("EHLO"):
                await reply("250-relay-sink\r\n250 8BITMIME")
            elif upper.startswith("HELO"):
                await reply("250 relay-sink")
            elif upper.startswith("MAIL"):
                rcpts = []
                await reply("250 2.1.0 ok")
            elif upper.startswith("RCPT"):
                addr = verb.split(":", 1)[1].strip().split()[0].strip("<>")
                rcpts.append(addr)
                await reply("250 2.1.5 ok")
            elif upper == "DATA":
                await reply("354 go ahead")
                while True:
                    line = await reader.readline()
                    if not line or line in (b".\r\n", b".\n"):
                        break
                if not line:
                    return
                if delay:
                    await asyncio.sleep(delay)
                await reply("250 2.0.0 queued")
                log.write("".join(r + "\n" for r in rcpts))
                log.flush()
                rcpts = []
            elif upper == "RSET":
                rcpts = []
                await reply("250 ok")
            elif upper == "NOOP":
                await reply("250 ok")
            elif upper == "QUIT":
                await reply("221 bye")
                return
            else:
                await reply("502 5.5.2 not implemented")
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def main():
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: relay_sink.py LISTEN_ADDR PORT LOG_FILE [DELAY_MS]")
    addr, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    delay = int(sys.argv[4]) / 1000 if len(sys.argv) == 5 else 0
    log = open(path, "a", encoding="utf-8")
    server = await asyncio.start_server(
        lambda r, w: session(r, w, log, delay), addr, port, backlog=1024
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
