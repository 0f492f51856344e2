/* Every environment variable libc10d reads, declared in this one list and
 * parsed in env.c. README.md's environment table must name each of them
 * (test_env checks it). To add one: a line here, a row in the README. */
#ifndef C10D_ENGINE_ENV_H
#define C10D_ENGINE_ENV_H

#include <stdint.h>

/* X(id, name, fallback names ("A, B": A first) or NULL, default text, description) */
#define C10D_ENV_VARS(X)                                                                           \
    X(LOG_LEVEL, "C10D_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL", "WARN",                                  \
      "log threshold: TRACE, DEBUG, INFO, WARN, ERROR, OFF (torch's INFO/WARNING/ERROR/FATAL "     \
      "and 0-3 accepted for the fallback)")                                                        \
    X(ENGINE_BATCH, "C10D_ENGINE_BATCH", NULL, "64",                                               \
      "most posted tasks the loop thread runs per wake-up before it polls sockets and timers "     \
      "again")                                                                                     \
    X(WAIT_SPIN_US, "C10D_WAIT_SPIN_US", NULL, "0",                                                \
      "c10d_work_wait watches its work (yielding the CPU) this long before it sleeps on a futex "  \
      "(0: it sleeps at once)")                                                                    \
    X(BLOCKING_WAIT, "C10D_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT", "0",                        \
      "1: a c10d_work_wait that times out fails the work (and so its group), as torch's blocking " \
      "wait; 0: the wait returns C10D_ETIMEDOUT and the work goes on")                             \
    X(LOOP_SPIN_US, "C10D_LOOP_SPIN_US", NULL, "100",                                              \
      "the loop thread polls without sleeping this long after its last activity (0: it sleeps "    \
      "in epoll at once)")                                                                         \
    X(BACKEND_CLOSE_MS, "C10D_BACKEND_CLOSE_MS", NULL, "10000",                                    \
      "how long ending a group (destroy, abort, a failure) waits for each backend's abort and "    \
      "destroy, which may block in a driver, before it goes on without them")                      \
    X(DEBUG, "C10D_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "OFF",                                       \
      "OFF, INFO or DETAIL: DETAIL checks before each collective, through the store, that every "  \
      "rank calls it with the same op, dtype, count, reduce op and root")                          \
    X(DIST_INIT_BARRIER, "C10D_DIST_INIT_BARRIER", "TORCH_DIST_INIT_BARRIER", "0",                 \
      "1: c10d_pg_init and c10d_pg_new_group end with a store barrier of the whole world (off, "   \
      "as "                                                                                        \
      "in torch: it costs every rank a round trip to one store at scale)")                         \
    X(TCP_LAZY_INIT, "C10D_TCP_LAZY_INIT", NULL, "auto",                                           \
      "tcp backend: 1 connects to a peer on first use (one address read at creation, one per "     \
      "peer used) instead of the full mesh at group creation (every rank reads every address); "   \
      "auto: 1 for groups of more than 1024 ranks")                                                \
    X(SOCKET_IFNAME, "C10D_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "",                               \
      "tcp backend: network interface whose address the rank listens on and publishes; a comma "   \
      "list (eth0,eth1) makes one set of connections per interface, the same number on every "     \
      "rank (default: the local address of its connection to the store, if not loopback; if "      \
      "the store was reached over loopback through a name that resolves to loopback here only, "   \
      "the default route's source address; else the hostname's address, then loopback)")           \
    X(TCP_EAGER_MAX, "C10D_TCP_EAGER_MAX", NULL, "65536",                                          \
      "tcp backend: collective messages up to this many bytes are sent without waiting for the "   \
      "receiver's clear-to-send")                                                                  \
    X(TCP_RD_MAX, "C10D_TCP_RD_MAX", NULL, "32768",                                                \
      "tcp backend: all_reduce uses recursive doubling up to this many bytes")                     \
    X(TCP_RING_MIN, "C10D_TCP_RING_MIN", NULL, "1048576",                                          \
      "tcp backend: all_reduce uses the pipelined ring from this many bytes (halving-doubling "    \
      "in between)")                                                                               \
    X(TCP_SEGMENT, "C10D_TCP_SEGMENT", NULL, "524288",                                             \
      "tcp backend: segment size in bytes of the pipelined ring")                                  \
    X(SHM, "C10D_SHM", NULL, "1",                                                                  \
      "tcp backend: 1 runs the collectives "                                                       \
      "through shared memory in a group whose ranks all share this host (same boot, user, pid "    \
      "and network namespace, host name); 0 on any rank: tcp only")                                \
    X(P2P_IN_PLACE, "C10D_P2P_IN_PLACE", NULL, "1",                                                \
      "tcp backend: 1 lets a rank copy a large P2P message straight from the memory of a "         \
      "sender on this host (process_vm_readv, one copy); 0: through the socket, and this rank's "  \
      "16-64 KiB messages to such ranks go eagerly instead of with an offer")                      \
    X(SHM_LANE, "C10D_SHM_LANE", NULL, "1",                                                        \
      "shared-memory path: 1 lets the thread that waits on a small collective run it itself "      \
      "(the caller's lane); 0: the loop runs every op")                                            \
    X(SHM_LANE_SPIN_US, "C10D_SHM_LANE_SPIN_US", NULL, "1000",                                     \
      "shared-memory path: how long a waiting thread runs its op in the caller's lane before it "  \
      "hands the op to the loop and sleeps")                                                       \
    X(SHM_CROWDED_SPIN_US, "C10D_SHM_CROWDED_SPIN_US", NULL, "2000",                               \
      "shared-memory path, where a host's ranks outnumber its CPUs: the loop keeps polling "       \
      "(yielding the CPU) this long after a collective's last step, instead of "                   \
      "C10D_LOOP_SPIN_US, so that the op's next step and the next op find it awake (0: "           \
      "C10D_LOOP_SPIN_US)")                                                                        \
    X(SHM_P2P, "C10D_SHM_P2P", NULL, "1",                                                          \
      "shared-memory path: 1 sends this rank's P2P frames to ranks of its segment through a "      \
      "ring in the segment; 0: through the socket")                                                \
    X(SHM_IN_PLACE, "C10D_SHM_IN_PLACE", NULL, "1",                                                \
      "shared-memory path: 1 lets a large broadcast, all_gather or all_to_all read each peer's "   \
      "buffer straight from its memory (process_vm_readv, one copy); 0 on any rank: through "      \
      "the slots (two copies)")                                                                    \
    X(SHM_SLOT_BYTES, "C10D_SHM_SLOT_BYTES", NULL, "262144",                                       \
      "shared-memory path: bytes of each of a rank's two slots in the segment (an op "             \
      "runs in chunks of this size; rank 0's value counts)")                                       \
    X(TCP_CUDA_STAGING_MAX, "C10D_TCP_CUDA_STAGING_MAX", NULL, "268435456",                        \
      "tcp backend, CUDA buffers: pinned host staging memory a group keeps for reuse between "     \
      "ops (bytes; beyond it, blocks are freed after their op)")                                   \
    X(TCP_CUDA_SEGMENT, "C10D_TCP_CUDA_SEGMENT", NULL, "4194304",                                  \
      "tcp backend, CUDA buffers: all_reduce, broadcast and reduce larger than this are staged "   \
      "in segments of about this many bytes, one segment's copies overlapping another's "          \
      "transfer (0: whole)")                                                                       \
    X(TCP_SOCKET_BUFFER, "C10D_TCP_SOCKET_BUFFER", NULL, "4194304",                                \
      "tcp backend: SO_SNDBUF/SO_RCVBUF requested for peer connections (0: the OS default)")       \
    X(MASTER_ADDR, "MASTER_ADDR", NULL, "",                                                        \
      "env:// rendezvous: host of the store (rank 0's address)")                                   \
    X(MASTER_PORT, "MASTER_PORT", NULL, "", "env:// rendezvous: port of the store")                \
    X(RANK, "RANK", NULL, "", "env:// rendezvous: this process's rank")                            \
    X(WORLD_SIZE, "WORLD_SIZE", NULL, "", "env:// rendezvous: number of processes")                \
    X(USE_AGENT_STORE, "TORCHELASTIC_USE_AGENT_STORE", NULL, "",                                   \
      "True: torchrun's agent hosts the store, so rank 0 connects as a client instead of "         \
      "hosting one")                                                                               \
    X(TORCHELASTIC_RESTART_COUNT, "TORCHELASTIC_RESTART_COUNT", NULL, "0",                         \
      "rendezvous on an agent or external store: the attempt whose key namespace is used "         \
      "(set by torchrun on each restart)")                                                         \
    X(LOCAL_RANK, "LOCAL_RANK", NULL, "", "env:// rendezvous: this process's rank on its node")    \
    X(LOCAL_WORLD_SIZE, "LOCAL_WORLD_SIZE", NULL, "",                                              \
      "env:// rendezvous: number of processes on this node")                                       \
    X(TORCHELASTIC_RUN_ID, "TORCHELASTIC_RUN_ID", NULL, "",                                        \
      "env:// rendezvous: set by torchrun and c10drun; names the launcher in messages")            \
    X(PET_NNODES, "PET_NNODES", NULL, "",                                                          \
      "env:// rendezvous: set by Kubeflow's PyTorchJob (one process per pod, local rank 0)")       \
    X(PET_NODE_RANK, "PET_NODE_RANK", NULL, "",                                                    \
      "env:// rendezvous: Kubeflow PyTorchJob's pod index")                                        \
    X(PET_NPROC_PER_NODE, "PET_NPROC_PER_NODE", NULL, "",                                          \
      "env:// rendezvous: Kubeflow PyTorchJob's processes per pod (more than 1 needs a "           \
      "launcher in the pod)")                                                                      \
    X(OMPI_RANK, "OMPI_COMM_WORLD_RANK", NULL, "",                                                 \
      "env:// rendezvous: rank under Open MPI's mpirun")                                           \
    X(OMPI_SIZE, "OMPI_COMM_WORLD_SIZE", NULL, "",                                                 \
      "env:// rendezvous: size under Open MPI's mpirun")                                           \
    X(OMPI_LOCAL_RANK, "OMPI_COMM_WORLD_LOCAL_RANK", NULL, "",                                     \
      "env:// rendezvous: local rank under Open MPI's mpirun")                                     \
    X(OMPI_LOCAL_SIZE, "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, "",                                     \
      "env:// rendezvous: local size under Open MPI's mpirun")                                     \
    X(PMI_RANK, "PMI_RANK", NULL, "", "env:// rendezvous: rank under MPICH/Hydra (PMI)")           \
    X(PMI_SIZE, "PMI_SIZE", NULL, "", "env:// rendezvous: size under MPICH/Hydra (PMI)")           \
    X(MPI_LOCALRANKID, "MPI_LOCALRANKID", NULL, "",                                                \
      "env:// rendezvous: local rank under MPICH/Hydra")                                           \
    X(MPI_LOCALNRANKS, "MPI_LOCALNRANKS", NULL, "",                                                \
      "env:// rendezvous: local size under MPICH/Hydra")                                           \
    X(SLURM_PROCID, "SLURM_PROCID", NULL, "", "env:// rendezvous: rank of an srun task")           \
    X(SLURM_NTASKS, "SLURM_NTASKS", NULL, "", "env:// rendezvous: tasks of the srun step")         \
    X(SLURM_LOCALID, "SLURM_LOCALID", NULL, "", "env:// rendezvous: task's rank on its node")      \
    X(SLURM_NODEID, "SLURM_NODEID", NULL, "",                                                      \
      "env:// rendezvous: the node's index in the step (with SLURM_STEP_TASKS_PER_NODE)")          \
    X(SLURM_STEP_TASKS_PER_NODE, "SLURM_STEP_TASKS_PER_NODE", NULL, "",                            \
      "env:// rendezvous: tasks per node of the step (\"2(x3),1\"): the local size")               \
    X(SLURM_NTASKS_PER_NODE, "SLURM_NTASKS_PER_NODE", NULL, "",                                    \
      "env:// rendezvous: local size when SLURM_STEP_TASKS_PER_NODE is not set")                   \
    X(SLURM_STEP_NODELIST, "SLURM_STEP_NODELIST", NULL, "",                                        \
      "env:// rendezvous: the step's nodes; the first hosts the store when MASTER_ADDR is unset")  \
    X(SLURM_JOB_ID, "SLURM_JOB_ID", NULL, "",                                                      \
      "env:// rendezvous: with SLURM_STEP_ID, the store's port when MASTER_PORT is unset")         \
    X(SLURM_STEP_ID, "SLURM_STEP_ID", NULL, "",                                                    \
      "env:// rendezvous: required under Slurm: unset means a batch script or salloc shell, not "  \
      "srun")                                                                                      \
    X(PMIX_NAMESPACE, "PMIX_NAMESPACE", NULL, "",                                                  \
      "env:// rendezvous: set by a PMIx server (mpirun): rank 0's address is exchanged through "   \
      "PMIx when MASTER_ADDR is unset")                                                            \
    X(PMIX_RANK, "PMIX_RANK", NULL, "",                                                            \
      "env:// rendezvous: with PMIX_NAMESPACE, a PMIx server to ask; must equal the rank")         \
    X(PMIX_LIBRARY, "C10D_PMIX_LIBRARY", NULL, "",                                                 \
      "the PMIx client library to load at run time (default: libpmix.so.2, then libpmix.so)")      \
    X(STORE_BIND, "C10D_STORE_BIND", NULL, "",                                                     \
      "address rank 0's embedded store listens on, * for every address (default: the address "     \
      "MASTER_ADDR resolves to; every address when MASTER_ADDR is a name that resolves to "        \
      "loopback here only, does not resolve yet, or is not an address of this host)")              \
    X(STORE_LINGER_MS, "C10D_STORE_LINGER_MS", NULL, "5000",                                       \
      "how long c10d_shutdown on the rank hosting the store keeps serving ranks still connected "  \
      "to it (a rank reading a peer's address lazily needs it); 0 stops it at once")               \
    X(STORE_TOKEN, "C10D_STORE_TOKEN", NULL, "",                                                   \
      "shared secret of the job: store clients present it before any command and every "           \
      "data-port hello carries it; servers refuse connections without it")                         \
    X(STORE_TOKEN_FILE, "C10D_STORE_TOKEN_FILE", NULL, "",                                         \
      "file holding the shared secret (first line), used when C10D_STORE_TOKEN is unset")          \
    X(CUDART_LIBRARY, "C10D_CUDART_LIBRARY", NULL, "",                                             \
      "the CUDA runtime library to load (default: libcudart.so.13, .12, then libcudart.so)")       \
    X(NCCL_LIBRARY, "C10D_NCCL_LIBRARY", NULL, "",                                                 \
      "the NCCL library to load (default: libnccl.so.2, then libnccl.so)")                         \
    X(NCCL_NONBLOCKING, "C10D_NCCL_NONBLOCKING", "TORCH_NCCL_USE_COMM_NONBLOCKING", "0",           \
      "nccl backend: 1 makes communicators nonblocking (every NCCL call bounded, but NCCL "        \
      "starts a thread per op); c10d_nccl_opts.nonblocking sets it per group")                     \
    X(NCCL_RANKS_PER_ROOT, "C10D_NCCL_RANKS_PER_ROOT", "TORCH_NCCL_RANKS_PER_ROOT", "128",         \
      "nccl backend: a communicator of more ranks than this initialises through several "          \
      "bootstrap roots (ncclCommInitRankScalable), one per this many ranks")                       \
    X(NCCL_NAN_CHECK, "C10D_NCCL_NAN_CHECK", "TORCH_NCCL_NAN_CHECK", "0",                          \
      "nccl backend: 1 checks every floating-point input for NaN on the GPU before the op; a "     \
      "NaN fails the op and the group (the process is not killed)")                                \
    X(NCCL_ENABLE_TIMING, "C10D_NCCL_ENABLE_TIMING", "TORCH_NCCL_ENABLE_TIMING", "0",              \
      "nccl backend: 1 makes the ops' start and end events timing events, so a completed op's "    \
      "device time is known (c10d_work_duration_ms)")                                              \
    X(NCCL_PEER_CHECK_MS, "C10D_NCCL_PEER_CHECK_MS", NULL, "1000",                                 \
      "nccl backend: while ops are in flight, how often a rank looks in the store for another "    \
      "rank's failure of the group (0: never; each rank then fails by its own timeout)")           \
    X(TRACE_BUFFER_SIZE, "C10D_TRACE_BUFFER_SIZE",                                                 \
      "TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",                                \
      "flight recorder: how many of the last ops (every group, every backend) the process "        \
      "keeps for its dump (0: off)")                                                               \
    X(TRACE_FILE_PREFIX, "C10D_TRACE_FILE_PREFIX",                                                 \
      "TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "",                              \
      "flight recorder: dumps are written to <prefix><rank>.json; unset: no file is written "      \
      "unless a call names one (the ring stays in memory: c10d_flight_recorder_dump_json)")        \
    X(TRACE_DUMP_ON_FAILURE, "C10D_TRACE_DUMP_ON_FAILURE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "1",      \
      "flight recorder: dump when an op times out or fails, and ask every rank to dump too "       \
      "(through the default group's store)")                                                       \
    X(TRACE_SIGNAL_CHECK_MS, "C10D_TRACE_SIGNAL_CHECK_MS", "TORCH_NCCL_COORD_CHECK_MILSEC",        \
      "1000",                                                                                      \
      "flight recorder: how often a rank looks in the default group's store for another rank's "   \
      "request to dump (0: never)")

enum c10d__env_id {
#define C10D_ENV_ENUM(id, name, fallback, def, doc) C10D_ENV_##id,
    C10D_ENV_VARS(C10D_ENV_ENUM)
#undef C10D_ENV_ENUM
        C10D_ENV_COUNT
};

struct c10d__env_var {
    const char *name;
    const char *fallback;
    const char *default_text;
    const char *doc;
};

/* The declaration table, for tools and tests. */
const struct c10d__env_var *c10d__env_table(void);

/* The variable's text: its own value, else its fallback's, else the default.
 * Read once per process (after the first call, changes to the environment
 * are not seen until c10d__env_reload()). */
const char *c10d__env_str(enum c10d__env_id id);
/* As an integer; a malformed value logs a warning and yields the default. */
int64_t c10d__env_int(enum c10d__env_id id);
/* 1/0 for 1/0, true/false, yes/no, on/off (any case). */
int c10d__env_bool(enum c10d__env_id id);
/* Re-reads the environment (tests, and after the user changed it on purpose). */
void c10d__env_reload(void);
/* Registers the environment's fork handlers (once). Its lock is taken under
 * other modules' (the engine's, the flight recorder's): each calls this
 * before registering its own, so that at a fork this one is taken last. */
void c10d__env_init(void);
/* Changes with every (re)load: a value parsed once may be kept while it is
 * the same, without the table's lock (hot paths). */
unsigned c10d__env_generation(void);

#endif
