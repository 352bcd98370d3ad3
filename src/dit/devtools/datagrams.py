"""Numbered UDP datagrams through a shaped link: the two child scripts that count, per destination, which
of them arrived (the link emulator's loss and correlated loss, measured on the wire by
``benchmarks/bench_link_emulation.py`` and ``tests/integration/test_link_emulator_loss.py``).

Run as ``python -c SCRIPT``: the receiver (``ADDRESS ...``) binds every address, prints ``ready``, and once
its stdin closes waits 0.5 s for what the emulator still holds, then prints ``{address: [seq, ...]}``; the
sender (``COUNT GAP_S ADDRESS ...``) sends 0 .. COUNT-1 to every address in turn, one round per GAP_S.
"""

from __future__ import annotations

_RECEIVER = """
import json, select, socket, sys, time
socks = {}
for address in sys.argv[1:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 23)
    s.bind((address, PORT)); s.setblocking(False); socks[s] = address
got = {a: [] for a in sys.argv[1:]}
print("ready", flush=True)
def drain():
    for s in socks:
        while True:
            try: got[socks[s]].append(int(s.recv(64)))
            except BlockingIOError: break
while True:
    ready = select.select([*socks, sys.stdin], [], [], 0.5)[0]
    drain()
    if sys.stdin in ready and not sys.stdin.readline():
        break  # the sender finished
time.sleep(0.5)  # what the emulator still holds
drain()
print(json.dumps(got))
"""

_SENDER = """
import socket, sys, time
count, gap = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = time.monotonic()
for i in range(count):
    for address in sys.argv[3:]:
        s.sendto(str(i).encode(), (address, PORT))
    wait = start + (i + 1) * gap - time.monotonic()
    if wait > 0: time.sleep(wait)
"""


def receiver_script(port: int) -> str:
    return _RECEIVER.replace("PORT", str(int(port)))


def sender_script(port: int) -> str:
    return _SENDER.replace("PORT", str(int(port)))
