/* The part of the CUDA runtime's and NCCL's C interface that libc10d uses,
 * declared by libc10d itself.
 *
 * libc10d loads libcudart and libnccl at run time (gpu_api.h), so it needs
 * no CUDA file to link; this header makes it need none to compile either:
 * every build has the nccl backend, on any machine, with or without a CUDA
 * toolkit. Names, values and layouts are CUDA 13.0's and NCCL 2.28.9's, so
 * the code reads as if it included <cuda_runtime_api.h> and <nccl.h>, and
 * the CPU simulation of both (test/gpusim/) is built from the same text.
 *
 * Declarations we write could drift from the real ones, so each kind is an
 * X-macro list: the same list makes the declaration and, with
 * C10D__GPU_DECLS_CHECK defined after the real headers were included, a
 * check of it. In check mode a prototype or typedef is declared again (a
 * conflicting redeclaration is an error in C11), an enumerator or constant
 * becomes a _Static_assert of its value, and a struct becomes a mirror whose
 * size and every field's offset and type must match the real one.
 * test_gpu_decls compiles that check wherever the real headers are found.
 *
 * Only what the library, its tests and the simulation use is here; a new
 * CUDA or NCCL name goes into its list, and the check covers it at once. */
#ifndef C10D_GPU_GPU_DECLS_H
#define C10D_GPU_GPU_DECLS_H

#include <limits.h>
#include <stddef.h>

/* ------------------------------------------------------------ the lists */

/* Integer constants CUDA and NCCL define as macros; ours are enumerators,
 * so that one list both defines and checks them. */
#define C10D__GPU_INT_CONSTANTS(X)                                                                 \
    X(cudaStreamNonBlocking, 0x01)                                                                 \
    X(cudaEventDisableTiming, 0x02)                                                                \
    X(cudaEventInterprocess, 0x04)                                                                 \
    X(cudaEventWaitExternal, 0x01)                                                                 \
    X(cudaHostAllocPortable, 0x01)                                                                 \
    X(cudaHostAllocMapped, 0x02)                                                                   \
    X(NCCL_UNIQUE_ID_BYTES, 128)                                                                   \
    X(NCCL_CONFIG_UNDEF_INT, INT_MIN)                                                              \
    X(NCCL_SPLIT_NOCOLOR, -1)                                                                      \
    X(NCCL_SHRINK_DEFAULT, 0x00)                                                                   \
    X(NCCL_SHRINK_ABORT, 0x01)

/* The special stream handles: cudaStream_t values, not objects. */
#define C10D__GPU_STREAM_HANDLES(X)                                                                \
    X(cudaStreamLegacy, 0x1)                                                                       \
    X(cudaStreamPerThread, 0x2)

/* enum cudaError: the codes libc10d or the simulation name (CUDA has ~140;
 * any other code still passes through a cudaError_t). */
#define C10D__CUDA_ERRORS(X)                                                                       \
    X(cudaSuccess, 0)                                                                              \
    X(cudaErrorInvalidValue, 1)                                                                    \
    X(cudaErrorMemoryAllocation, 2)                                                                \
    X(cudaErrorInvalidDevicePointer, 17)                                                           \
    X(cudaErrorInsufficientDriver, 35)                                                             \
    X(cudaErrorInvalidMemcpyDirection, 21)                                                         \
    X(cudaErrorInvalidDeviceFunction, 98)                                                          \
    X(cudaErrorNoDevice, 100)                                                                      \
    X(cudaErrorInvalidDevice, 101)                                                                 \
    X(cudaErrorInvalidResourceHandle, 400)                                                         \
    X(cudaErrorSymbolNotFound, 500)                                                                \
    X(cudaErrorNotReady, 600)                                                                      \
    X(cudaErrorIllegalAddress, 700)                                                                \
    X(cudaErrorNotSupported, 801)

#define C10D__CUDA_MEMCPY_KINDS(X)                                                                 \
    X(cudaMemcpyHostToHost, 0)                                                                     \
    X(cudaMemcpyHostToDevice, 1)                                                                   \
    X(cudaMemcpyDeviceToHost, 2)                                                                   \
    X(cudaMemcpyDeviceToDevice, 3)                                                                 \
    X(cudaMemcpyDefault, 4)

