#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus (test/fuzz/seeds/): chunk format
[u8 connection][u8 length][bytes], see fuzz_store_server.c."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CUR = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7,
           DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13,
           QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16, LIST_KEYS=17, BARRIER=18)
LEG = dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, WATCH_KEY=7,
           DELETE_KEY=8)


def S(b):
    return struct.pack('<Q', len(b)) + b


def keys(*ks):
    return struct.pack('<Q', len(ks)) + b''.join(S(k) for k in ks)


def chunks(conn, data, size=255):
    out = b''
    for i in range(0, len(data), size):
        part = data[i:i + size]
        out += bytes([conn, len(part)]) + part
    return out


validate = bytes([0]) + struct.pack('<I', 0x3C85F7CE)


def current(split):
    c = CUR
    s0 = [validate, bytes([c['PING']]) + struct.pack('<I', 7),
          bytes([c['SET']]) + S(b'/a') + S(b'1'),
          bytes([c['GET']]) + S(b'/a'),
          bytes([c['ADD']]) + S(b'init/') + struct.pack('<q', 1),
          bytes([c['CHECK']]) + keys(b'/a', b'/b'),
          bytes([c['COMPARE_SET']]) + S(b'/a') + S(b'1') + S(b'2'),
          bytes([c['APPEND']]) + S(b'/a') + S(b'xyz'),
          bytes([c['MULTI_SET']]) + keys(b'/m1', b'v1', b'/m2', b'v2'),
          bytes([c['MULTI_GET']]) + keys(b'/m1', b'/m2', b'/none'),
          bytes([c['QUEUE_PUSH']]) + S(b'/q') + S(b'item'),
          bytes([c['QUEUE_LEN']]) + S(b'/q'),
          bytes([c['QUEUE_POP']]) + S(b'/q'),
          bytes([c['LIST_KEYS']]), bytes([c['GETNUMKEYS']]),
          bytes([c['DELETE_KEY']]) + S(b'/a')]
    s1 = [validate, bytes([c['WAIT']]) + keys(b'/late', b'/q2')]
    s2 = [validate, bytes([c['BARRIER']]) + S(b'/bar') + struct.pack('<q', 2)]
    out = b''
    for conn, reqs in ((1, s1), (2, s2), (0, s0)):
        for r in reqs:
            out += chunks(conn, r, 1 if split else 255)
    out += chunks(0, bytes([c['SET']]) + S(b'/late') + S(b'x'))
    out += chunks(0, bytes([c['QUEUE_PUSH']]) + S(b'/q2') + S(b'y'))
    out += chunks(1, bytes([c['BARRIER']]) + S(b'/bar') + struct.pack('<q', 2))
    out += chunks(1, bytes([c['WAIT']]) + keys(b'/never'))
    out += chunks(1, bytes([c['CANCEL_WAIT']]))
    out += chunks(3, validate)  # reconnect
    return out


def legacy():
    c = LEG
    out = chunks(1, bytes([c['WATCH_KEY']]) + S(b'/w'))
    for r in [bytes([c['SET']]) + S(b'/w') + S(b'1'),
              bytes([c['ADD']]) + S(b'/w') + struct.pack('<q', 5),
              bytes([c['COMPARE_SET']]) + S(b'/w') + S(b'6') + S(b'7'),
              bytes([c['GET']]) + S(b'/w'), bytes([c['GETNUMKEYS']]),
              bytes([c['CHECK']]) + keys(b'/w'),
              bytes([c['DELETE_KEY']]) + S(b'/w')]:
        out += chunks(0, r)
    out += chunks(2, bytes([c['WAIT']]) + keys(b'/z'))
    out += chunks(0, bytes([c['SET']]) + S(b'/z') + S(b''))
    out += chunks(0, bytes([c['ADD']]) + S(b'/z') + struct.pack('<q', 1))  # not a number
    return out


def main():
    d = os.path.join(HERE, 'seeds')
    os.makedirs(d, exist_ok=True)
    seeds = {'current': current(False), 'current_split': current(True), 'legacy': legacy(),
             'garbage': bytes([0, 9]) + b'\x03' + b'\xff' * 8}
    for name, data in seeds.items():
        with open(os.path.join(d, name), 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main()
