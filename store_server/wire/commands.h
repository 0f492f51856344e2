/* The store's commands, one row each: everything the codec, the server, the
 * client stores and the public request need to know about a command that is
 * not how it runs. Adding a command is a row here plus its case in the
 * executors (store_server/server/session.c, store_server/client/
 * store_local.c) and, for a client op, the public request's table
 * (store_server/client/store_request.c). docs/store.md, "Adding a command".
 *
 * Columns:
 *   name      the enum's suffix (C10D_STORE_<name>) and the name messages use
 *   current   wire byte in the current dialect (PyTorch 2.5 .. 2.11), -1: none
 *   legacy    wire byte in the legacy dialect (PyTorch 1.13), -1: none
 *   u32       a u32 follows the command byte (VALIDATE's magic, PING's nonce)
 *   counted   a u64 count of items follows, then the items
 *   per_item  strings per counted item
 *   nstr      strings when not counted
 *   i64       a trailing i64 (ADD's delta, BARRIER's world size)
 *   values    bit i set: string i (of an item) is a value, else a key
 *   reply     what the server answers (enum c10d__wire_reply_shape's suffix)
 *   ro        1: leaves the table as it was (no generation bump, caches stay)
 *   waits     the key args the client waits for before the command runs
 *             (0: none, 1: every key, 2: every key when the op blocks)
 *
 * STATS and AUTH are ours, not PyTorch's, on bytes far above PyTorch's codes
 * so that no PyTorch release can mean something else by them (PyTorch's
 * servers close the connection on them). STATS: c10d-store answers with its
 * stats as a JSON string. AUTH (docs/security.md): `S token`, answered with
 * one byte, OK or REFUSED (then the server closes).
 */
#ifndef C10D_STORE_SERVER_WIRE_COMMANDS_H
#define C10D_STORE_SERVER_WIRE_COMMANDS_H

/* clang-format off */
/*   name         current legacy u32 counted per_item nstr i64 values reply  ro waits */
#define C10D__STORE_COMMANDS(X)                                                 \
    X(VALIDATE,       0,   -1,   1,  0,      0,       0,   0,  0,     NONE,  1, 0) \
    X(PING,          13,   -1,   1,  0,      0,       0,   0,  0,     U32,   1, 0) \
    X(SET,            1,    0,   0,  0,      0,       2,   0,  2,     NONE,  0, 0) \
    X(COMPARE_SET,    2,    1,   0,  0,      0,       3,   0,  6,     STR,   0, 0) \
    X(GET,            3,    2,   0,  0,      0,       1,   0,  0,     STR,   1, 1) \
    X(ADD,            4,    3,   0,  0,      0,       1,   1,  0,     I64,   0, 0) \
    X(CHECK,          5,    4,   0,  1,      1,       0,   0,  0,     U8,    1, 0) \
    X(WAIT,           6,    5,   0,  1,      1,       0,   0,  0,     U8,    1, 1) \
    X(GETNUMKEYS,     7,    6,   0,  0,      0,       0,   0,  0,     I64,   1, 0) \
    X(DELETE_KEY,     8,    8,   0,  0,      0,       1,   0,  0,     I64,   0, 0) \
    X(APPEND,         9,   -1,   0,  0,      0,       2,   0,  2,     NONE,  0, 0) \
    X(MULTI_GET,     10,   -1,   0,  1,      1,       0,   0,  0,     NSTR,  1, 1) \
    X(MULTI_SET,     11,   -1,   0,  1,      2,       0,   0,  2,     NONE,  0, 0) \
    X(CANCEL_WAIT,   12,   -1,   0,  0,      0,       0,   0,  0,     U8,    1, 0) \
    X(QUEUE_PUSH,    14,   -1,   0,  0,      0,       2,   0,  2,     NONE,  0, 0) \
    X(QUEUE_POP,     15,   -1,   0,  0,      0,       1,   0,  0,     QPOP,  0, 2) \
    X(QUEUE_LEN,     16,   -1,   0,  0,      0,       1,   0,  0,     I64,   1, 0) \
    X(LIST_KEYS,     17,   -1,   0,  0,      0,       0,   0,  0,     LIST,  1, 0) \
    X(BARRIER,       18,   -1,   0,  0,      0,       1,   1,  0,     U8,    0, 0) \
    X(WATCH_KEY,     -1,    7,   0,  0,      0,       1,   0,  0,     U8,    0, 0) \
    X(STATS,       0x40,   -1,   0,  0,      0,       0,   0,  0,     STR,   1, 0) \
    X(AUTH,        0x41,   -1,   0,  0,      0,       1,   0,  0,     U8,    1, 0)
/* clang-format on */

#endif