#define C10D__CUDA_CAPTURE_STATUSES(X)                                                             \
    X(cudaStreamCaptureStatusNone, 0)                                                              \
    X(cudaStreamCaptureStatusActive, 1)                                                            \
    X(cudaStreamCaptureStatusInvalidated, 2)

#define C10D__CUDA_CAPTURE_MODES(X)                                                                \
    X(cudaStreamCaptureModeGlobal, 0)                                                              \
    X(cudaStreamCaptureModeThreadLocal, 1)                                                         \
    X(cudaStreamCaptureModeRelaxed, 2)

/* Only ever passed as NULL arrays (cudaLibraryLoadData): one enumerator
 * each, so that the types are complete. */
#define C10D__CUDA_JIT_OPTIONS(X)     X(cudaJitMaxRegisters, 0)
#define C10D__CUDA_LIBRARY_OPTIONS(X) X(cudaLibraryHostUniversalFunctionAndDataTable, 0)

#define C10D__NCCL_RESULTS(X)                                                                      \
    X(ncclSuccess, 0)                                                                              \
    X(ncclUnhandledCudaError, 1)                                                                   \
    X(ncclSystemError, 2)                                                                          \
    X(ncclInternalError, 3)                                                                        \
    X(ncclInvalidArgument, 4)                                                                      \
    X(ncclInvalidUsage, 5)                                                                         \
    X(ncclRemoteError, 6)                                                                          \
    X(ncclInProgress, 7)                                                                           \
    X(ncclNumResults, 8)

/* ncclMaxRedOp fixes the enum's range (and so its size): PreMulSum ops are
 * values past ncclNumOps. */
#define C10D__NCCL_RED_OPS(X)                                                                      \
    X(ncclSum, 0)                                                                                  \
    X(ncclProd, 1)                                                                                 \
    X(ncclMax, 2)                                                                                  \
    X(ncclMin, 3)                                                                                  \
    X(ncclAvg, 4)                                                                                  \
    X(ncclNumOps, 5)                                                                               \
    X(ncclMaxRedOp, 0x7fffffff)

#define C10D__NCCL_DATA_TYPES(X)                                                                   \
    X(ncclInt8, 0)                                                                                 \
    X(ncclUint8, 1)                                                                                \
    X(ncclInt32, 2)                                                                                \
    X(ncclUint32, 3)                                                                               \
    X(ncclInt64, 4)                                                                                \
    X(ncclUint64, 5)                                                                               \
    X(ncclFloat16, 6)                                                                              \
    X(ncclFloat32, 7)                                                                              \
    X(ncclFloat64, 8)                                                                              \
    X(ncclBfloat16, 9)                                                                             \
    X(ncclFloat8e4m3, 10)                                                                          \
    X(ncclFloat8e5m2, 11)                                                                          \
    X(ncclNumTypes, 12)

#define C10D__NCCL_SCALAR_RESIDENCES(X)                                                            \
    X(ncclScalarDevice, 0)                                                                         \
    X(ncclScalarHostImmediate, 1)

/* Struct fields, in order: X(type, name, array bounds or nothing). */
#define C10D__DIM3_FIELDS(X)                                                                       \
    X(unsigned int, x, )                                                                           \
    X(unsigned int, y, )                                                                           \
    X(unsigned int, z, )

#define C10D__NCCL_UNIQUE_ID_FIELDS(X) X(char, internal, [NCCL_UNIQUE_ID_BYTES])

/* ncclConfig_t's fields with NCCL_CONFIG_INITIALIZER's value of each:
 * X(type, name, initial value). NCCL reads size and version to know which
 * fields a caller's struct has. */
