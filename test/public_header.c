/* The public header as users compile it: test_public_header builds this file
 * as C99 with -pedantic and as C++17 with -Wextra, warnings as errors, using
 * every options initializer (a repeated typedef is an error in C99; a partial
 * designated initializer a warning in C++). */
#include <c10d.h>

int main(void)
{
    c10d_nccl_opts nccl = C10D_NCCL_OPTS_INIT;
    c10d_pg_opts pg = C10D_PG_OPTS_INIT;
    c10d_op_opts op = C10D_OP_OPTS_INIT;
    c10d_store_tcp_opts tcp = C10D_STORE_TCP_OPTS_INIT;
    c10d_store_request req = C10D_STORE_REQUEST_INIT;
    c10d_rendezvous_opts rdzv = C10D_RENDEZVOUS_OPTS_INIT;
    c10d_launch_info launch = C10D_LAUNCH_INFO_INIT;
    return (nccl.struct_size == sizeof nccl && pg.struct_size == sizeof pg &&
            op.struct_size == sizeof op && tcp.struct_size == sizeof tcp &&
            req.struct_size == sizeof req && rdzv.struct_size == sizeof rdzv &&
            launch.struct_size == sizeof launch)
               ? 0
               : 1;
}