#define C10D__NCCL_CONFIG_FIELDS(X)                                                                \
    X(size_t, size, sizeof(ncclConfig_t))                                                          \
    X(unsigned int, magic, 0xcafebeef)                                                             \
    X(unsigned int, version, NCCL_VERSION_CODE)                                                    \
    X(int, blocking, NCCL_CONFIG_UNDEF_INT)                                                        \
    X(int, cgaClusterSize, NCCL_CONFIG_UNDEF_INT)                                                  \
    X(int, minCTAs, NCCL_CONFIG_UNDEF_INT)                                                         \
    X(int, maxCTAs, NCCL_CONFIG_UNDEF_INT)                                                         \
    X(const char *, netName, NCCL_CONFIG_UNDEF_PTR)                                                \
    X(int, splitShare, NCCL_CONFIG_UNDEF_INT)                                                      \
    X(int, trafficClass, NCCL_CONFIG_UNDEF_INT)                                                    \
    X(const char *, commName, NCCL_CONFIG_UNDEF_PTR)                                               \
    X(int, collnetEnable, NCCL_CONFIG_UNDEF_INT)                                                   \
    X(int, CTAPolicy, NCCL_CONFIG_UNDEF_INT)                                                       \
    X(int, shrinkShare, NCCL_CONFIG_UNDEF_INT)                                                     \
    X(int, nvlsCTAs, NCCL_CONFIG_UNDEF_INT)                                                        \
    X(int, nChannelsPerNetPeer, NCCL_CONFIG_UNDEF_INT)                                             \
    X(int, nvlinkCentricSched, NCCL_CONFIG_UNDEF_INT)

/* The CUDA runtime's functions libc10d loads (gpu_api.h makes its table
 * from this list, the simulation defines each): X(return type, name,
 * parameters). */
#define C10D__CUDART_FUNCTIONS(X)                                                                  \
    X(cudaError_t, cudaGetDeviceCount, (int *count))                                               \
    X(cudaError_t, cudaSetDevice, (int device))                                                    \
    X(cudaError_t, cudaGetDevice, (int *device))                                                   \
    X(cudaError_t, cudaRuntimeGetVersion, (int *runtimeVersion))                                   \
    X(cudaError_t, cudaDriverGetVersion, (int *driverVersion))                                     \
    X(const char *, cudaGetErrorString, (cudaError_t error))                                       \
    X(cudaError_t, cudaGetLastError, (void))                                                       \
    X(cudaError_t, cudaDeviceGetStreamPriorityRange, (int *leastPriority, int *greatestPriority))  \
    X(cudaError_t, cudaStreamCreateWithPriority,                                                   \
      (cudaStream_t * pStream, unsigned int flags, int priority))                                  \
    X(cudaError_t, cudaStreamDestroy, (cudaStream_t stream))                                       \
    X(cudaError_t, cudaStreamSynchronize, (cudaStream_t stream))                                   \
    X(cudaError_t, cudaStreamWaitEvent,                                                            \
      (cudaStream_t stream, cudaEvent_t event, unsigned int flags))                                \
    X(cudaError_t, cudaStreamIsCapturing,                                                          \
      (cudaStream_t stream, enum cudaStreamCaptureStatus * pCaptureStatus))                        \
    X(cudaError_t, cudaThreadExchangeStreamCaptureMode, (enum cudaStreamCaptureMode * mode))       \
    X(cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t * event, unsigned int flags))            \
    X(cudaError_t, cudaEventDestroy, (cudaEvent_t event))                                          \
    X(cudaError_t, cudaEventRecord, (cudaEvent_t event, cudaStream_t stream))                      \
    X(cudaError_t, cudaEventQuery, (cudaEvent_t event))                                            \
    X(cudaError_t, cudaEventSynchronize, (cudaEvent_t event))                                      \
    X(cudaError_t, cudaEventElapsedTime, (float *ms, cudaEvent_t start, cudaEvent_t end))          \
    X(cudaError_t, cudaLaunchHostFunc, (cudaStream_t stream, cudaHostFn_t fn, void *userData))     \
    X(cudaError_t, cudaMalloc, (void **devPtr, size_t size))                                       \
    X(cudaError_t, cudaFree, (void *devPtr))                                                       \
    X(cudaError_t, cudaHostAlloc, (void **pHost, size_t size, unsigned int flags))                 \
    X(cudaError_t, cudaFreeHost, (void *ptr))                                                      \
    X(cudaError_t, cudaMemcpy,                                                                     \
      (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind))                        \
    X(cudaError_t, cudaMemcpyAsync,                                                                \
      (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream))   \
    X(cudaError_t, cudaMemsetAsync, (void *devPtr, int value, size_t count, cudaStream_t stream))  \
    X(cudaError_t, cudaDeviceSynchronize, (void))                                                  \
    /* the NaN check kernel (nan_check.h) */                                                       \
    X(cudaError_t, cudaLibraryLoadData,                                                            \
      (cudaLibrary_t * library, const void *code, enum cudaJitOption *jitOptions,                  \
       void **jitOptionsValues, unsigned int numJitOptions,                                        \
       enum cudaLibraryOption *libraryOptions, void **libraryOptionValues,                         \
       unsigned int numLibraryOptions))                                                            \
    X(cudaError_t, cudaLibraryGetKernel,                                                           \
      (cudaKernel_t * pKernel, cudaLibrary_t library, const char *name))                           \
    X(cudaError_t, cudaLaunchKernel,                                                               \
      (const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,               \
       cudaStream_t stream))

/* NCCL's functions libc10d loads, likewise. */
#define C10D__NCCL_FUNCTIONS(X)                                                                    \
    X(ncclResult_t, ncclGetVersion, (int *version))                                                \
    X(const char *, ncclGetErrorString, (ncclResult_t result))                                     \
    X(const char *, ncclGetLastError, (ncclComm_t comm))                                           \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))                                    \
    X(ncclResult_t, ncclCommInitRankConfig,                                                        \
      (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config))        \
    X(ncclResult_t, ncclCommInitRankScalable,                                                      \
      (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,               \
       ncclConfig_t *config))                                                                      \
    X(ncclResult_t, ncclCommSplit,                                                                 \
      (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config))            \
    X(ncclResult_t, ncclCommShrink,                                                                \
      (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,         \
       ncclConfig_t *config, int shrinkFlags))                                                     \
    X(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))                                           \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))                                            \
    X(ncclResult_t, ncclCommAbort, (ncclComm_t comm))                                              \
    X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError))           \
    X(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count))                            \
    X(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank))                          \
    X(ncclResult_t, ncclRedOpCreatePreMulSum,                                                      \
      (ncclRedOp_t * op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,   \
       ncclComm_t comm))                                                                           \
    X(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))                           \
    X(ncclResult_t, ncclAllReduce,                                                                 \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,                \
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))                                      \
    X(ncclResult_t, ncclBroadcast,                                                                 \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,      \
       ncclComm_t comm, cudaStream_t stream))                                                      \
    X(ncclResult_t, ncclReduce,                                                                    \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,                \
       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))                            \
    X(ncclResult_t, ncclAllGather,                                                                 \
      (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,            \
       ncclComm_t comm, cudaStream_t stream))                                                      \
    X(ncclResult_t, ncclReduceScatter,                                                             \
      (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,            \
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))                                      \
    X(ncclResult_t, ncclSend,                                                                      \
      (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,     \
       cudaStream_t stream))                                                                       \
    X(ncclResult_t, ncclRecv,                                                                      \
      (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,           \
       cudaStream_t stream))                                                                       \
    X(ncclResult_t, ncclGroupStart, (void))                                                        \
    X(ncclResult_t, ncclGroupEnd, (void))

/* ------------------------------------------- what the lists expand to */

#define C10D__GPU_ENUMERATOR(name, value)         name = (value),
#define C10D__GPU_HANDLE_VALUE(name, value)       C10D__##name = (value),
#define C10D__GPU_MEMBER(type, name, bounds)      type name bounds;
#define C10D__GPU_CONFIG_MEMBER(type, name, init) type name;
#define C10D__GPU_CONFIG_VALUE(type, name, init)  init,
#define C10D__GPU_PROTOTYPE(ret, name, params)    ret name params;
/* Our NCCL_CONFIG_INITIALIZER, by that name in both modes. */
#define C10D__NCCL_CONFIG_INITIALIZER                                                              \
    {                                                                                              \
        C10D__NCCL_CONFIG_FIELDS(C10D__GPU_CONFIG_VALUE)                                           \
    }

#ifndef C10D__GPU_DECLS_CHECK

/* The versions these declarations follow (c10d_build_info shows them).
 * The check does not compare them with the real headers' versions: other
 * versions pass as long as everything we use is unchanged. */
#define CUDART_VERSION    13000
#define NCCL_VERSION_CODE 22809
#define CUDART_CB
#define NCCL_CONFIG_UNDEF_PTR   NULL
#define NCCL_CONFIG_INITIALIZER C10D__NCCL_CONFIG_INITIALIZER

enum { C10D__GPU_INT_CONSTANTS(C10D__GPU_ENUMERATOR) };
enum { C10D__GPU_STREAM_HANDLES(C10D__GPU_HANDLE_VALUE) };
#define cudaStreamLegacy    ((cudaStream_t)C10D__cudaStreamLegacy)
#define cudaStreamPerThread ((cudaStream_t)C10D__cudaStreamPerThread)

enum cudaError { C10D__CUDA_ERRORS(C10D__GPU_ENUMERATOR) };
enum cudaMemcpyKind { C10D__CUDA_MEMCPY_KINDS(C10D__GPU_ENUMERATOR) };
enum cudaStreamCaptureStatus { C10D__CUDA_CAPTURE_STATUSES(C10D__GPU_ENUMERATOR) };
enum cudaStreamCaptureMode { C10D__CUDA_CAPTURE_MODES(C10D__GPU_ENUMERATOR) };
enum cudaJitOption { C10D__CUDA_JIT_OPTIONS(C10D__GPU_ENUMERATOR) };
enum cudaLibraryOption { C10D__CUDA_LIBRARY_OPTIONS(C10D__GPU_ENUMERATOR) };
struct dim3 {
    C10D__DIM3_FIELDS(C10D__GPU_MEMBER)
};

typedef enum { C10D__NCCL_RESULTS(C10D__GPU_ENUMERATOR) } ncclResult_t;
typedef enum { C10D__NCCL_RED_OPS(C10D__GPU_ENUMERATOR) } ncclRedOp_t;
typedef enum { C10D__NCCL_DATA_TYPES(C10D__GPU_ENUMERATOR) } ncclDataType_t;
typedef enum { C10D__NCCL_SCALAR_RESIDENCES(C10D__GPU_ENUMERATOR) } ncclScalarResidence_t;
typedef struct {
    C10D__NCCL_UNIQUE_ID_FIELDS(C10D__GPU_MEMBER)
} ncclUniqueId;
typedef struct ncclConfig_v22800 {
    C10D__NCCL_CONFIG_FIELDS(C10D__GPU_CONFIG_MEMBER)
} ncclConfig_t;

#else /* C10D__GPU_DECLS_CHECK: the real headers were included before us */

/* A value must be the real one; a type's mirror (our declaration under
 * another name) must have the real type's size and signedness, or its
 * layout, field by field. */
#define C10D__GPU_CHECK_VALUE(name, value)                                                         \
    _Static_assert((name) == (value), #name " is not " #value " in the real headers");
#define C10D__GPU_MIRROR_ENUMERATOR(name, value) c10d__check_##name = (value),
#define C10D__GPU_CHECK_ENUM(real, mirror)                                                         \
    _Static_assert(sizeof(real) == sizeof(mirror) && (long long)(real)-1 == (long long)(mirror)-1, \
                   #real ": size or signedness differs from the real one");
#define C10D__GPU_CHECK_FIELD(real, mirror, name)                                                  \
    _Static_assert(offsetof(real, name) == offsetof(mirror, name) &&                               \
                       __builtin_types_compatible_p(__typeof__(((real *)0)->name),                 \
                                                    __typeof__(((mirror *)0)->name)),              \
                   #real "." #name ": offset or type differs from the real one");
#define C10D__GPU_CHECK_STRUCT(real, mirror)                                                       \
    _Static_assert(sizeof(real) == sizeof(mirror) && _Alignof(real) == _Alignof(mirror),           \
                   #real ": size or alignment differs from the real one");
/* A function must be declared by the real headers before it is declared
 * again: naming it here fails if it is not. */
#define C10D__GPU_CHECK_PROTOTYPE(ret, name, params)                                               \
    _Static_assert(sizeof(&name) != 0, #name);                                                     \
    ret name params;

/* Stream handles and NCCL_CONFIG_INITIALIZER are not integer constant
 * expressions: test_gpu_decls compares them when it runs. */
C10D__GPU_INT_CONSTANTS(C10D__GPU_CHECK_VALUE)

#define C10D__GPU_CHECK_TAGGED_ENUM(tag, list)                                                     \
    list(C10D__GPU_CHECK_VALUE) enum c10d__check_##tag{list(C10D__GPU_MIRROR_ENUMERATOR)};         \
    C10D__GPU_CHECK_ENUM(enum tag, enum c10d__check_##tag)
C10D__GPU_CHECK_TAGGED_ENUM(cudaError, C10D__CUDA_ERRORS)
C10D__GPU_CHECK_TAGGED_ENUM(cudaMemcpyKind, C10D__CUDA_MEMCPY_KINDS)
C10D__GPU_CHECK_TAGGED_ENUM(cudaStreamCaptureStatus, C10D__CUDA_CAPTURE_STATUSES)
C10D__GPU_CHECK_TAGGED_ENUM(cudaStreamCaptureMode, C10D__CUDA_CAPTURE_MODES)
C10D__GPU_CHECK_TAGGED_ENUM(cudaJitOption, C10D__CUDA_JIT_OPTIONS)
C10D__GPU_CHECK_TAGGED_ENUM(cudaLibraryOption, C10D__CUDA_LIBRARY_OPTIONS)
#define C10D__GPU_CHECK_TYPEDEF_ENUM(name, list)                                                   \
    list(C10D__GPU_CHECK_VALUE) typedef enum {                                                     \
        list(C10D__GPU_MIRROR_ENUMERATOR)                                                          \
    } c10d__check_##name;                                                                          \
    C10D__GPU_CHECK_ENUM(name, c10d__check_##name)
C10D__GPU_CHECK_TYPEDEF_ENUM(ncclResult_t, C10D__NCCL_RESULTS)
C10D__GPU_CHECK_TYPEDEF_ENUM(ncclRedOp_t, C10D__NCCL_RED_OPS)
C10D__GPU_CHECK_TYPEDEF_ENUM(ncclDataType_t, C10D__NCCL_DATA_TYPES)
C10D__GPU_CHECK_TYPEDEF_ENUM(ncclScalarResidence_t, C10D__NCCL_SCALAR_RESIDENCES)

struct c10d__check_dim3 {
    C10D__DIM3_FIELDS(C10D__GPU_MEMBER)
};
#define C10D__GPU_CHECK_DIM3_FIELD(type, name, bounds)                                             \
    C10D__GPU_CHECK_FIELD(struct dim3, struct c10d__check_dim3, name)
C10D__DIM3_FIELDS(C10D__GPU_CHECK_DIM3_FIELD)
C10D__GPU_CHECK_STRUCT(struct dim3, struct c10d__check_dim3)

struct c10d__check_ncclUniqueId {
    C10D__NCCL_UNIQUE_ID_FIELDS(C10D__GPU_MEMBER)
};
#define C10D__GPU_CHECK_UNIQUE_ID_FIELD(type, name, bounds)                                        \
    C10D__GPU_CHECK_FIELD(ncclUniqueId, struct c10d__check_ncclUniqueId, name)
C10D__NCCL_UNIQUE_ID_FIELDS(C10D__GPU_CHECK_UNIQUE_ID_FIELD)
C10D__GPU_CHECK_STRUCT(ncclUniqueId, struct c10d__check_ncclUniqueId)

struct c10d__check_ncclConfig {
    C10D__NCCL_CONFIG_FIELDS(C10D__GPU_CONFIG_MEMBER)
};
#define C10D__GPU_CHECK_CONFIG_FIELD(type, name, init)                                             \
    C10D__GPU_CHECK_FIELD(ncclConfig_t, struct c10d__check_ncclConfig, name)
C10D__NCCL_CONFIG_FIELDS(C10D__GPU_CHECK_CONFIG_FIELD)
C10D__GPU_CHECK_STRUCT(ncclConfig_t, struct c10d__check_ncclConfig)

#endif /* C10D__GPU_DECLS_CHECK */

/* The same in both modes: in check mode each typedef and prototype is a
 * redeclaration, which C11 accepts only when it names the same type. */
typedef enum cudaError cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUlib_st *cudaLibrary_t;
typedef struct CUkern_st *cudaKernel_t;
typedef void(CUDART_CB *cudaHostFn_t)(void *userData);
typedef struct dim3 dim3;
typedef struct ncclComm *ncclComm_t;

#ifndef C10D__GPU_DECLS_CHECK
C10D__CUDART_FUNCTIONS(C10D__GPU_PROTOTYPE)
C10D__NCCL_FUNCTIONS(C10D__GPU_PROTOTYPE)
#else
C10D__CUDART_FUNCTIONS(C10D__GPU_CHECK_PROTOTYPE)
C10D__NCCL_FUNCTIONS(C10D__GPU_CHECK_PROTOTYPE)
#endif

#endif
